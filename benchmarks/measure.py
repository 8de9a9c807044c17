"""Timing and memory measurement shared by the benchmarks (CPU: no allocator statistics, so RSS)."""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def rss_mib() -> float:
    """Current resident set of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """Peak resident set of this process so far, or since ``reset_peak_rss`` (VmHWM; getrusage's maximum,
    which no reset touches, where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def steady_malloc() -> None:
    """Make glibc return freed large buffers to the OS at once (a fixed mmap threshold): its adaptive one
    keeps freed gathered weights and activations in the heap, so peaks would measure the allocator's history."""
    import ctypes

    m_mmap_threshold = -3
    ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, 1 << 20)


def reset_peak_rss() -> bool:
    """Set the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def median_seconds(fn: Callable[[], object], iters: int, *, warmup: bool = True) -> float:
    """Median wall time of ``fn`` over ``iters`` runs, ranks aligned by a barrier before each run."""
    if warmup:
        fn()
    times = []
    for _ in range(iters):
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def benchmark_parser(doc: str | None, **ints: int) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring as the description and, per keyword, an int flag with that
    default (``frames=17``: ``--frames``, 17); the benchmark adds the rest."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in ints.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser


def tiny_wan_pipeline(layers: int, heads: int, **transformer: Any) -> Any:
    """``tiny-wan`` with a random Wan transformer (seed 0) of ``layers`` blocks and ``heads`` heads of 64
    (``transformer``: more of its config), the progress bar off: the sampling benchmarks' model."""
    from diffusers import WanTransformer3DModel

    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-wan")
    torch.manual_seed(0)
    sizes = {"num_layers": layers, "num_attention_heads": heads, "attention_head_dim": 64, "ffn_dim": 4 * 64 * heads}
    config = dict(pipe.transformer.config) | transformer | sizes
    pipe.register_modules(transformer=WanTransformer3DModel.from_config(config))
    pipe.set_progress_bar_config(disable=True)
    return pipe
