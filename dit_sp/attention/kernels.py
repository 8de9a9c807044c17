"""Local attention kernels that return ``(out, lse)`` and a backward that accepts any ``(out, lse)``.

Every kernel works in layout ``(B, S, H, D)``: ``q`` is ``(B, Sq, H, D)``, ``k``/``v`` are ``(B, Sk, H, D)``,
``out`` is ``(B, Sq, H, D)`` in the input dtype and ``lse`` (natural-log sum of exp of the scaled scores)
is ``(B, H, Sq)`` in fp32 (fp64 for fp64 input). ``backward`` takes the *global* ``out``/``lse`` of a
query block (as ring attention has after merging) and returns exact ``(dq, dk, dv)`` for the given
key block. Non-causal, no dropout: what DiTs use.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dit_sp._compat import aten_missing, aten_op, custom_op_function

Tensor = torch.Tensor


@dataclass(frozen=True)
class AttentionKernel:
    name: str
    forward: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
    backward: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor, Tensor]]
    supports: Callable[[torch.device, torch.dtype, int], bool]
    missing: Callable[[], str | None] = lambda: None
    """Why the kernel cannot be used in this environment (``None``: it can)."""


def _bhsd(x: Tensor) -> Tensor:
    return x.transpose(1, 2)  # a view; the kernels below accept (B, S, H, D) memory order


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --- torch's CPU flash kernel -------------------------------------------------------------------
def _cpu_forward(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    out, lse = aten_op("_scaled_dot_product_flash_attention_for_cpu")(
        _bhsd(q), _bhsd(k), _bhsd(v), 0.0, False, scale=scale
    )
    return _bhsd(out), lse


def _cpu_backward(dout, q, k, v, out, lse, scale):
    dq, dk, dv = aten_op("_scaled_dot_product_flash_attention_for_cpu_backward")(
        _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse.to(lse_dtype(q.dtype)), 0.0, False, scale=scale
    )
    return _bhsd(dq), _bhsd(dk), _bhsd(dv)


# --- plain torch math: any device, any dtype; the reference the others are checked against -------
def _math_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    ct = lse_dtype(q.dtype)
    return torch.einsum("bqhd,bkhd->bhqk", q.to(ct), k.to(ct)) * scale


def _math_forward(q, k, v, scale):
    s = _math_scores(q, k, scale)
    lse = s.logsumexp(-1)
    p = (s - lse.unsqueeze(-1)).exp()
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.to(p.dtype))
    return out.to(q.dtype), lse


def _math_backward(dout, q, k, v, out, lse, scale):
    ct = lse_dtype(q.dtype)
    p = (_math_scores(q, k, scale) - lse.to(ct).unsqueeze(-1)).exp()
    dout, out = dout.to(ct), out.to(ct)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, v.to(ct))
    delta = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (B, H, Sq, 1)
    ds = p * (dp - delta) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k.to(ct))
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.to(ct))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# --- torch's CUDA kernels -----------------------------------------------------------------------
def _no_cuda(*ops: str) -> Callable[[], str | None]:
    return lambda: "CUDA is not available" if not torch.cuda.is_available() else aten_missing(*ops)


def _empty_i64(x: Tensor) -> Tensor:
    return torch.empty((), dtype=torch.int64, device=x.device)


def _cuda_flash_forward(q, k, v, scale):
    res = aten_op("_scaled_dot_product_flash_attention")(_bhsd(q), _bhsd(k), _bhsd(v), 0.0, False, False, scale=scale)
    return _bhsd(res[0]), res[1]


def _cuda_flash_backward(dout, q, k, v, out, lse, scale):
    empty = _empty_i64(q)
    # cum_seq_q/k must be undefined (None): defined ones select the variable-length kernel.
    dq, dk, dv = aten_op("_scaled_dot_product_flash_attention_backward")(
        _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse.float().contiguous(),
        None, None, q.shape[1], k.shape[1], 0.0, False, empty, empty, scale=scale,
    )  # fmt: skip
    return _bhsd(dq), _bhsd(dk), _bhsd(dv)


def _cuda_efficient_forward(q, k, v, scale):
    out, lse, _, _ = aten_op("_scaled_dot_product_efficient_attention")(
        _bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, False, scale=scale
    )
    return _bhsd(out), lse[..., : q.shape[1]]  # the kernel pads lse to a multiple of 32 queries


def _cuda_efficient_backward(dout, q, k, v, out, lse, scale):
    sq = q.shape[1]
    lse = torch.nn.functional.pad(lse.float(), (0, -sq % 32)).contiguous()
    empty = _empty_i64(q)
    # The kernel assumes out is contiguous in (B, S, H, D) (its row stride is fixed to H * D).
    out, dout = out.contiguous(), dout.contiguous()
    dq, dk, dv, _ = aten_op("_scaled_dot_product_efficient_attention_backward")(
        _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), None, _bhsd(out), lse, empty, empty, 0.0,
        [True, True, True, False], False, scale=scale,
    )  # fmt: skip
    return _bhsd(dq), _bhsd(dk), _bhsd(dv)


# --- flash-attn 2 / 3 (optional packages, imported on first use) ---------------------------------
def _module_missing(module: str, extra: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        if torch.cuda.is_available() is False:
            return "CUDA is not available"
        try:
            importlib.import_module(module)
        except ImportError as e:
            return f"`import {module}` failed ({e}); install it with `pip install {extra}`"
        return None

    return missing


def _call(fn: Callable, **kwargs):
    """Call a flash-attn internal with the keyword arguments its installed version accepts (recent
    releases wrap them in ``torch.library.custom_op``, whose own signature is ``(*args, **kwargs)``)."""
    params = inspect.signature(custom_op_function(fn)).parameters
    if "window_size" in params:
        kwargs["window_size"] = (-1, -1)
    return fn(**{name: value for name, value in kwargs.items() if name in params})


def _fa_module(version: int):
    return importlib.import_module("flash_attn.flash_attn_interface" if version == 2 else "flash_attn_interface")


def _flash_attn_forward(version: int):
    def forward(q, k, v, scale):
        res = _call(
            _fa_module(version)._flash_attn_forward, q=q.contiguous(), k=k.contiguous(), v=v.contiguous(),
            dropout_p=0.0, softmax_scale=scale, causal=False, window_size_left=-1, window_size_right=-1,
            softcap=0.0, alibi_slopes=None, return_softmax=False,
        )  # fmt: skip
        # flash-attn < 2.7 returns (out, q, k, v, out_padded, lse, S_dmask, rng_state)
        return res[0], res[5] if len(res) == 8 else res[1]

    return forward


def _flash_attn_backward(version: int):
    def backward(dout, q, k, v, out, lse, scale):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _call(
            _fa_module(version)._flash_attn_backward, dout=dout.contiguous(), q=q.contiguous(),
            k=k.contiguous(), v=v.contiguous(), out=out.contiguous(), softmax_lse=lse.float().contiguous(),
            dq=dq, dk=dk, dv=dv, dropout_p=0.0, softmax_scale=scale, causal=False, window_size_left=-1,
            window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False, rng_state=None,
        )  # fmt: skip
        return dq, dk, dv

    return backward


def _cuda_half(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256


KERNELS: dict[str, AttentionKernel] = {
    k.name: k
    for k in (
        AttentionKernel("flash_attn3", _flash_attn_forward(3), _flash_attn_backward(3), _cuda_half,
                        _module_missing("flash_attn_interface", "flash-attn 3 (hopper build)")),
        AttentionKernel("flash_attn2", _flash_attn_forward(2), _flash_attn_backward(2), _cuda_half,
                        _module_missing("flash_attn", "flash-attn")),
        AttentionKernel("torch_flash", _cuda_flash_forward, _cuda_flash_backward, _cuda_half,
                        _no_cuda("_scaled_dot_product_flash_attention",
                                 "_scaled_dot_product_flash_attention_backward")),
        AttentionKernel("torch_efficient", _cuda_efficient_forward, _cuda_efficient_backward,
                        lambda dev, dt, hd: dev.type == "cuda" and dt.is_floating_point and dt != torch.float64,
                        _no_cuda("_scaled_dot_product_efficient_attention",
                                 "_scaled_dot_product_efficient_attention_backward")),
        AttentionKernel("cpu_flash", _cpu_forward, _cpu_backward,
                        lambda dev, dt, hd: dev.type == "cpu" and dt.is_floating_point,
                        lambda: aten_missing("_scaled_dot_product_flash_attention_for_cpu",
                                             "_scaled_dot_product_flash_attention_for_cpu_backward")),
        AttentionKernel("math", _math_forward, _math_backward, lambda dev, dt, hd: dt.is_floating_point),
    )
}  # fmt: skip
"""Kernels in order of preference for automatic choice."""


def get_kernel(name: str | None, device: torch.device, dtype: torch.dtype, head_dim: int) -> AttentionKernel:
    """The kernel called ``name``, or the best one for this device, dtype and head size.

    An explicit name that is unknown, unusable here (package missing, no CUDA) or unsuitable for the
    inputs raises a ``ValueError`` that says why and lists the kernels that would work.
    """
    usable = [k.name for k in KERNELS.values() if k.supports(device, dtype, head_dim) and k.missing() is None]
    if name is None:
        if not usable:
            raise ValueError(f"no attention kernel supports {device.type} / {dtype} / head_dim={head_dim}")
        return KERNELS[usable[0]]
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; known kernels: {sorted(KERNELS)}")
    kernel = KERNELS[name]
    why = kernel.missing()
    if why is None and not kernel.supports(device, dtype, head_dim):
        why = f"it does not support {device.type} tensors of {dtype} with head_dim={head_dim}"
    if why is not None:
        raise ValueError(f"attention kernel {name!r} cannot be used: {why}. Usable here: {usable}")
    return kernel
