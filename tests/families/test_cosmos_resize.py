"""The Cosmos models' padding-mask resize without torchvision: diffusers 0.42.1's Cosmos ControlNet (and the Cosmos
transformer with ``concat_padding_mask``) call ``transforms.functional.resize(mask, size, InterpolationMode.NEAREST)``,
and where torchvision is missing the Cosmos family gives their modules a torch-only one
(``dit_sp._compat.install_cosmos_resize``): torchvision's tensor NEAREST resize, output pixel ``i`` taken from input
pixel ``floor(i * in / out)`` on each axis."""

from __future__ import annotations

import importlib

import pytest
import torch

from dit_sp._compat import install_cosmos_resize
from dit_sp._compat.diffusers_api import COSMOS_RESIZE_MODULES


def _by_hand(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest resize with integer index arithmetic: output (i, j) is input (floor(i * H / h), floor(j * W / w))."""
    height, width = image.shape[-2:]
    rows = [i * height // size[0] for i in range(size[0])]
    cols = [j * width // size[1] for j in range(size[1])]
    return image[..., rows, :][..., cols]


@pytest.fixture(scope="module")
def transforms():
    """The ``transforms`` the Cosmos ControlNet's module calls (torchvision's own where it imports)."""
    from dit_sp.families import COSMOS

    COSMOS.prepare_pipeline(None)  # what loading or parallelize does for a Cosmos pipeline
    modules = [importlib.import_module(name) for name in COSMOS_RESIZE_MODULES]
    assert all(module.transforms is modules[0].transforms for module in modules)
    return modules[0].transforms


@pytest.mark.parametrize(
    ("shape", "size"),
    [((1, 1, 7, 5), (3, 11)), ((2, 3, 9, 13), (5, 7)), ((1, 1, 5, 3), (15, 7)), ((1, 2, 11, 11), (11, 3))],
    ids=["down-up", "down", "up", "same-and-down"],
)
def test_the_resize_is_a_nearest_resize_on_odd_sizes(transforms, shape, size):
    image = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    out = transforms.functional.resize(image, list(size), interpolation=transforms.InterpolationMode.NEAREST)
    assert out.shape == (*shape[:2], *size) and out.dtype == image.dtype
    assert torch.equal(out, _by_hand(image, size))
    half = image.bfloat16()  # cast to float32 and back, as torchvision does: nearest copies values exactly
    resized = transforms.functional.resize(half, list(size), interpolation=transforms.InterpolationMode.NEAREST)
    assert resized.dtype == torch.bfloat16 and torch.equal(resized, _by_hand(half, size))


def test_installing_is_idempotent_and_keeps_torchvision_where_it_imports(transforms):
    assert install_cosmos_resize() == []  # every module has its transforms: nothing given twice
    if importlib.util.find_spec("torchvision") is None:
        assert transforms.functional.resize.__module__ == "dit_sp._compat.diffusers_api"
    else:  # torchvision's own resize stays
        assert transforms.functional.resize.__module__.startswith("torchvision")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision's own resize is in use")
@pytest.mark.parametrize(
    ("image", "mode", "message"),
    [
        (torch.zeros(1, 1, 4, 4), "bilinear", r"only InterpolationMode\.NEAREST is implemented, not bilinear"),
        (torch.zeros(1, 4, 4), "nearest", r"only a 4-D float tensor \(B, C, H, W\) is implemented, not a 3-D"),
        (torch.zeros(1, 1, 4, 4, dtype=torch.uint8), "nearest", r"not a 4-D torch\.uint8 tensor"),
    ],
    ids=["mode", "3-d", "uint8"],
)
def test_what_it_does_not_implement_is_a_one_line_error(transforms, image, mode, message):
    with pytest.raises(ValueError, match=message) as error:
        transforms.functional.resize(image, [2, 2], interpolation=mode)
    assert "\n" not in str(error.value)
