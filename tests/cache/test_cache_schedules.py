"""A new schedule inside one pipeline call, in the pipeline's own cache contexts (``dit_sp.cache.contexts``): Wan
Animate's next segment, SkyReels-V2 diffusion forcing's next long-video iteration, a chunk of other latents. Such a
call resets every context's cache state (its first call computed and compared with nothing, the warm-up run again);
the other branch's first call of the new schedule is not reset again, and a normal per-frame schedule (diffusion
forcing's staggered timestep matrix, whose not-yet-started frames rise from the dummy 999 to the schedule's 1000) never
resets. One process."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import SkyReelsV2DiffusionForcingPipeline
from model_checks import model_inputs
from PIL import Image

from dit_sp.cache import enable_cache
from dit_sp.zoo import build_tiny, load_pipeline


def _changes(cache, context: str) -> list[float | None]:
    return [r.change for r in cache.stats.records if r.context == context]


def _in_context(model: torch.nn.Module, calls: list[dict], spec: str, context: str = "cond"):
    """``calls`` of ``model`` inside its cache context ``context`` under a step cache: ``(outputs, cache)``."""
    cache = enable_cache(model, spec)
    try:
        with torch.no_grad():
            outputs = []
            for call in calls:
                with model.cache_context(context):
                    outputs.append(model(**call, return_dict=False)[0])
    finally:
        cache.undo()
    return outputs, cache


def test_wan_animate_second_segment_starts_a_fresh_state_with_its_warmup():
    """2 segments of 2 steps, a threshold that skips every call it may and a warm-up of 2 steps: every call runs its
    blocks, and each segment's first call (of both branches) is a context's first (no change to compare); the uncond
    call right after the reset at cond is not reset again (cond's second step still compares with its first).
    Without the reset the second segment's calls compare with the first segment's last and are skipped."""
    pipe = load_pipeline("tiny-wan-animate", torch.float32, torch.device("cpu"))
    pipe.set_progress_bar_config(disable=True)
    rng = np.random.RandomState(0)
    image = Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8"))
    video = lambda size: [Image.fromarray((rng.rand(*size, 3) * 255).astype("uint8")) for _ in range(9)]  # noqa: E731
    cache = enable_cache(pipe, "first_block:1e6:2")
    try:
        with torch.no_grad():  # 9 frames, segments of 5 with 1 frame of the previous one: 2 segments
            pipe(image=image, pose_video=video((48, 32)), face_video=video((20, 20)), prompt="a person dancing",
                 negative_prompt="", height=48, width=32, segment_frame_length=5, num_inference_steps=2,
                 guidance_scale=4.0, generator=torch.Generator().manual_seed(0), max_sequence_length=512,
                 output_type="latent")  # fmt: skip
    finally:
        cache.undo()
    assert [r.context for r in cache.stats.records] == ["cond", "uncond"] * 4
    assert cache.stats.decisions() == [True] * 8
    for context in ("cond", "uncond"):
        changes = _changes(cache, context)
        assert changes[0] is None and changes[2] is None, (context, changes)
        assert changes[1] is not None and changes[3] is not None, (context, changes)


def test_a_chunk_of_other_latents_gets_a_fresh_state_and_one_timestep_twice_keeps_it():
    """In one context: a call at the previous call's timestep (a second-order re-evaluation) keeps the state (skipped
    under a threshold that skips all it may); a call whose latents have another shape (the next chunk, even at a
    falling timestep) starts afresh: its blocks run and it equals the model without a cache, not a shape error."""
    model = build_tiny("tiny-skyreels-v2", "transformer").float().eval()
    first = model_inputs("tiny-skyreels-v2", 1)
    g = torch.Generator().manual_seed(5)
    longer = first | {"hidden_states": torch.randn(1, 4, 5, 6, 4, generator=g), "timestep": torch.tensor([400.0])}
    outputs, cache = _in_context(model, [first, first, longer], "first_block:1e6")
    assert cache.stats.decisions() == [True, False, True]
    assert _changes(cache, "cond")[2] is None
    with torch.no_grad():
        plain = model(**longer, return_dict=False)[0]
    assert (outputs[2] - plain).abs().max() <= 1e-6


def test_a_per_frame_schedule_never_resets_and_the_next_one_does():
    """Diffusion forcing's own timestep matrix (asynchronous, 2 frames a block; template from 1000, so a frame that
    starts rises from the dummy 999 while others fall), run twice in the cond context: only each schedule's first
    call is compared with nothing."""
    matrix = SkyReelsV2DiffusionForcingPipeline.generate_timestep_matrix(
        None, 4, torch.tensor([1000, 750, 500, 250]), 4, ar_step=2, causal_block_size=2
    )[0].float()
    rows = len(matrix)
    assert any(bool((after > before).any()) for before, after in zip(matrix, matrix[1:]))  # a frame's time rises
    model = build_tiny("tiny-skyreels-v2-df", "transformer").float().eval()
    base = model_inputs("tiny-skyreels-v2-df", 1)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(1, 4, 4, 6, 4, generator=g)
    calls = [base | {"hidden_states": hidden + 0.01 * i, "timestep": row[None]} for i, row in enumerate(matrix)]
    _, cache = _in_context(model, calls + calls, "first_block:0")  # every call runs: each change is recorded
    changes = _changes(cache, "cond")
    assert [i for i, c in enumerate(changes) if c is None] == [0, rows], changes
