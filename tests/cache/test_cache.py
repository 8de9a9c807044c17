"""Step caching and torch.compile under sequence and CFG parallelism: the same steps skipped and the same
frames as one process, on every layout; compiled blocks without graph breaks in attention."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from cache_checks import cached_runs
from cli_run import run_cli
from diffusers import FlowMatchHeunDiscreteScheduler
from diffusers.hooks.hooks import CacheContext

from dit_sp import spawn
from dit_sp.cache import CacheSpec, enable_cache
from dit_sp.cache.blocks import cache_context_of, set_cache_context
from dit_sp.errors import ConfigError
from dit_sp.zoo import load_pipeline

SPECS = ["first_block:0.1", "teacache:0.3"]
LAYOUTS = {  # name: (world, cached_runs layout keywords)
    "1x2": (2, {"ulysses": 2}),
    "2x1": (2, {"ring": 2}),
    "2x2": (4, {"ring": 2, "ulysses": 2, "height": 48}),  # 18 tokens over 4 ranks: the last shard padded
    "cfg2x(1x2)": (4, {"cfg": 2, "ulysses": 2}),
}


def _decisions(records: list[dict]) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for r in records:
        out.setdefault(r["context"], []).append(r["computed"])
    return out


def test_cache_specs_parse_and_bad_ones_say_what_is_wrong():
    assert CacheSpec.parse("fbc") == CacheSpec("first_block", 0.05)
    assert CacheSpec.parse("teacache:0.2", [2.0, 0.1]) == CacheSpec("teacache", 0.2, (2.0, 0.1))
    assert CacheSpec.parse("teacache", thresholds={"teacache": 0.08}).threshold == 0.08
    for bad, words in [("magic:0.1", "unknown policy"), ("teacache:fast", "not a number"), ("fbc:-1", ">= 0")]:
        with pytest.raises(ConfigError, match=words):
            CacheSpec.parse(bad)


def test_cache_skips_steps_and_undo_restores_the_uncached_pipeline():
    pipe = load_pipeline("tiny-wan", torch.float32)
    pipe.set_progress_bar_config(disable=True)
    settings = {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 10, "max_sequence_length": 16}
    generator = lambda: torch.Generator().manual_seed(0)
    call = lambda: pipe("a red circle", generator=generator(), output_type="np", **settings).frames[0]
    plain = call()
    for spec in SPECS:
        cache = enable_cache(pipe, spec)
        with pytest.raises(ConfigError, match="already has a step cache"):
            enable_cache(pipe, spec)
        cached = call()
        stats = cache.stats
        assert 0.2 <= stats.saved_fraction < 0.9 and stats.blocks == 10 * 2 * len(pipe.transformer.blocks)
        assert set(_decisions([vars(r) for r in stats.records])) == {"cond", "uncond"}  # a state per branch
        assert np.abs(cached - plain).max() > 1e-3  # skipping changed the result a little...
        assert np.abs(cached - plain).mean() < 0.1  # ...not much
        cache.undo()
        assert np.array_equal(call(), plain)


def test_a_call_outside_a_cache_context_is_refused_or_given_one_for_a_batched_family():
    """diffusers' cache hooks keep a state per cache context: a guidance branch's call outside one would share it
    with the other branch (refused, one line); a family calling once a step (batched guidance) gets one context."""
    wan = load_pipeline("tiny-wan", torch.float32).transformer
    inputs = {"hidden_states": torch.randn(1, 4, 3, 8, 8), "timestep": torch.tensor([500]),
              "encoder_hidden_states": torch.randn(1, 4, wan.config.text_dim)}  # fmt: skip
    cache = enable_cache(wan, "first_block:0.1")
    with pytest.raises(ConfigError, match=r"^step caching: WanTransformer3DModel was called outside a cache context"):
        wan(**inputs)
    with wan.cache_context("cond"):
        wan(**inputs)
    cache.undo()
    easyanimate = load_pipeline("tiny-easyanimate", torch.float32)
    cache = enable_cache(easyanimate, "first_block:0.1")
    easyanimate(
        "a red circle",
        negative_prompt="",
        num_inference_steps=2,
        height=32,
        width=32,
        num_frames=5,
        output_type="latent",
    )
    assert {record.context for record in cache.stats.records} == {"cond_uncond"}
    transformer = easyanimate.transformer
    with pytest.raises(TypeError):  # a call that fails midway (no text states) leaves no cache context behind
        transformer(hidden_states=torch.randn(1, 4, 2, 4, 4), timestep=torch.tensor([500]))
    assert cache_context_of(transformer) is None
    # a second call at that timestep on other tokens (LTX-2 DFR's video tiles) would share the step's one state
    with pytest.raises(ConfigError, match=r"^step caching: EasyAnimateTransformer3DModel was called twice at one "):
        transformer(hidden_states=torch.randn(1, 4, 2, 4, 6), timestep=torch.tensor([500]))
    assert cache_context_of(transformer) is None
    # a second-order scheduler evaluates the same tokens twice at one timestep (Heun: t0, t1, t1, t2, t2): allowed
    cache.stats.clear()
    easyanimate.scheduler = FlowMatchHeunDiscreteScheduler.from_config(easyanimate.scheduler.config)
    easyanimate("a red circle", negative_prompt="", num_inference_steps=3, height=32, width=32, num_frames=5,
                output_type="latent")  # fmt: skip
    assert len(cache.stats.records) == 5 and {record.context for record in cache.stats.records} == {"cond_uncond"}
    cache.undo()


def test_a_cached_call_carrying_an_argument_its_family_refuses_is_refused_in_one_line():
    """Sana-Video adds ``controlnet_block_samples`` to the hidden states between its blocks, outside what the cache
    hooks skip (a skipped step would add them on top of a cached residual that holds them): a cached call passing them
    is refused in one line, in a cache context or not, and leaves none behind; calls without them are cached."""
    from sana_video_checks import builtin_inputs

    model = load_pipeline("tiny-sana-video", torch.float32).transformer
    inputs = builtin_inputs()  # batch 2 (the guidance pair), 3 latent frames of 2 x 4 patches: 24 tokens
    inner = model.config.num_attention_heads * model.config.attention_head_dim
    g = torch.Generator().manual_seed(3)
    samples = tuple(torch.randn(2, 24, inner, generator=g) for _ in model.transformer_blocks[1:])
    later = dict(inputs, timestep=inputs["timestep"] * 0.9)
    refused = r"^step caching: SanaVideoTransformer3DModel was called with 'controlnet_block_samples', .*; run without"
    with torch.no_grad():
        plain, controlled = (model(**inputs, controlnet_block_samples=s)[0] for s in (None, samples))
        assert (plain - controlled).abs().max() > 1e-2  # the samples do change the output uncached
        cache = enable_cache(model, "first_block:10")  # every step after the first skipped
        torch.testing.assert_close(model(**inputs)[0], plain, atol=1e-5, rtol=0)
        with pytest.raises(ConfigError, match=refused):
            model(**later, controlnet_block_samples=samples)
        assert cache_context_of(model) is None
        set_cache_context(model, CacheContext("cond_uncond"))  # a caller's own context (this model has no mixin)
        with pytest.raises(ConfigError, match=refused):
            model(**later, controlnet_block_samples=samples)
        set_cache_context(model, None)
        model(**later)
        assert [record.computed for record in cache.stats.records] == [True, False]  # the normal call: cached
        cache.undo()
        torch.testing.assert_close(model(**inputs, controlnet_block_samples=samples)[0], controlled, atol=0, rtol=0)


def _frames_and_decisions(results: list[list[dict]]) -> list[tuple[np.ndarray, dict]]:
    """Per spec: the frames (from the rank that has them all: every rank here) and the decisions, which
    must be the same on every rank of a branch."""
    return [(runs[0]["frames"], _decisions(runs[0]["records"])) for runs in zip(*results)]


@pytest.fixture(scope="module")
def one_process():
    return {height: spawn(cached_runs, 1, args=("tiny-wan", SPECS, {"height": height}), timeout=300)[0]
            for height in (32, 48)}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cached_sampling_on_every_layout_equals_cached_one_process(one_process, layout):
    world, keywords = LAYOUTS[layout]
    reports = spawn(cached_runs, world, args=("tiny-wan", SPECS, keywords), timeout=300)
    reference = one_process[keywords.get("height", 32)]
    for spec, expected, runs in zip(SPECS, reference, zip(*reports)):
        decisions = [_decisions(run["records"]) for run in runs]
        if keywords.get("cfg") == 2:  # each branch decides on its own ranks, exactly as in one process
            by_branch = {context: d[context] for d in decisions for context in d}
            assert by_branch == _decisions(expected["records"]), spec
            assert all(len(d) == 1 for d in decisions)
        else:
            assert all(d == _decisions(expected["records"]) for d in decisions), spec
        assert 0 < runs[0]["saved"] < 1 and not all(all(v) for v in decisions[0].values())
        for run in runs:
            assert np.abs(run["frames"] - expected["frames"]).max() <= 1e-4, spec


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-hunyuanvideo", "tiny-cogvideox"])
def test_joint_attention_families_cache_the_same_on_two_ranks_and_cfg_pairs(model):
    """HunyuanVideo (two guidance calls per step) and CogVideoX (one call on the guidance batch, so one
    decision for both halves: reduced over the cfg pair too)."""
    specs = ["first_block:0.2", "teacache:0.2"]  # these tiny random models change fast between steps
    expected = spawn(cached_runs, 1, args=(model, specs, {}), timeout=300)[0]
    layout = {"cfg": 2} if model == "tiny-cogvideox" else {"ulysses": 2}
    reports = spawn(cached_runs, 2, args=(model, specs, layout), timeout=300)
    for spec, reference, runs in zip(specs, expected, zip(*reports)):
        for run in runs:
            if model == "tiny-cogvideox":
                assert _decisions(run["records"]) == _decisions(reference["records"]), spec
            assert np.abs(run["frames"] - reference["frames"]).max() <= 1e-4, spec
        assert any(not r["computed"] for r in reference["records"]), f"{spec} skipped nothing: a weak test"


@pytest.mark.slow
def test_ranks_whose_local_metrics_disagree_still_take_the_same_branch():
    """Thresholds between the two shards' own changes: deciding locally, one rank would skip while the
    other computes (a deadlock at the next all-to-all). Reduced, both take the one-process branch."""
    probe = spawn(cached_runs, 2, args=("tiny-wan", ["first_block:0"], {"ulysses": 2}), timeout=300)
    local = [[r["local_change"] for r in run[0]["records"] if r["change"] is not None] for run in probe]
    thresholds = sorted({round((a + b) / 2, 6) for a, b in zip(*local) if abs(a - b) > 0.004})[:4]
    assert thresholds, "the shards' changes never differ: no disagreement to test"
    specs = [f"first_block:{t}" for t in thresholds]
    reports = spawn(cached_runs, 2, args=("tiny-wan", specs, {"ulysses": 2}), timeout=300)
    expected = spawn(cached_runs, 1, args=("tiny-wan", specs, {}), timeout=300)[0]
    disagreements = 0
    for spec, threshold, reference, (rank0, rank1) in zip(specs, thresholds, expected, zip(*reports)):
        for a, b in zip(rank0["records"], rank1["records"]):
            assert a["computed"] == b["computed"] and a["change"] == pytest.approx(b["change"], abs=1e-12)
            if a["local_change"] is not None:
                disagreements += (a["local_change"] > threshold) != (b["local_change"] > threshold)
        assert _decisions(rank0["records"]) == _decisions(reference["records"]), spec
    assert disagreements > 0, "no step where the ranks' own metrics fell on different sides of the threshold"


COMPILED_SPECS = [None, "teacache:0.3"]


@pytest.fixture(scope="module")
def eager():
    """The one-process eager runs the compiled layouts are compared to (the same for every layout)."""
    return spawn(cached_runs, 1, args=("tiny-wan", COMPILED_SPECS, {"steps": 4}), timeout=300)[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_compiled_blocks_equal_eager_without_graph_breaks_and_with_the_cache(eager, layout):
    keywords = dict(LAYOUTS[layout][1], steps=4)
    specs = COMPILED_SPECS
    reports = spawn(cached_runs, 2, args=("tiny-wan", specs, dict(keywords, compile=True)), timeout=600)
    for report in reports:
        *runs, compiled = report
        assert compiled["graph_breaks"] == {} and compiled["graphs"] >= 1
        for run, reference in zip(runs, eager):
            assert np.abs(run["frames"] - reference["frames"]).max() <= 1e-5
            assert _decisions(run["records"]) == _decisions(reference["records"])


@pytest.mark.slow
def test_generate_cli_with_cache_and_compile(tmp_path):
    """The README's command (``--cache first_block --compile --cfg-parallel --ulysses 2``: tests/test_readme.py leaves
    it to this test) with 6 steps: it writes the video, reports what the cache skipped and the compile time apart."""
    out = tmp_path / "v.mp4"
    result = run_cli("pipelines.generate", ["--cache", "first_block", "--compile", "--cfg-parallel", "--ulysses", "2",
                                            "--steps", "6", "--out", str(out)], cwd=tmp_path, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.is_file() and re.search(r"first_block:[\d.]+ skipped", result.stdout), result.stdout
    # the first step's compilation apart from the step time (else the compiled run looks many times slower)
    assert re.search(r"compile: [\d.]+ s \(first step\), then [\d.]+ s/step", result.stdout), result.stdout
    bad = run_cli("pipelines.generate", ["--cache", "magic", "--out", str(out)], cwd=tmp_path)
    assert bad.returncode == 2 and "unknown policy" in bad.stderr


def test_calls_per_guidance_branch_are_named_by_their_prompt_tensor():
    """ChronoEdit's pipeline calls its transformer once per guidance branch outside any cache context: each call is in
    the context of the prompt tensor it gets (a run's first: cond, its second: uncond, a copy of every
    condition of either that one's, a third refused), a call at a
    higher timestep (a new schedule: Framepack's next section) starts every branch afresh, and diffusers' end-of-run
    reset forgets the tensors."""
    model = load_pipeline("tiny-chronoedit", torch.float32).transformer
    g = torch.Generator().manual_seed(0)
    hidden, image = torch.randn(1, 12, 3, 6, 4, generator=g), torch.randn(1, 5, 16, generator=g)
    cond, uncond, third = (torch.randn(1, 8, 16, generator=g) for _ in range(3))
    cache = enable_cache(model, "first_block:0")
    call = lambda prompt, t: model(hidden_states=hidden, timestep=torch.tensor([t]), encoder_hidden_states=prompt,
                                   encoder_hidden_states_image=image)  # fmt: skip
    for prompt, t in [(cond, 900.0), (uncond, 900.0), (cond, 800.0), (uncond, 800.0), (cond, 950.0), (uncond, 950.0)]:
        call(prompt, t)
    call(cond.clone(), 940.0)  # a copy made each step (Kandinsky 5's `.to(dtype)`): the branch of the one it equals
    call(uncond.clone(), 940.0)
    with pytest.raises(ConfigError, match=r"got a third"):  # a copy of the prompt alone: another branch's conditions
        model(hidden_states=hidden, timestep=torch.tensor([940.0]), encoder_hidden_states=cond.clone(),
              encoder_hidden_states_image=image + 1)  # fmt: skip
    records = cache.stats.records
    assert [r.context for r in records] == ["cond", "uncond"] * 4
    assert [r.change is None for r in records] == [True, True, False, False, True, True, False, False]  # 950 > 800
    with pytest.raises(
        ConfigError, match=r"^step caching: ChronoEditTransformer3DModel got a third 'encoder_hidden_st"
    ):
        call(third, 930.0)
    assert cache_context_of(model) is None
    model._reset_stateful_cache()  # what a stock pipeline does when its run ends: the next run names its own tensors
    call(third, 900.0)
    assert (records[-1].context, records[-1].change) == ("cond", None)
    cache.undo()
    assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in model.modules())


@pytest.mark.parametrize(("model", "pipeline", "reason"), [
    ("tiny-anyflow-far", "AnyFlowFARPipeline", "which a skipped block would leave unfilled for the next chunk"),
])  # fmt: skip
def test_generate_refuses_a_cache_the_family_refuses_before_loading_with_its_reason(model, pipeline, reason):
    """``--cache`` for a family whose blocks the caches cannot run on: one line naming the pipeline, its family and
    the family's own reason (``ModelFamily.step_cache_refused``), from the files alone; a supported family passes."""
    from dit_sp import GenerateConfig
    from dit_sp.inference import check_before_loading

    family = model.removeprefix("tiny-").replace("-", "_")
    with pytest.raises(ConfigError, match=rf"^--cache first_block: step caching is refused for {pipeline} \({family} "
                                          rf"family\): [^\n]*{reason}[^\n]*; run without --cache$"):  # fmt: skip
        check_before_loading(GenerateConfig.load(overrides={"model": model, "cache": "first_block"}))
    check_before_loading(GenerateConfig.load(overrides={"model": model}))  # no cache: nothing refused
    check_before_loading(GenerateConfig.load(overrides={"model": "tiny-wan", "cache": "first_block"}))


def test_calls_without_guidance_are_one_context_reset_where_a_new_schedule_starts():
    """Kandinsky 6 SR (tile after tile, each tile's schedule falling) and MiniMax-H3 (flow time, rising; a modular
    pipeline, which resets no state between runs) call the transformer once a step outside any cache context: every
    call is ``cond``, and one whose timesteps did not move on along the schedule (the next tile's first step, a tile
    of one step too; a next run) or of other shapes starts with no state (no change to decide on), so no tile or run
    reuses another's residual."""
    import diffusers
    from kandinsky_cosmos_checks import TINY

    from dit_sp.zoo import build_tiny

    sr = build_tiny("tiny-kandinsky6-sr", "transformer")
    tiles = lambda n: torch.cat([torch.randn(n, 1, 16, 16, 4), torch.zeros(n, 1, 16, 16, 5)], -1)  # noqa: E731 (64 tokens)
    cache = enable_cache(sr, "first_block:0")
    with torch.no_grad():  # (flex attention: no backward on CPU)
        for t in [900.0, 600.0, 900.0, 900.0]:  # tiles of 2, 1 and 1 steps
            sr(hidden_states=tiles(1), timestep=torch.tensor([t]))
        sr(hidden_states=tiles(2), timestep=torch.tensor([600.0, 600.0]))  # a chunk of 2 tiles: timesteps fell, but
        # its shapes are others
    records = cache.stats.records
    assert {r.context for r in records} == {"cond"}
    assert [r.change is None for r in records] == [True, False, True, True, True]
    cache.undo()
    name, config, make_inputs = TINY["minimax_h3"]
    minimax = getattr(diffusers, name)(**config).float()
    inputs = make_inputs(1)
    cache = enable_cache(minimax, "teacache:0")
    for video, audio in [(0.1, 0.2), (0.3, 0.5), (0.6, 0.9), (0.1, 0.2), (0.3, 0.5)]:  # two runs
        minimax(**inputs | {"timestep": torch.tensor([video, audio])})
    assert [r.change is None for r in cache.stats.records] == [True, False, False, True, False]
    cache.undo()


def test_a_first_block_cache_refuses_a_missing_second_stream_and_the_sana_wm_refiner_in_one_line():
    """Kandinsky 6 without audio (``sample_audio=False``): its blocks' second stream is None, whose residual diffusers'
    first-block hooks add; refused in one line (TeaCache keeps no residual of a None stream: it runs). Sana-WM's refiner
    (its blocks write a key/value cache) has no block metadata: refused in one line."""
    from kandinsky6_checks import kandinsky6_inputs
    from sana_wm_refiner_checks import build_refiner

    from dit_sp.zoo import build_tiny

    model = build_tiny("tiny-kandinsky6", "transformer")
    inputs = kandinsky6_inputs(1, audio=False)
    cache = enable_cache(model, "first_block:0.1")
    refusal = r"^step caching: Kandinsky6FusedTransformerDecoderBlock got no 'aud' stream \(None\), whose residual"
    with model.cache_context("cond"), pytest.raises(ConfigError, match=refusal):
        model(**inputs)
    cache.undo()
    cache = enable_cache(model, "teacache:0.1")
    with model.cache_context("cond"):
        video = model(**inputs, return_dict=False)
    assert len(video) == 1 and video[0].isfinite().all()
    cache.undo()
    with pytest.raises(ConfigError, match=r"^step caching: diffusers has no block metadata for SanaWMLTX2Refiner"):
        enable_cache(build_refiner(), "first_block")
