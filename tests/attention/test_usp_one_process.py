"""usp_attention in one process (no torch.distributed): exact SDPA, gradcheck, clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dit_sp import usp_attention
from dit_sp.parallel import ParallelConfig, init_parallel, single_process_state


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


@pytest.fixture
def parallel():
    return single_process_state(torch.device("cpu"))


def test_init_parallel_without_launcher_is_single_process():
    state = init_parallel(ParallelConfig())
    assert state.sp == 1 and state.sp_group is None and state.rank == 0


def test_init_parallel_without_launcher_needs_one_process():
    with pytest.raises(RuntimeError, match="needs 4 processes.*torchrun --nproc-per-node 4"):
        init_parallel(ParallelConfig(ring=2, ulysses=2))


@pytest.mark.parametrize("kernel", [None, "cpu_flash", "math"])
@pytest.mark.parametrize("joint", [0, 5])
def test_equals_sdpa(parallel, kernel, joint):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 37, 3, 8, requires_grad=True) for _ in range(3))
    out = usp_attention(q, k, v, parallel, joint_len=joint, kernel=kernel)
    ref_inputs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    ref = _sdpa(*ref_inputs)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for x, r in zip((q, k, v), ref_inputs):
        torch.testing.assert_close(x.grad, r.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kernel", [None, "cpu_flash"])
@pytest.mark.parametrize("joint_valid", [(4, 4), (4, 1), (0, 2), (0, 0)])
def test_joint_padding_is_masked(parallel, kernel, joint_valid):
    """Per-sample padded joint tokens (a padded prompt) are not attended; outputs and grads match SDPA."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 11, 2, 8, requires_grad=True) for _ in range(3))
    out = usp_attention(q, k, v, parallel, joint_len=4, joint_position="rear", joint_valid=joint_valid, kernel=kernel)
    grad = torch.randn_like(out)
    out.backward(grad)
    for b, n in enumerate(joint_valid):
        ref_in = [x[b : b + 1].detach().clone().requires_grad_() for x in (q, k, v)]
        keys = [x[:, : 7 + n] for x in ref_in[1:]]
        ref = _sdpa(ref_in[0], *keys)
        torch.testing.assert_close(out[b : b + 1], ref, atol=1e-6, rtol=1e-5)
        ref.backward(grad[b : b + 1])
        for x, r in zip((q, k, v), ref_in):
            torch.testing.assert_close(x.grad[b : b + 1], r.grad, atol=1e-6, rtol=1e-5)


def test_padded_keys_are_masked(parallel):
    """seq_len < local length: the tail is padding and must not be attended."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 10, 2, 8) for _ in range(3))
    out = usp_attention(q, k, v, parallel, seq_len=7, kernel="cpu_flash")
    torch.testing.assert_close(out[:, :7], _sdpa(q[:, :7], k[:, :7], v[:, :7]), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["cpu_flash", "math"])
def test_gradcheck_ring_function(parallel, kernel):
    """The RingAttention Function (one rank) with joint tokens and padding passes gradcheck in fp64."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 9, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return usp_attention(q, k, v, parallel, seq_len=5, joint_len=3, joint_position="rear", kernel=kernel)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize(
    ("shapes", "kwargs", "match"),
    [
        (((2, 8, 16),) * 3, {}, r"layout \(B, S_local, H, D\)"),
        (((2, 8, 2, 4), (2, 6, 2, 4), (2, 6, 2, 4)), {}, "self-attention"),
        (((2, 8, 2, 4),) * 3, {"joint_len": 9}, "joint_len=9"),
        (((2, 8, 2, 4),) * 3, {"joint_position": "middle"}, "'front' or 'rear'"),
        (((2, 8, 2, 4),) * 3, {"seq_len": 9}, r"seq_len=9 does not fit"),
        (((2, 8, 2, 4),) * 3, {"seq_len": 0}, r"seq_len=0 does not fit"),
        (((2, 8, 2, 4),) * 3, {"kernel": "nope"}, "unknown attention kernel 'nope'"),
        (((2, 8, 2, 4),) * 3, {"joint_len": 2, "joint_valid": (1,)}, "for each of the 2 batch elements"),
        (((2, 8, 2, 4),) * 3, {"joint_len": 2, "joint_valid": (1, 3)}, "between 0 and joint_len=2"),
        (((2, 8, 2, 4),) * 3, {"kernel": "flash_attn2"}, "flash_attn2' cannot be used"),
        (((2, 8, 2, 4),) * 3, {"kernel": "torch_flash"}, "CUDA is not available"),
    ],
)
def test_bad_input_is_a_clear_error(parallel, shapes, kwargs, match):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        usp_attention(q, k, v, parallel, **kwargs)


@pytest.mark.parametrize(
    ("mask", "kwargs", "error", "match"),
    [
        (
            torch.ones(1, 1, 8, 7, dtype=torch.bool),
            {},
            ValueError,
            r"\(B or 1, H or 1, S, S\) = \(2 or 1, 2 or 1, 8, 8\)",
        ),
        (torch.ones(3, 1, 8, 8, dtype=torch.bool), {}, ValueError, r"got \(3, 1, 8, 8\)"),
        (torch.ones(1, 1, 8, 8, dtype=torch.bool), {"joint_len": 2}, NotImplementedError, "not with joint tokens"),
        (torch.ones(1, 1, 8, 8, dtype=torch.bool), {"kernel": "math"}, NotImplementedError, "not with kernel 'math'"),
    ],
)
def test_whole_sequence_mask_misuse_is_a_clear_error(parallel, mask, kwargs, error, match):
    q = torch.randn(2, 8, 2, 4)
    with pytest.raises(error, match=match):
        usp_attention(q, q, q, parallel, mask=mask, **kwargs)


def test_whole_sequence_mask_equals_sdpa(parallel):
    q, k, v = (torch.randn(2, 9, 3, 4) for _ in range(3))
    mask = torch.rand(2, 3, 9, 9) < 0.5
    mask |= torch.eye(9, dtype=torch.bool)
    expected = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask)
    torch.testing.assert_close(usp_attention(q, k, v, parallel, mask=mask), expected.transpose(1, 2))


def test_dtype_mismatch_is_a_clear_error(parallel):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="dtypes differ"):
        usp_attention(q, q, q.bfloat16(), parallel)


def test_parallelize_names_the_frames_on_choices():
    from dit_sp import parallelize
    from dit_sp.zoo import build_tiny

    with pytest.raises(ValueError, match="frames_on='rank0': expected 'every_rank' or 'leader'"):
        parallelize(build_tiny("tiny-wan"), single_process_state(torch.device("cpu")), frames_on="rank0")
