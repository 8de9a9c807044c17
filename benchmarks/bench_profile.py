"""Where the time of a sequence-parallel transformer goes: a per-component profile of the Wan, HunyuanVideo and
CogVideoX transformers, forward and backward, on one process and on two (ours, Ulysses 2 and Ring 2).

    python benchmarks/bench_profile.py                          # 3 families, 4608 tokens (~7 min on 2 cores)
    python benchmarks/bench_profile.py --families wan --frames 9 --height 64   # 9216 tokens

Each model has 8 heads of 32, a 4x MLP and 2 transformer blocks (HunyuanVideo: 1 dual-stream + 1
single-stream), random weights, fp32, one thread per process. The profile is torch.profiler's self CPU time
of a forward and a backward after a warm-up (each component's median over ``--repeats`` profiled steps, default 3:
one step alone varies by 10-20% on a shared machine), each operation counted once, in the first of:

- ``split`` / ``gather``: cutting the sequence into shards and gathering the output (the calls of
  ``parallelize``'s hooks, which this script wraps in profiler scopes; in backward every ``AllGather``'s
  reduce-scatter counts as gather, the joint tokens' included);
- ``all-to-all``: Ulysses' exchanges of q/k/v and of the attention output, packing included
  (``ScatterHeads``/``GatherHeads``, the joint tokens' head gather, and their backward); ``ring``: the
  ring's own work outside the kernels (merging block results, waiting for the next block);
- ``attention kernels``: the SDPA / flash kernels, forward and backward;
- ``embeddings`` / ``output``: everything in the model's modules that run before / after the
  transformer blocks (patch and rotary embeddings, time and text embedders; final norm and projection);
- ``blocks, other``: the rest of the blocks (projections, norms, MLP, rotary application, backward
  included).

Time inside a collective includes waiting for the peer: the slower rank's head start shows there. The
columns give each component's time on one process and on 2 processes (mean of the two ranks), and the
ratio; ``wall`` is the slowest rank's median time of the unprofiled steps; ``peak MiB`` the growth of each
process's peak resident memory during a forward and backward, measured in other processes in which
glibc returns freed buffers at once (``measure.steady_malloc``; it slows the profiled ones down).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.distributed as dist
from measure import peak_rss_mib, reset_peak_rss, rss_mib, steady_malloc  # benchmarks/measure.py
from torch.profiler import ProfilerActivity, profile, record_function

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn

FAMILIES = ("wan", "hunyuanvideo", "cogvideox")
LAYOUTS = {"one process": (1, 1), "ours Ulysses 2": (1, 2), "ours Ring 2": (2, 1)}
COMPONENTS = ("embeddings", "split", "all-to-all", "ring", "attention kernels", "blocks, other", "gather", "output")
HEADS, HEAD_DIM, TEXT = 8, 32, 32


def build(family: str, frames: int, height: int, width: int) -> tuple[torch.nn.Module, dict]:
    """A transformer of ``family`` and its inputs: (frames, height, width) latent, ``frames*height*width/4`` tokens."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    text = rand(1, TEXT, 64)
    if family == "wan":
        from diffusers import WanTransformer3DModel

        model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                                      in_channels=16, out_channels=16, text_dim=64, freq_dim=64,
                                      ffn_dim=4 * HEADS * HEAD_DIM, num_layers=2, cross_attn_norm=True,
                                      qk_norm="rms_norm_across_heads", rope_max_seq_len=64)  # fmt: skip
        return model, {"hidden_states": rand(1, 16, frames, height, width), "timestep": torch.tensor([500.0]),
                       "encoder_hidden_states": text}  # fmt: skip
    if family == "hunyuanvideo":
        from diffusers import HunyuanVideoTransformer3DModel

        model = HunyuanVideoTransformer3DModel(in_channels=16, out_channels=16, num_attention_heads=HEADS,
                                               attention_head_dim=HEAD_DIM, num_layers=1, num_single_layers=1,
                                               num_refiner_layers=1, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
                                               qk_norm="rms_norm", guidance_embeds=False, text_embed_dim=64,
                                               pooled_projection_dim=32, rope_axes_dim=(8, 12, 12))  # fmt: skip
        return model, {"hidden_states": rand(1, 16, frames, height, width), "timestep": torch.tensor([500]),
                       "encoder_hidden_states": text, "encoder_attention_mask": torch.ones(1, TEXT, dtype=torch.long),
                       "pooled_projections": rand(1, 32)}  # fmt: skip
    if family == "cogvideox":
        from diffusers import CogVideoXTransformer3DModel
        from diffusers.models.embeddings import get_3d_rotary_pos_embed

        model = CogVideoXTransformer3DModel(num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, in_channels=16,
                                            out_channels=16, time_embed_dim=64, text_embed_dim=64, num_layers=2,
                                            sample_width=width, sample_height=height, sample_frames=4 * frames - 3,
                                            patch_size=2, max_text_seq_length=TEXT,
                                            use_rotary_positional_embeddings=True)  # fmt: skip
        grid = (height // 2, width // 2)
        rope = get_3d_rotary_pos_embed(HEAD_DIM, ((0, 0), grid), grid_size=grid, temporal_size=frames)
        return model, {"hidden_states": rand(1, frames, 16, height, width), "timestep": torch.tensor([500]),
                       "encoder_hidden_states": text, "image_rotary_emb": rope}  # fmt: skip
    raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")


def _scope_split_and_gather() -> None:
    """Profiler scopes ``bench::split`` / ``bench::gather`` around the sequence split and output gather that
    ``parallelize``'s hooks call (the library itself carries no scopes: each costs time on every call)."""
    import dit_sp.sp.plan as plan_hooks

    def scoped(fn: Callable, scope: str) -> Callable:
        def call(*args, **kwargs):
            with record_function(scope):
                return fn(*args, **kwargs)

        return call

    plan_hooks.shard_sequence = scoped(plan_hooks.shard_sequence, "bench::split")
    plan_hooks.gather_sequence = scoped(plan_hooks.gather_sequence, "bench::gather")


def _scope_modules(model: torch.nn.Module) -> None:
    """Profiler scopes ``module::embeddings`` / ``module::output`` around the top-level modules that run
    before / after the transformer blocks (those in ``ModuleList``s)."""
    blocks_seen = False
    for child in model.children():
        if isinstance(child, torch.nn.ModuleList):
            blocks_seen = True
            continue
        scope = "module::output" if blocks_seen else "module::embeddings"

        def enter(module, args, scope=scope):
            module._bench_scope = record_function(scope)
            module._bench_scope.__enter__()

        def leave(module, args, output):
            module._bench_scope.__exit__(None, None, None)

        child.register_forward_pre_hook(enter)
        child.register_forward_hook(leave)


def _component(event) -> str | None:
    """The component of an operation, from its name and those of its enclosing scopes."""
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    if "bench::split" in names:
        return "split"
    if "bench::gather" in names or any(name.startswith("AllGatherBackward") for name in names):
        return "gather"
    for name in names:
        if "ScatterHeads" in name or "GatherHeads" in name or "AllToAll" in name or name.startswith("AllGather"):
            return "all-to-all"
        if "scaled_dot_product" in name or "flash_attention" in name:
            return "attention kernels"
        if "RingAttention" in name:
            return "ring"
        if name == "module::embeddings":
            return "embeddings"
        if name == "module::output":
            return "output"
    return "blocks, other"


def breakdown(prof) -> dict[str, float]:
    """Self CPU milliseconds per component."""
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.name.startswith(("module::", "bench::", "ProfilerStep")):
            continue  # scopes: their operations are counted
        totals[_component(event)] += event.self_cpu_time_total / 1e3
    return dict(totals)


def worker(
    family: str, layout: tuple[int, int], shape: tuple[int, int, int], repeats: int = 1, memory: bool = False
) -> dict:
    """The profile of a forward and a backward (each component's median over ``repeats``), or (``memory``)
    the peak memory growth of both."""
    if memory:
        steady_malloc()  # from the start, so that no freed buffer lingers in the heap to be reused
    model, inputs = build(family, *shape)
    ring, ulysses = layout
    if ring * ulysses > 1:
        _scope_split_and_gather()
        parallelize(model, init_parallel(ParallelConfig(ring=ring, ulysses=ulysses)))
    _scope_modules(model)
    weight = torch.randn(1, generator=torch.Generator().manual_seed(2))

    def forward() -> torch.Tensor:
        return model(**inputs, return_dict=False)[0]

    def step() -> None:
        model.zero_grad(set_to_none=True)
        (forward() * weight).square().mean().backward()

    step()  # warm-up
    barrier: Callable[[], None] = dist.barrier if dist.is_initialized() else lambda: None
    if memory:
        model.zero_grad(set_to_none=True)
        gc.collect()
        barrier()
        base = rss_mib()
        reset_peak_rss()
        step()
        return {"peak": peak_rss_mib() - base}
    walls, phases = [], {"forward": [], "backward": []}
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
        for phase in ("forward", "backward"):
            model.zero_grad(set_to_none=True)
            out = forward() if phase == "backward" else None
            barrier()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                if phase == "forward":
                    with torch.no_grad():
                        forward()
                else:
                    (out * weight).square().mean().backward()
            phases[phase].append(breakdown(prof))
            del out
    return {
        "wall": statistics.median(walls),
        **{
            phase: {c: statistics.median([run.get(c, 0.0) for run in runs]) for c in COMPONENTS}
            for phase, runs in phases.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--frames", type=int, default=9, help="latent frames")
    parser.add_argument("--height", type=int, default=32, help="latent height (even)")
    parser.add_argument("--width", type=int, default=64, help="latent width (even)")
    parser.add_argument("--repeats", type=int, default=3, help="profiled steps; each component's median is shown")
    args = parser.parse_args()
    shape = (args.frames, args.height, args.width)
    tokens = args.frames * args.height * args.width // 4
    for family in args.families:
        runs = {}
        for name, layout in LAYOUTS.items():
            world = layout[0] * layout[1]
            ranks = spawn(worker, world, args=(family, layout, shape, args.repeats), threads=1, timeout=1800)
            peaks = spawn(worker, world, args=(family, layout, shape, 1, True), threads=1, timeout=1800)
            runs[name] = {
                "wall": max(r["wall"] for r in ranks),
                "peak": max(r["peak"] for r in peaks),
                **{
                    phase: {c: sum(r[phase].get(c, 0.0) for r in ranks) / len(ranks) for c in COMPONENTS}
                    for phase in ("forward", "backward")
                },
            }
        print(f"\n{family}: {tokens} video tokens + {TEXT} text, {HEADS} heads of {HEAD_DIM}; ms of self CPU time "
              "per process (mean of the ranks); ratio: one process / 2 processes")  # fmt: skip
        names = list(LAYOUTS)
        print(f"{'component':26s}{names[0]:>14s}" + "".join(f"{n:>16s} {'ratio':>6s}" for n in names[1:]))

        def row(label: str, values: list[float]) -> str:
            ratio = lambda v: f"{values[0] / v:5.2f}x" if v and values[0] else f"{'-':>6s}"
            return f"{label:26s}{values[0]:14.1f}" + "".join(f"{v:16.1f} {ratio(v)}" for v in values[1:])

        for phase in ("forward", "backward"):
            for component in COMPONENTS:
                values = [runs[n][phase][component] for n in names]
                if any(values):
                    print(row(f"{phase}: {component}", values))
        print(row("wall (fwd + bwd), ms", [runs[n]["wall"] * 1e3 for n in names]))
        print(row("peak MiB per process", [runs[n]["peak"] for n in names]), flush=True)


if __name__ == "__main__":
    main()
