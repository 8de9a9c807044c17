"""Denoising-step benchmark of the tiny Wan transformer on a long video latent: one process vs. ours
(Ulysses 2, Ring 2, CFG 2, all through ``dit_sp.parallelize``) vs. diffusers' own context parallelism.

    python benchmarks/bench_pipeline.py                        # 8x64x64 latent = 8192 tokens (~2.5 min on 2 cores)
    python benchmarks/bench_pipeline.py --frames 4 --iters 3   # 4096 tokens
    python benchmarks/bench_pipeline.py --heads 3              # only the first of the two tables

One "step" is a denoising step with classifier-free guidance: the transformer on the same latent with the
conditional and with the unconditional text embeddings (what WanPipeline does per step; the scheduler
update is negligible). The model is ``build_tiny("tiny-wan", "transformer")`` (3 heads of 12, 2 layers)
on a (1, 4, F, H, W) latent, (F*H*W)/4 tokens after its (1, 2, 2) patching, where self-attention is
over 90% of the time; a second table gives it 4 heads, which Ulysses 2 divides (diffusers' plain
Ulysses cannot run 3 heads; ours pads them to 4, so at 3 heads its slowest rank still does 2 heads).

Sequence-parallel methods split every transformer call over 2 processes; ours-cfg2
(``ParallelConfig(cfg=2)`` on a WanPipeline) runs the conditional branch on one process and the
unconditional on the other. Every method uses processes of 1 thread (so two processes use two cores);
times are the slowest rank's median over ``--iters`` steps after one warm-up step and a barrier;
"peak MiB" is the growth of the process's peak resident memory during the timed steps, above the
resident memory before them (CPU has no allocator stats; the peak is reset after the warm-up through
/proc/self/clear_refs, or else counts from before the warm-up); "max|diff|" is the largest difference
of both branches' outputs from the single-process ones. Other jobs on the cores skew the times badly
(a rank that shares its core holds up its peer at every collective): run it on an idle machine.

diffusers (0.42) on CPU: ``enable_parallelism`` computes ``rank % torch.accelerator.device_count()``,
which divides by zero on CPU-only torch. ``_enable_diffusers_cp`` runs it unchanged but for that one
step: the model's ``_resolve_parallel_config`` is shadowed, for the call only, by one that does what it
does with ``torch.device("cpu")`` and a CPU ``DeviceMesh`` (``ParallelConfig.setup``, recorded on the
model); diffusers' own checks, processor ``_parallel_config`` and split/gather hooks are then applied
by ``enable_parallelism`` itself. Its plain Ulysses needs the head count divisible by the degree;
its ``ulysses_anything`` mode does not.
"""

from __future__ import annotations

import argparse
import gc
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from measure import median_seconds, peak_rss_mib, reset_peak_rss, rss_mib  # benchmarks/measure.py

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn

Step = Callable[[], tuple[torch.Tensor, torch.Tensor]]

METHODS = {  # name: processes
    "single": 1,
    "ours-ulysses2": 2,
    "ours-ring2": 2,
    "ours-cfg2": 2,
    "diffusers-ulysses2": 2,
    "diffusers-ulysses2-anything": 2,
}


def _transformer(heads: int) -> torch.nn.Module:
    from dit_sp.zoo import build_tiny

    model = build_tiny("tiny-wan", "transformer")
    if heads != model.config.num_attention_heads:
        torch.manual_seed(0)
        model = type(model).from_config({**model.config, "num_attention_heads": heads}).eval()
    return model


def _enable_diffusers_cp(model: torch.nn.Module, ulysses: int, anything: bool) -> None:
    """``model.enable_parallelism`` with a CPU device and mesh (see the module docstring)."""
    from diffusers.models._modeling_parallel import ContextParallelConfig
    from diffusers.models._modeling_parallel import ParallelConfig as DiffusersConfig
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    cp = ContextParallelConfig(ulysses_degree=ulysses, ulysses_anything=anything)
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


def build(method: str, heads: int, x: torch.Tensor, t: torch.Tensor, cond, uncond) -> Step:
    """One guidance step of ``method``: (conditional, unconditional) full outputs on every rank."""
    if method == "ours-cfg2":
        from dit_sp.zoo import build_tiny

        pipe = build_tiny("tiny-wan")
        if heads != pipe.transformer.config.num_attention_heads:
            pipe.transformer = _transformer(heads)
        model = pipe.transformer
        parallelize(pipe, init_parallel(ParallelConfig(cfg=2)))
        # The pipeline calls the transformer twice per step: the first call only records its branch and
        # returns a placeholder that the second call fills in after the two ranks have run one each.
    else:
        model = _transformer(heads)
        if method in ("ours-ulysses2", "ours-ring2"):
            ring, uly = (1, 2) if method == "ours-ulysses2" else (2, 1)
            parallelize(model, init_parallel(ParallelConfig(ring=ring, ulysses=uly)))
        elif method.startswith("diffusers-ulysses2"):
            _enable_diffusers_cp(model, 2, anything=method.endswith("-anything"))
        elif method != "single":
            raise ValueError(f"unknown method {method!r}; known: {list(METHODS)}")

    def step():
        a = model(x, t, cond, return_dict=False)[0]
        b = model(x, t, uncond, return_dict=False)[0]
        return a, b

    return step


def worker(method: str, shape: tuple[int, ...], text_len: int, heads: int, iters: int) -> dict:
    torch.manual_seed(1)
    x, cond, uncond = torch.randn(shape), torch.randn(1, text_len, 16), torch.randn(1, text_len, 16)
    t = torch.tensor([500.0])
    step = build(method, heads, x, t, cond, uncond)
    world = dist.get_world_size() if dist.is_initialized() else 1
    gc.collect()
    base = rss_mib()
    with torch.no_grad():
        try:
            outputs = step()  # warm-up
        except RuntimeError as e:
            if method.startswith("diffusers") and heads % 2:
                raise RuntimeError(f"{heads} heads not divisible by Ulysses 2 ({str(e).splitlines()[0]})") from e
            raise
        gc.collect()
        if reset_peak_rss():  # else the warm-up (and lazily loaded kernels) count too, as in bench_attention
            base = rss_mib()
        step_s = median_seconds(step, iters, warmup=False)
    result = torch.tensor([step_s, peak_rss_mib() - base], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(result, op=dist.ReduceOp.MAX)
    step_s, peak = result.tolist()
    return {"step_s": step_s, "peak_mib": peak, "outputs": [o.clone() for o in outputs]}


def run(args: argparse.Namespace, heads: int) -> None:
    shape = (1, 4, args.frames, args.height, args.width)
    tokens = args.frames * args.height * args.width // 4
    rows = {}
    for method in args.methods:
        try:
            rows[method] = spawn(
                worker, METHODS[method], args=(method, shape, args.text_len, heads, args.iters), threads=1, timeout=900
            )[0]
        except Exception as e:  # a method that cannot run here is reported, not fatal
            rows[method] = {"error": str(e).strip().splitlines()[-1][:110]}

    base = rows["single"]
    if "error" in base:
        raise SystemExit(f"single-process reference failed: {base['error']}")
    print(
        f"\ntiny-wan transformer, {heads} heads of 12, 2 layers; latent {shape} = {tokens} tokens + {args.text_len} "
        f"text; fp32, CPU, 1 thread per process; step = transformer(cond) + transformer(uncond)"
    )
    print(f"{'method':28s} {'procs':>5s} {'ms/step':>9s} {'speedup':>8s} {'peak MiB':>9s} {'max|diff|':>10s}")
    for method, r in rows.items():
        if "error" in r:
            print(f"{method:28s} {METHODS[method]:5d}   cannot run: {r['error']}")
            continue
        diff = max((a - b).abs().max().item() for a, b in zip(r["outputs"], base["outputs"]))
        print(
            f"{method:28s} {METHODS[method]:5d} {r['step_s'] * 1e3:9.1f} {base['step_s'] / r['step_s']:7.2f}x "
            f"{r['peak_mib']:9.1f} {diff:10.2e}"
        )

    time_of = {m: r["step_s"] for m, r in rows.items() if "error" not in r}
    ratios = [
        f"{other}/{mine} time = {time_of[other] / time_of[mine]:.3f}"
        for other, mine in [
            ("diffusers-ulysses2", "ours-ulysses2"),
            ("diffusers-ulysses2-anything", "ours-ulysses2"),
            ("single", "ours-cfg2"),
            ("ours-ulysses2", "ours-ring2"),
        ]
        if other in time_of and mine in time_of
    ]
    print("ratios: " + "; ".join(ratios), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8, help="latent frames F")
    parser.add_argument("--height", type=int, default=64, help="latent height H (even)")
    parser.add_argument("--width", type=int, default=64, help="latent width W (even)")
    parser.add_argument("--text-len", type=int, default=32, help="text tokens (cross-attention)")
    parser.add_argument(
        "--heads", type=int, nargs="+", default=[3, 4], help="attention heads: 3 is tiny-wan's; one table each"
    )
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    args = parser.parse_args()
    if "single" not in args.methods:
        parser.error("--methods must include 'single' (the reference)")
    # the tiny model's rotary table has rope_max_seq_len = 32 positions per axis of the patch grid
    if args.frames > 32 or args.height > 64 or args.width > 64 or args.height % 2 or args.width % 2:
        parser.error("the tiny model needs frames <= 32 and even height, width <= 64 (rope_max_seq_len 32)")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"note: load average {load:.1f} before the run; other jobs on the {os.cpu_count()} cores skew timings")
    for heads in args.heads:
        run(args, heads)


if __name__ == "__main__":
    main()
