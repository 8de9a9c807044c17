"""Correctness and throughput check of the attention kernels on a one-GPU CUDA machine (or the CPU kernels).

    bash benchmarks/gpu_check.sh                        # all three parts on CUDA, well under 5 minutes on one H200
    bash benchmarks/gpu_check.sh --quick                # parts 1 and 2 only
    python benchmarks/gpu_check.py --device cpu --quick # parts 1 and 2 on the CPU kernels, small shapes

1. kernels: every kernel usable here (each dtype and head size it supports) against the "math" kernel run in
   fp32 on the same values: (out, lse) of the forward; the backward over all keys and over 2 key blocks given
   the *global* out/lse of the full forward (the block dq must sum, dk/dv concatenate to the full gradients).
2. ring: a one-process simulation of N-rank ring attention (N = 2, 4, 8): per query block, the key/value
   blocks in ring order merged with ``merge_block``, then the per-block backward with the global out/lse,
   against autograd through ``F.scaled_dot_product_attention`` in fp32: the automatic kernel in bf16 (then
   every other usable one), and ``torch_efficient`` in fp32 (on CPU: the automatic kernel in both).
3. throughput (CUDA, skipped by --quick): TFLOP/s of each kernel's forward and forward+backward pair against
   SDPA with autograd, B=1, H=24, D=128, bf16 (forward flops 4*B*H*S*S*D, backward 2.5x that).

Layouts are those of ``dit_sp.attention.kernels``: q (B, Sq, H, D), k/v (B, Sk, H, D), out (B, Sq, H, D) in
the input dtype, lse (B, H, Sq) fp32. Each error is printed as ``max|x - ref| (max|x - ref| / max|ref|)``; the
relative one must be within 2e-2 for bf16/fp16, 1e-4 for fp32 (TF32 is switched off). A kernel that raises is
a FAIL with its message. Exit code 0 when everything passed, 1 when something failed, 2 without CUDA (unless
``--device cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Run from a checkout without installing the package (dit_sp needs only torch).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dit_sp.attention.kernels import KERNELS, AttentionKernel, get_kernel  # noqa: E402
from dit_sp.attention.ring import merge_block  # noqa: E402

Tensor = torch.Tensor
Shape = tuple[int, int, int, int, int]
"""(B, Sq, Sk, H, D)."""

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-2, torch.float32: 1e-4}
DTYPE_NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

KERNEL_SHAPES = {  # uneven lengths on purpose; the last one has fewer keys than any kernel's tile
    "cuda": [(2, 1000, 777, 4, 64), (2, 1000, 777, 4, 128), (1, 37, 5, 3, 64)],
    "cpu": [(2, 100, 77, 2, 16), (1, 37, 5, 3, 64)],
}
RING_SHAPE = {"cuda": (2, 1001, 4, 128), "cpu": (1, 203, 2, 32)}
"""(B, S, H, D) of the whole sequence; S is split unevenly into N blocks."""
RING_SIZES = (2, 4, 8)


@dataclass
class Tally:
    """Counts and prints the PASS/FAIL lines."""

    passed: int = 0
    failed: int = 0

    def compare(self, label: str, pairs: dict[str, tuple[Tensor, Tensor]], tol: float) -> None:
        """PASS when ``max|x - ref| / max|ref| <= tol`` for every ``name: (x, ref)`` (NaN fails)."""
        parts, ok = [], True
        for name, (x, ref) in pairs.items():
            if x.shape != ref.shape:
                parts.append(f"{name} shape {tuple(x.shape)} != {tuple(ref.shape)}")
                ok = False
                continue
            err = (x.double() - ref.double()).abs().max().item()
            rel = err / max(ref.double().abs().max().item(), 1e-30)
            ok = ok and rel <= tol  # False for NaN
            parts.append(f"{name} {err:.1e} ({rel:.1e})")
        self._line(ok, f"{label}: {'  '.join(parts)}  [tol {tol:.0e}]")

    def check(self, label: str, ok: bool, detail: str) -> None:
        self._line(ok, f"{label}: {detail}")

    def error(self, label: str, exc: BaseException) -> None:
        """A FAIL for a call that raised, with the exception's type and message (first lines)."""
        message = " | ".join(str(exc).strip().splitlines()[:3])[:400]
        self._line(False, f"{label}: raised {type(exc).__name__}: {message}")
        if os.environ.get("GPU_CHECK_TRACEBACK"):
            traceback.print_exception(exc)

    def _line(self, ok: bool, text: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'}  {text}", flush=True)


def _sync(device: torch.device) -> None:
    """Surface asynchronous CUDA errors inside the try block of the call that caused them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: torch.device, dtype: torch.dtype) -> Tensor:
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def usable_kernels(device: torch.device, dtype: torch.dtype, head_dim: int) -> list[AttentionKernel]:
    return [k for k in KERNELS.values() if k.missing() is None and k.supports(device, dtype, head_dim)]


# --- 1. each kernel against the math kernel ---------------------------------------------------------
def check_kernel(tally: Tally, kernel: AttentionKernel, device: torch.device, dtype: torch.dtype, shape: Shape) -> None:
    """Forward, whole backward and 2-key-block backward of ``kernel`` against math in fp32 on the same values."""
    b, sq, sk, h, d = shape
    scale = d**-0.5
    gen = torch.Generator().manual_seed(0)
    q, dout = _randn((b, sq, h, d), gen, device, dtype), _randn((b, sq, h, d), gen, device, dtype)
    k, v = _randn((b, sk, h, d), gen, device, dtype), _randn((b, sk, h, d), gen, device, dtype)
    math_kernel = KERNELS["math"]
    f32 = [x.float() for x in (q, k, v, dout)]
    ref_out, ref_lse = math_kernel.forward(*f32[:3], scale)
    ref_grads = math_kernel.backward(f32[3], *f32[:3], ref_out, ref_lse, scale)
    tol = TOLERANCE[dtype]
    label = f"kernels {kernel.name:15s} {DTYPE_NAME[dtype]} B{b} Sq{sq} Sk{sk} H{h} D{d}"

    out = lse = None
    try:
        out, lse = kernel.forward(q, k, v, scale)
        _sync(device)
        conv = out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32 and lse.shape == (b, h, sq)
        if not conv:
            got = f"out {out.dtype} {tuple(out.shape)}, lse {lse.dtype} {tuple(lse.shape)}"
            tally.check(f"{label} fwd", False, f"{got}; expected {dtype} {tuple(q.shape)}, float32 {(b, h, sq)}")
        else:
            tally.compare(f"{label} fwd", {"out": (out, ref_out), "lse": (lse, ref_lse)}, tol)
    except Exception as e:
        tally.error(f"{label} fwd", e)
    if out is None or lse is None or out.shape != q.shape or lse.shape != (b, h, sq):
        out, lse = ref_out.to(dtype), ref_lse  # still test the backward, on the reference's out/lse

    names = ("dq", "dk", "dv")
    try:
        grads = kernel.backward(dout, q, k, v, out, lse, scale)
        _sync(device)
        tally.compare(f"{label} bwd all keys", {n: (g, r) for n, g, r in zip(names, grads, ref_grads)}, tol)
    except Exception as e:
        tally.error(f"{label} bwd all keys", e)
    try:
        dq = torch.zeros_like(q, dtype=torch.float32)
        dks, dvs = [], []
        for kb, vb in zip(k.tensor_split(2, dim=1), v.tensor_split(2, dim=1)):
            dq_b, dk_b, dv_b = kernel.backward(dout, q, kb, vb, out, lse, scale)
            dq += dq_b
            dks.append(dk_b)
            dvs.append(dv_b)
        _sync(device)
        grads = (dq, torch.cat(dks, 1), torch.cat(dvs, 1))
        tally.compare(f"{label} bwd 2 key blocks", {n: (g, r) for n, g, r in zip(names, grads, ref_grads)}, tol)
    except Exception as e:
        tally.error(f"{label} bwd 2 key blocks", e)


def part_kernels(tally: Tally, device: torch.device) -> None:
    print("\n== 1. kernels vs. math (fp32 on the same values); error: max abs (relative to max|ref|)", flush=True)
    for shape in KERNEL_SHAPES[device.type]:
        for dtype in TOLERANCE:
            for kernel in usable_kernels(device, dtype, shape[-1]):
                if kernel.name != "math":  # the reference itself
                    check_kernel(tally, kernel, device, dtype, shape)


# --- 2. ring attention simulated in one process ----------------------------------------------------
def simulate_ring(
    kernel: AttentionKernel, q: Tensor, k: Tensor, v: Tensor, dout: Tensor, ring: int, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Ring attention over ``ring`` sequence blocks of (B, S, H, D) tensors: ``(out, dq, dk, dv)``, (B, S, H, D).

    Rank ``r`` holds query block ``r`` and sees key/value block ``(r - step) % ring`` at each step, as in
    ``RingAttention``; out/lse are merged in fp32 from the first block, dq and each block's dk/dv accumulate in fp32.
    """
    qs, ks, vs, douts = (x.tensor_split(ring, dim=1) for x in (q, k, v, dout))
    dks = [torch.zeros_like(x, dtype=torch.float32) for x in ks]
    dvs = [torch.zeros_like(x, dtype=torch.float32) for x in vs]
    outs, dqs = [], []
    for rank in range(ring):
        order = [(rank - step) % ring for step in range(ring)]
        b, sq, h, _ = qs[rank].shape
        out = lse = None
        for blk in order:
            out, lse = merge_block(out, lse, *kernel.forward(qs[rank], ks[blk], vs[blk], scale), torch.float32)
        out = out.to(q.dtype)
        dq = torch.zeros_like(qs[rank], dtype=torch.float32)
        for blk in order:
            dq_b, dk_b, dv_b = kernel.backward(douts[rank], qs[rank], ks[blk], vs[blk], out, lse, scale)
            dq += dq_b
            dks[blk] += dk_b
            dvs[blk] += dv_b
        outs.append(out)
        dqs.append(dq)
    return torch.cat(outs, 1), torch.cat(dqs, 1), torch.cat(dks, 1), torch.cat(dvs, 1)


def sdpa_reference(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, scale: float) -> tuple[Tensor, ...]:
    """``(out, dq, dk, dv)`` in fp32 by autograd through SDPA on fp32 copies of (B, S, H, D) inputs."""
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q32.transpose(1, 2), k32.transpose(1, 2), v32.transpose(1, 2), scale=scale)
    out = out.transpose(1, 2)
    grads = torch.autograd.grad(out, (q32, k32, v32), dout.float())
    return (out.detach(), *grads)


def ring_cases(device: torch.device, head_dim: int) -> list[tuple[torch.dtype, str | None]]:
    """``(dtype, kernel name)``: bf16 with the automatic kernel (``None``) then every other usable non-math one,
    and fp32 with ``torch_efficient`` (CPU: the automatic kernel)."""
    auto = [k for k in usable_kernels(device, torch.bfloat16, head_dim) if k.name != "math"]
    others = [(torch.bfloat16, k.name) for k in auto[1:]]
    return [(torch.bfloat16, None), *others, (torch.float32, "torch_efficient" if device.type == "cuda" else None)]


def part_ring(tally: Tally, device: torch.device) -> None:
    print("\n== 2. ring simulation vs. autograd through SDPA in fp32", flush=True)
    b, s, h, d = RING_SHAPE[device.type]
    scale = d**-0.5
    for dtype, name in ring_cases(device, d):
        try:
            kernel = get_kernel(name, device, dtype, d)
        except ValueError as e:
            tally.error(f"ring {name or 'auto'} {DTYPE_NAME[dtype]}", e)
            continue
        gen = torch.Generator().manual_seed(1)
        q, k, v, dout = (_randn((b, s, h, d), gen, device, dtype) for _ in range(4))
        ref = sdpa_reference(q, k, v, dout, scale)
        for ring in RING_SIZES:
            label = f"ring N={ring} {kernel.name:15s} {DTYPE_NAME[dtype]} B{b} S{s} H{h} D{d}"
            if name is None:
                label += " (auto)"
            try:
                got = simulate_ring(kernel, q, k, v, dout, ring, scale)
                _sync(device)
                names = ("out", "dq", "dk", "dv")
                tally.compare(label, {n: (g, r) for n, g, r in zip(names, got, ref)}, TOLERANCE[dtype])
            except Exception as e:
                tally.error(label, e)


# --- 3. throughput ---------------------------------------------------------------------------------
def cuda_time(fn: Callable[[], object], warmup: int, iters: int) -> float:
    """Median seconds of ``fn`` on the current CUDA stream, by CUDA events, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def throughput_rows(
    device: torch.device, seq: int, kernels: list[AttentionKernel]
) -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """``(name, forward, forward+backward)`` callables on fresh (1, seq, 24, 128) bf16 inputs: SDPA first."""
    b, h, d, dtype = 1, 24, 128, torch.bfloat16
    scale = d**-0.5
    gen = torch.Generator().manual_seed(2)
    q, k, v, dout = (_randn((b, seq, h, d), gen, device, dtype) for _ in range(4))
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

    def sdpa_fwd() -> Tensor:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    def sdpa_fwd_bwd() -> tuple[Tensor, ...]:
        out = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2))
        return torch.autograd.grad(out, (qg, kg, vg), dout.transpose(1, 2))

    def pair(kernel: AttentionKernel) -> tuple[str, Callable[[], object], Callable[[], object]]:
        def fwd_bwd() -> tuple[Tensor, Tensor, Tensor]:
            return kernel.backward(dout, q, k, v, *kernel.forward(q, k, v, scale), scale)

        return kernel.name, lambda: kernel.forward(q, k, v, scale), fwd_bwd

    return [("sdpa (autograd)", sdpa_fwd, sdpa_fwd_bwd), *(pair(kernel) for kernel in kernels)]


def part_throughput(tally: Tally, device: torch.device, seqs: list[int], iters: int) -> None:
    b, h, d = 1, 24, 128
    kernels = [k for k in usable_kernels(device, torch.bfloat16, d) if k.name != "math"]  # math: S*S scores
    print(f"\n== 3. throughput, B={b} H={h} D={d} bf16, median of {iters} after warm-up (TFLOP/s; x = vs. SDPA)")
    for s in seqs:
        fwd_flops = 4 * b * h * s * s * d
        print(f"S={s} (forward {fwd_flops / 1e12:.2f} TFLOP, backward 2.5x)")
        print(f"  {'kernel':17s} {'fwd ms':>9s} {'fwd TF/s':>9s} {'x':>6s} {'f+b ms':>9s} {'f+b TF/s':>9s} {'x':>6s}")
        rows = throughput_rows(device, s, kernels)
        base: tuple[float, float] | None = None
        for name, fwd, fwd_bwd in rows:
            try:
                t_fwd, t_fwd_bwd = cuda_time(fwd, 2, iters), cuda_time(fwd_bwd, 2, iters)
            except Exception as e:
                tally.error(f"throughput {name} S={s}", e)
                continue
            finally:
                torch.cuda.empty_cache()
            tf, tfb = fwd_flops / t_fwd / 1e12, 3.5 * fwd_flops / t_fwd_bwd / 1e12
            if name == rows[0][0]:
                base = (tf, tfb)
            rf, rfb = (f"{tf / base[0]:5.2f}x", f"{tfb / base[1]:5.2f}x") if base else ("-", "-")
            print(
                f"  {name:17s} {t_fwd * 1e3:9.2f} {tf:9.1f} {rf:>6s} {t_fwd_bwd * 1e3:9.2f} {tfb:9.1f} {rfb:>6s}",
                flush=True,
            )
        del rows
        torch.cuda.empty_cache()


def describe(device: torch.device) -> None:
    """The environment: torch, device, and which kernels are usable here (or why not)."""
    print(f"torch {torch.__version__}, device {device}", end="")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(f": {props.name} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB), "
              f"CUDA {torch.version.cuda}", end="")  # fmt: skip
    print()
    for kernel in KERNELS.values():
        why = kernel.missing()
        if why is None:
            dts = [DTYPE_NAME[dt] for dt in TOLERANCE if kernel.supports(device, dt, 128)]
            why = f"usable for {', '.join(dts)}" if dts else f"not for {device.type}"
        print(f"  {kernel.name:15s} {why}")
    for dist in ("flash-attn", "flash_attn_3"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            print(f"  package {dist} {importlib.metadata.version(dist)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="skip the throughput part")
    parser.add_argument("--seq", type=int, nargs="+", default=[8192, 32768], help="throughput sequence lengths")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per throughput measurement")
    args = parser.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available; nothing checked (use --device cpu --quick to check the logic on CPU)")
        sys.exit(2)
    device = torch.device(args.device)
    # fp32 references and fp32 kernels without TF32, so 1e-4 is a meaningful tolerance.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    describe(device)
    tally = Tally()
    part_kernels(tally, device)
    part_ring(tally, device)
    if args.quick or device.type != "cuda":
        print("\n== 3. throughput skipped" + (" (--quick)" if args.quick else " (CUDA only)"))
    else:
        part_throughput(tally, device, args.seq, args.iters)
    print(f"\ngpu_check: {tally.passed} passed, {tally.failed} failed", flush=True)
    sys.exit(1 if tally.failed else 0)


if __name__ == "__main__":
    main()
