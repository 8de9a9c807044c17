"""Run other projects' sequence parallelism on CPU/gloo, for side-by-side benchmarks.

Only what is needed to make each run on a CPU is adapted here, and each adaptation says why:

- diffusers (0.42): Ulysses through ``dispatch_attention_fn(..., parallel_config=...)`` with its native
  (SDPA) backend. ``enable_parallelism`` cannot be used on CPU-only torch (it takes the rank modulo the
  accelerator count, which is 0), so the mesh and ``ParallelConfig.setup`` are done by hand, as it would.
  Its ring mode needs an attention op that returns the LSE, and every one it registers is CUDA/NPU-only.
- yunchang (0.6.4): ``LongContextAttention`` with the ``basic_pytorch`` ring. On CPU it needs four
  patches: an LSE-returning forward (its torch flash op has no CPU kernel), a backward (its torch
  backward raises "not implemented"), the missing ``None`` gradient of ``RingAttentionFunc`` (the
  "returned an incorrect number of gradients" crash) and a 1-rank ring that does not send to itself.
  Its ``basic`` ring is not used: its fp32 backward aliases reused buffers and casts dq to bf16.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

METHODS = ["diffusers-ulysses2", "yunchang-ulysses2", "yunchang-ring2"]


def _diffusers_ulysses(degree: int):
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    cp = ContextParallelConfig(ring_degree=1, ulysses_degree=degree)
    config = ParallelConfig(context_parallel_config=cp)
    mesh = init_device_mesh("cpu", mesh_shape=cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)

    def attention(q, k, v):
        return dispatch_attention_fn(q, k, v, backend=AttentionBackendName.NATIVE, parallel_config=config)

    return attention


def _cpu_lse_forward(q, k, v, dropout_p=0.0, is_causal=False, scale=None, **_):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)


def _cpu_backward(dout, q, k, v, out, softmax_lse, *_, softmax_scale=None, causal=False, dropout_p=0.0, **__):
    """(B, S, H, D) tensors and a (B, S, H) lse, as yunchang's basic_pytorch ring passes them."""
    t = lambda x: x.transpose(1, 2)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        t(dout), t(q), t(k), t(v), t(out), t(softmax_lse).contiguous().float(), dropout_p, causal, scale=softmax_scale
    )
    return tuple(t(g) for g in grads)


def _patch_yunchang_for_cpu() -> None:
    import yunchang.kernels.attention as kernels
    import yunchang.ring.ring_pytorch_attn as ring
    from yunchang.ring.utils import RingComm

    kernels._scaled_dot_product_flash_attention = _cpu_lse_forward
    ring.pytorch_attn_backward = _cpu_backward
    backward = ring.RingAttentionFunc.backward
    ring.RingAttentionFunc.backward = staticmethod(lambda ctx, dout, *a: (None, *backward(ctx, dout, *a)))
    send_recv, commit = RingComm.send_recv, RingComm.commit

    def one_rank_send_recv(self, to_send, recv_tensor=None):
        if self.world_size > 1:
            return send_recv(self, to_send, recv_tensor)
        return to_send.clone() if recv_tensor is None else recv_tensor.copy_(to_send)

    def one_rank_commit(self):
        if self.world_size > 1:
            return commit(self)
        self._reqs = []

    RingComm.send_recv, RingComm.commit = one_rank_send_recv, one_rank_commit


def _yunchang(ulysses: int, ring: int):
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    _patch_yunchang_for_cpu()
    set_seq_parallel_pg(ulysses, ring, dist.get_rank(), dist.get_world_size())
    attn = LongContextAttention(ring_impl_type="basic_pytorch", attn_type=AttnType.TORCH_FLASH)
    return lambda q, k, v: attn(q, k, v, causal=False)


def build(method: str):
    """(attention on (B, S_local, H, D) shards, world size, our layout: None)."""
    if method == "diffusers-ulysses2":
        return _diffusers_ulysses(2), 2, None
    if method == "yunchang-ulysses2":
        return _yunchang(2, 1), 2, None
    if method == "yunchang-ring2":
        return _yunchang(1, 2), 2, None
    raise ValueError(f"unknown method {method!r}; known: {METHODS}")
