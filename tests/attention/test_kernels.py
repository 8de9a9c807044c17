"""ParallelConfig validation, the kernel registry and the kernels' (out, lse) and block backward."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import dit_sp
from dit_sp.attention import KERNELS, get_kernel
from dit_sp.parallel import ParallelConfig


@pytest.mark.parametrize("bad", [{"ring": 0}, {"ulysses": -2}, {"dp": 1.5}, {"ring": True}, {"ulysses": "2"}])
def test_config_rejects_non_positive_integers(bad):
    with pytest.raises(ValueError, match="must be a positive integer"):
        ParallelConfig(**bad)


def test_config_cfg_is_one_or_two():
    with pytest.raises(ValueError, match="cfg must be 1 or 2"):
        ParallelConfig(cfg=3)
    assert ParallelConfig(cfg=2, ulysses=2).world_size == 4


def test_config_world_size_mismatch_names_the_numbers():
    with pytest.raises(
        ValueError, match=r"dp=2, ring=2, ulysses=2, cfg=1\) needs dp\*cfg\*ring\*ulysses = 8 .* world size is 4"
    ):
        ParallelConfig(dp=2, ring=2, ulysses=2).check_world_size(4)
    assert ParallelConfig.for_world(8, ring=2, ulysses=2) == ParallelConfig(dp=2, ring=2, ulysses=2)
    with pytest.raises(ValueError, match="does not divide the world size 6"):
        ParallelConfig.for_world(6, ring=2, ulysses=2)


def test_auto_kernel_on_cpu():
    assert get_kernel(None, torch.device("cpu"), torch.float32, 64).name == "cpu_flash"
    assert get_kernel(None, torch.device("cpu"), torch.bfloat16, 64).name == "cpu_flash"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_flash_matches_math_and_block_backward_sums(dtype):
    """(out, lse) agree; the backward of key blocks with the *global* out/lse sums to the full one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 13, 3, 8, dtype=dtype) for _ in range(3))
    dout = torch.randn_like(q)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}
    results = {}
    for name in ("cpu_flash", "math"):
        kernel = KERNELS[name]
        out, lse = kernel.forward(q, k, v, 0.3)
        assert out.shape == q.shape and lse.shape == (2, 3, 13) and lse.dtype in (torch.float32, torch.float64)
        full = kernel.backward(dout, q, k, v, out, lse, 0.3)
        first = kernel.backward(dout, q, k[:, :6], v[:, :6], out, lse, 0.3)
        second = kernel.backward(dout, q, k[:, 6:], v[:, 6:], out, lse, 0.3)
        torch.testing.assert_close(first[0] + second[0], full[0], **tol)
        torch.testing.assert_close(torch.cat([first[1], second[1]], 1), full[1], **tol)
        torch.testing.assert_close(torch.cat([first[2], second[2]], 1), full[2], **tol)
        results[name] = (out, lse, *full)
    for a, b in zip(results["cpu_flash"], results["math"]):
        torch.testing.assert_close(a, b.to(a.dtype), **tol)
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), scale=0.3)
    torch.testing.assert_close(results["math"][0], ref.transpose(1, 2), **tol)


def _autograd_functions(module) -> set[str]:
    found = set()
    for name in dir(module):
        obj = getattr(module, name)
        if inspect.isclass(obj) and issubclass(obj, torch.autograd.Function) and obj.__module__.startswith("dit_sp"):
            found.add(obj.__qualname__)
    return found


def test_every_autograd_function_has_a_backward_test():
    """Each Function's backward runs in a test (the wrong-gradient-count crash cannot come back):
    AllToAll, AllGather, ScatterHeads and GatherHeads in test_comm (Ulysses' pair also in test_usp_parity),
    RingAttention in test_usp_parity and gradcheck here, AllReduce and Halo (Sana-Video's token sums and frame
    halos) in tests/families/test_sana_video.py against one process, AverageGradient (Kandinsky 5's text gradient) in
    tests/families/test_kandinsky5_nabla.py against one process.
    A new Function must be added to this list together with its backward test."""
    found = set()
    for info in pkgutil.walk_packages(dit_sp.__path__, prefix="dit_sp."):
        found |= _autograd_functions(importlib.import_module(info.name))
    assert found == {
        "AllToAll",
        "AllGather",
        "ScatterHeads",
        "GatherHeads",
        "RingAttention",
        "AllReduce",
        "Halo",
        "AverageGradient",
    }
