"""The parallel VAE: decode and encode split over 2 and 4 processes equal one process, for every family's VAE,
untiled and tiled, on odd latent heights and widths and several frame counts."""

from __future__ import annotations

import pytest
import torch
from vae_checks import CASES, VAES, check_vaes

from dit_sp import parallelize_vae, spawn
from dit_sp.parallel.rows import RowSplit


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n} processes")
def results(request):
    return request.param, spawn(check_vaes, request.param, args=(list(VAES),), timeout=600)


@pytest.mark.parametrize("family", list(VAES))
def test_split_vae_equals_one_process(results, family):
    ranks, per_rank = results
    for rank, result in enumerate(r[family] for r in per_rank):
        assert all(result["shapes"].values()), f"rank {rank}: shapes differ {result['shapes']}"
        worst = max(result["errors"], key=result["errors"].get)
        assert result["errors"][worst] <= 1e-4, f"rank {rank}: {worst} differs by {result['errors'][worst]:.2e}"
        # each rank ran its own rows (plus at most a halo of a few), not the whole frame
        frames, height, width = CASES[0]
        own = RowSplit.even(height, ranks).sizes[rank]
        assert own <= result["rows"]["decoder"][0] <= own + 2 < height + 2, result["rows"]["decoder"][:3]
        assert result["undone"] == 0.0


def test_unsupported_vae_is_a_clear_error():
    from diffusers import AutoencoderKL

    with pytest.raises(TypeError, match="no parallel VAE plan; supported VAEs: AutoencoderKLWan"):
        parallelize_vae(AutoencoderKL(), None)


def test_split_vae_is_inference_only():
    errors = spawn(_decode_with_grad, 2, timeout=120)
    assert all("inference-only" in e for e in errors), errors


def _decode_with_grad() -> str:
    import os

    from dit_sp import ParallelConfig, init_parallel

    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    from vae_checks import build

    vae = build("wan2.1")
    parallelize_vae(vae, parallel)
    try:
        vae.decode(torch.randn(1, 4, 1, 4, 4, requires_grad=True))
    except RuntimeError as e:
        return str(e)
    return "no error"
