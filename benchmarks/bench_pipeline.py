"""A Wan transformer forward on a long video latent: one process vs. ours (Ulysses 2, Ring 2, CFG 2, through
``dit_sp.parallelize``) vs. diffusers' own context parallelism (Ulysses 2), against this machine's limit.

    python benchmarks/bench_pipeline.py                       # 2 blocks, 9216 tokens (~4 min on 2 cores)
    python benchmarks/bench_pipeline.py --layers 12           # 12 blocks (~15 min)
    python benchmarks/bench_pipeline.py --backward            # forward + backward (training)
    python benchmarks/bench_pipeline.py --family ltx --frames 4 --height 32 --width 32   # LTX-Video, 4096 tokens
    python benchmarks/bench_pipeline.py --family mochi --frames 4 --height 64 --width 64 # Mochi, 4096 tokens

The model is a ``WanTransformer3DModel`` with ``--heads`` heads of ``--head-dim`` (default 8 of 32) and
``--layers`` blocks on a (1, 16, F, H, W) latent: F*H*W/4 tokens after its (1, 2, 2) patching (default
9 x 64 x 64 = 9216), 32 text tokens. fp32, one thread per process. Ours, CFG 2 is a ``WanPipeline``
parallelized with ``ParallelConfig(cfg=2)``: a guidance step's conditional and unconditional calls run one
on each process (forward only); its row gives the time per call, half the step.

The machine's limit is measured the same way: the two processes each run the one-process forward at
the same time, with no communication ("2 copies at once"). They do twice the work of one process in
the slower copy's time, so ``limit = 2 * T(one process) / T(2 copies)``: what two processes can do here
at best (shared memory bandwidth and caches, unequal cores). ``of limit`` is each method's speed-up
divided by it.

Every method lives in the same two processes (one model copy each, each process pinned to a core of its
own) and they take turns: each round times every method once, in an order rotated from round to round,
after a barrier (the one-process method runs on rank 0 while rank 1 waits),
so a slow spell of the machine hits all methods alike; the table gives each method's median over
``--rounds`` rounds of the slowest rank's time. "peak MiB" is the largest growth of a process's
resident memory during the call over its resident memory before, measured in two more processes after
the timed rounds (VmHWM reset through /proc/self/clear_refs; glibc there returns freed buffers at once, see
``measure.steady_malloc``, which would slow the timed calls down with page faults).
"max|diff|" compares the output with the one-process output.

diffusers (0.42) on CPU: ``enable_parallelism`` computes ``rank % torch.accelerator.device_count()``,
which divides by zero on CPU-only torch. ``_enable_diffusers_cp`` runs it unchanged but for that one
step: the model's ``_resolve_parallel_config`` is shadowed, for the call only, by one that does what it
does with ``torch.device("cpu")`` and a CPU ``DeviceMesh`` (``ParallelConfig.setup``, recorded on the
model); diffusers' own checks, processor ``_parallel_config`` and split/gather hooks are then applied
by ``enable_parallelism`` itself. Its plain Ulysses needs the head count divisible by the degree.
Other jobs on the cores skew the times badly: run it on an idle machine.

``--family ltx`` / ``--family mochi``: the same method on an ``LTXVideoTransformer3DModel`` (128 latent channels,
patch 1: F*H*W tokens, packed ``(1, S, 128)`` as its pipeline passes them; cross-attention to 32 text tokens) or a
``MochiTransformer3DModel`` (12 channels, patch 2: F*H*W/4 tokens; joint attention with 32 text tokens). Those two
run ``single``, ``limit``, ``ours-ulysses2`` and ``ours-ring2`` (their pipelines batch guidance into one call, so a
per-call CFG 2 row would not compare, and diffusers ships no ``_cp_plan`` for Mochi).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from measure import peak_rss_mib, reset_peak_rss, rss_mib, steady_malloc  # benchmarks/measure.py

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn

METHODS = ("single", "limit", "ours-ulysses2", "ours-ring2", "ours-cfg2", "diffusers-ulysses2")
LABELS = {
    "single": "one process",
    "limit": "2 copies at once (the limit)",
    "ours-ulysses2": "ours, Ulysses 2",
    "ours-ring2": "ours, Ring 2",
    "ours-cfg2": "ours, CFG 2 (per call)",
    "diffusers-ulysses2": "diffusers, Ulysses 2",
}
CALLS = {"ours-cfg2": 2}  # transformer calls per timed run (a guidance step); the table shows time per call


def wan_transformer(heads: int, head_dim: int, layers: int) -> torch.nn.Module:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
                                 in_channels=16, out_channels=16, text_dim=64, freq_dim=64,
                                 ffn_dim=4 * heads * head_dim, num_layers=layers, cross_attn_norm=True,
                                 qk_norm="rms_norm_across_heads", rope_max_seq_len=64)  # fmt: skip


def ltx_transformer(heads: int, head_dim: int, layers: int) -> torch.nn.Module:
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    return LTXVideoTransformer3DModel(in_channels=128, out_channels=128, num_attention_heads=heads,
                                      attention_head_dim=head_dim, cross_attention_dim=heads * head_dim,
                                      num_layers=layers, caption_channels=64)  # fmt: skip


def mochi_transformer(heads: int, head_dim: int, layers: int) -> torch.nn.Module:
    from diffusers import MochiTransformer3DModel

    torch.manual_seed(0)
    return MochiTransformer3DModel(patch_size=2, num_attention_heads=heads, attention_head_dim=head_dim,
                                   num_layers=layers, pooled_projection_dim=64, in_channels=12, text_embed_dim=64,
                                   time_embed_dim=64, max_sequence_length=32)  # fmt: skip


def family_inputs(args: argparse.Namespace, text: torch.Tensor) -> tuple[tuple, dict]:
    """The transformer's positional and keyword arguments for ``args.family`` (seeded latent, timestep 500)."""
    torch.manual_seed(1)
    f, h, w = args.frames, args.height, args.width
    if args.family == "ltx":
        latent = torch.randn(1, f * h * w, 128)  # packed tokens, patch 1
        mask = torch.ones(1, text.shape[1])
        return (latent, text, torch.tensor([500.0]), mask), {"num_frames": f, "height": h, "width": w}
    if args.family == "mochi":
        return (torch.randn(1, 12, f, h, w), text, torch.tensor([500.0]), torch.ones(1, text.shape[1])), {}
    return (torch.randn(1, 16, f, h, w), torch.tensor([500.0]), text), {}


TRANSFORMERS = {"wan": wan_transformer, "ltx": ltx_transformer, "mochi": mochi_transformer}
TOKENS_PER_POSITION = {"wan": 1 / 4, "ltx": 1, "mochi": 1 / 4}  # video tokens per latent position (patching)
NAMES = {"wan": "Wan", "ltx": "LTX-Video", "mochi": "Mochi"}


def _enable_diffusers_cp(model: torch.nn.Module, ulysses: int) -> None:
    """``model.enable_parallelism`` with a CPU device and mesh (see the module docstring)."""
    from diffusers.models._modeling_parallel import ContextParallelConfig
    from diffusers.models._modeling_parallel import ParallelConfig as DiffusersConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(ulysses_degree=ulysses)
    mesh = init_device_mesh("cpu", mesh_shape=cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    cp.mesh = mesh

    def resolve_on_cpu(config: ContextParallelConfig) -> DiffusersConfig:
        config = DiffusersConfig(context_parallel_config=config)
        config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)
        model._parallel_config = config
        return config

    model._resolve_parallel_config = resolve_on_cpu  # shadows the method on this instance only
    try:
        model.enable_parallelism(config=cp)
    finally:
        del model._resolve_parallel_config


def _models(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    base = TRANSFORMERS[args.family](args.heads, args.head_dim, args.layers)
    models = {"single": base, "limit": base}
    for method in args.methods:
        if method == "ours-cfg2":  # a WanPipeline's two guidance branches, one on each process
            from dit_sp.zoo import build_tiny

            pipe = build_tiny("tiny-wan")
            pipe.register_modules(transformer=copy.deepcopy(base))
            parallelize(pipe, init_parallel(ParallelConfig(cfg=2)))
            models[method] = pipe.transformer
        elif method.startswith("ours"):
            ring, ulysses = (1, 2) if method == "ours-ulysses2" else (2, 1)
            models[method] = copy.deepcopy(base)
            parallelize(models[method], init_parallel(ParallelConfig(ring=ring, ulysses=ulysses)))
        elif method == "diffusers-ulysses2":
            models[method] = copy.deepcopy(base)
            _enable_diffusers_cp(models[method], 2)
    return models


def worker(args: argparse.Namespace, memory: bool) -> dict:
    """Times of ``args.rounds`` interleaved rounds, or (``memory``) each method's peak memory growth."""
    if memory:
        steady_malloc()  # from the start, so that no freed buffer lingers in the heap to be reused
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})  # a core each: no migrations
    models = _models(args)
    torch.manual_seed(2)
    text, uncond = torch.randn(1, 32, 64), torch.randn(1, 32, 64)
    inputs, kwargs = family_inputs(args, text)
    uncond_inputs, _ = family_inputs(args, uncond)

    def call(model: torch.nn.Module, method: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with torch.set_grad_enabled(args.backward):
                out = model(*inputs, **kwargs, return_dict=False)[0]
                if method in CALLS:  # the unconditional branch: CFG 2 runs the pair, one on each process
                    model(*uncond_inputs, **kwargs, return_dict=False)
                if args.backward:
                    out.square().mean().backward()
            return out.detach()

        return run

    runs = {method: call(models[method], method) for method in args.methods}
    outputs = {method: runs[method]() for method in args.methods if method != "limit"}  # warm-up

    def measure(method: str) -> tuple[float, float]:
        """(the slowest rank's seconds, the largest peak growth in MiB) of one call."""
        for model in models.values():
            model.zero_grad(set_to_none=True)
        gc.collect()
        dist.barrier()
        base = rss_mib()
        reset_peak_rss()
        start = time.perf_counter()
        if method != "single" or rank == 0:
            runs[method]()
        took = torch.tensor([time.perf_counter() - start, peak_rss_mib() - base], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return took[0].item(), took[1].item()

    if memory:
        return {method: measure(method)[1] for method in args.methods}
    times: dict[str, list[float]] = {method: [] for method in args.methods}
    for round_ in range(args.rounds):
        shift = round_ % len(args.methods)  # each method in every place of the order in turn
        for method in args.methods[shift:] + args.methods[:shift]:
            times[method].append(measure(method)[0])
    return {"times": times, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--frames", type=int, default=9, help="latent frames F")
    parser.add_argument("--height", type=int, default=64, help="latent height H (even, <= 128)")
    parser.add_argument("--width", type=int, default=64, help="latent width W (even, <= 128)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backward", action="store_true", help="time forward + backward of a loss on the output")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--family", default="wan", choices=sorted(TRANSFORMERS), help="the transformer (default: wan)")
    args = parser.parse_args()
    if args.family == "wan" and (args.height % 2 or args.width % 2 or max(args.frames, args.height // 2,
                                                                          args.width // 2) > 64):  # fmt: skip
        parser.error("the model needs even height and width and at most 64 positions per axis of its patch grid")
    if args.family == "mochi" and (args.height % 2 or args.width % 2):
        parser.error("Mochi patches 2 x 2: give an even --height and --width")
    args.methods = ["single", "limit"] + [m for m in args.methods if m not in ("single", "limit")]
    if args.family != "wan":  # see the module docstring
        args.methods = [m for m in args.methods if m not in ("ours-cfg2", "diffusers-ulysses2")]
    if args.backward and "ours-cfg2" in args.methods:
        args.methods.remove("ours-cfg2")  # a guidance pair is sampling, not training
    loads = os.getloadavg()
    print(f"load average (1, 5, 15 min) before the run: {', '.join(f'{x:.2f}' for x in loads)}")
    if loads[0] > 0.5:
        print(f"note: other jobs on the {os.cpu_count()} cores skew timings")

    result = spawn(worker, 2, args=(args, False), threads=1, timeout=7200)[0]
    result["peaks"] = spawn(worker, 2, args=(args, True), threads=1, timeout=7200)[0]
    tokens = int(args.frames * args.height * args.width * TOKENS_PER_POSITION[args.family])
    median = {method: statistics.median(ts) / CALLS.get(method, 1) for method, ts in result["times"].items()}
    single = median["single"]
    limit = 2 * single / median["limit"]
    print(
        f"\n{NAMES[args.family]} transformer, {args.layers} blocks, {args.heads} heads of {args.head_dim}, "
        f"{tokens} video tokens + 32 text; "
        f"{'forward + backward' if args.backward else 'forward'}; fp32, CPU, 1 thread per process; "
        f"median of {args.rounds} interleaved rounds"
    )
    header = ("procs", 5), ("seconds", 8), ("speed-up", 9), ("of limit", 9), ("peak MiB", 9), ("max|diff|", 10)
    print(f"{'method':30s} " + " ".join(f"{name:>{width}s}" for name, width in header))
    for method in args.methods:
        procs = 1 if method == "single" else 2
        speedup = limit if method == "limit" else single / median[method]
        out = result["outputs"].get(method)
        diff = "" if out is None else f"{(out - result['outputs']['single']).abs().max().item():10.2e}"
        print(
            f"{LABELS[method]:30s} {procs:5d} {median[method]:8.2f} {speedup:8.2f}x {speedup / limit:9.2f} "
            f"{result['peaks'][method]:9.0f} {diff}"
        )
    ratios = [
        f"{other}/{mine} time = {median[other] / median[mine]:.3f}"
        for other, mine in [("diffusers-ulysses2", "ours-ulysses2"), ("ours-ulysses2", "ours-ring2")]
        if other in median and mine in median
    ]
    spread = {m: f"{min(ts):.2f}-{max(ts):.2f}" for m, ts in result["times"].items()}
    print("ratios: " + "; ".join(ratios))
    print("range over rounds (s): " + ", ".join(f"{m} {s}" for m, s in spread.items()), flush=True)
    print(f"load average (1, 5, 15 min) after the run: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
