"""Kandinsky 5, Motif-Video (with and without decoder layers), Cosmos, Helios and MiniMax-H3, parallelized, against
one process: the transformers forward and backward on 1x2 (Ulysses) and 2x1 (ring) with uneven token counts;
``generate`` with the built-in ``tiny-kandinsky5`` on 1x2, 2x1 and CFG parallel; a tiny ``MotifVideoPipeline`` (decoder
layers) on 1x2 and 2x1; each with the attention's token count checked (the sequence really is split). All of it in one
2-process spawn. And the one-line refusals of the modes of supported families that cannot be split."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from kandinsky_cosmos_checks import TINY, build, inputs, run_family_matrix

from dit_sp import GenerateConfig, ParallelConfig, generate, init_parallel, parallelize, spawn
from dit_sp.families import family_of

TRANSFORMERS = list(TINY)
LAYOUTS = [(1, 1, 2), (1, 2, 1)]
PIPELINES = {"tiny-kandinsky5": 18}  # built-in model: video tokens of its default size
VIDEO_LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}
TOL = 1e-5  # max abs error; gradients over 1 relative to their scale
BF16_TOL = 1e-2  # gradients a family rounds to bfloat16 in backward (``kandinsky_cosmos_checks.RELATIVE``)


def _settings(tmp, model: str, name: str, **flags) -> GenerateConfig:
    # guidance 2: three guided steps multiply a ring merge's 1e-7 reordering by less than the 4.0 default does
    paths = {"out": str(tmp / f"{model}-{name}.mp4"), "save_latents": str(tmp / f"{model}-{name}.pt")}
    return GenerateConfig.load(overrides={"model": model, "steps": 3, "guidance": 2.0, "verify_inputs": True,
                                          **paths, **flags})  # fmt: skip


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kandinsky_cosmos")
    single = {model: generate(_settings(tmp, model, "single"), True) for model in PIPELINES}
    jobs = [(model, layout) for model in PIPELINES for layout in VIDEO_LAYOUTS]
    configs = [_settings(tmp, model, layout, **VIDEO_LAYOUTS[layout]) for model, layout in jobs]
    by_rank = spawn(run_family_matrix, 2, args=(TRANSFORMERS, LAYOUTS, configs), timeout=300)
    videos = {}
    for i, key in enumerate(jobs):
        leaders = [r["videos"][i] for r in by_rank if "out" in r["videos"][i]]
        assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
        videos[key] = leaders[0]
    return {
        "transformers": by_rank[0]["transformers"],
        "single": single,
        "videos": videos,
        "motif_video": by_rank[0]["motif_video"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_matches_single_process(matrix, name, layout):
    errors = matrix["transformers"][name]["dp{}-r{}-u{}".format(*layout)]
    assert errors["ref_scale"] > 0.1  # real outputs
    for key in ("out", "input_grads", "param_grads"):
        worst = errors.get(key + "_worst", "")
        assert errors[key] <= TOL, f"{name} {layout}: {key} error {errors[key]:.2e} above {TOL:.0e} ({worst})"
    assert errors["bf16_grads"] <= BF16_TOL, f"{name}: {errors['bf16_grads_worst']}"
    tokens = inputs(name)["hidden_states"]
    assert errors["attention_tokens"] == [EXPECTED_TOKENS[name] // 2 + EXPECTED_TOKENS[name] % 2], (
        f"{name}: the attention saw {errors['attention_tokens']} tokens, not half the sequence ({tokens.shape})"
    )
    assert errors["restored_bit_identical"] == 1.0


EXPECTED_TOKENS = dict.fromkeys(TINY, 18) | {"minimax_h3": 19, "helios": 27}
"""Video tokens of each tiny transformer's inputs (``kandinsky_cosmos_checks.inputs``)."""


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(VIDEO_LAYOUTS))
@pytest.mark.parametrize("model", list(PIPELINES))
def test_pipeline_matches_single_process(matrix, model, layout):
    reference, report = matrix["single"][model], matrix["videos"][(model, layout)]
    assert reference["frames"].std() > 0.01  # a real video
    assert report["frames"].shape == reference["frames"].shape
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    assert (torch.load(report["latents"]) - torch.load(reference["latents"])).abs().max() <= 1e-4
    split = 1 if layout == "cfg2" else 2  # cfg parallel: each branch on one process, the whole sequence
    assert report["attention_tokens"] == -(-PIPELINES[model] // split)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
def test_motif_video_pipeline_matches_single_process(matrix, layout):
    """``MotifVideoPipeline`` (from prompt embeddings, guided through its guider, decoder layers, Wan's VAE split) on
    1x2 and 2x1."""
    errors = matrix["motif_video"]["dp{}-r{}-u{}".format(*layout)]
    assert errors["frames_std"] > 0.01  # a real video
    assert errors["frames"] <= 1e-4 and errors["latents"] <= 1e-4, errors
    assert errors["attention_tokens"] == 9  # 18 video tokens, half on each process


REFUSED = [  # (tiny family, config changes, what the one-line error says)
    ("kandinsky5", {"num_visual_blocks": 1}, "one visual block.* use num_visual_blocks >= 2"),
]


@pytest.mark.parametrize(("name", "changes", "message"), REFUSED, ids=lambda x: x if isinstance(x, str) else "")
def test_modes_that_cannot_be_split_are_refused_in_one_line(name, changes, message):
    import diffusers

    class_name, config, _ = TINY[name]
    model = getattr(diffusers, class_name)(**config | changes)
    with pytest.raises(NotImplementedError, match=message) as error:
        parallelize(model, init_parallel(ParallelConfig()))
    assert "\n" not in str(error.value)


def test_a_modular_pipeline_is_parallelized_through_its_transformer():
    """MiniMax-H3 ships only as a Modular Diffusers pipeline: ``parallelize`` finds its transformer component, routes
    its attention, refuses CFG parallelism in one line, and undoes exactly."""
    from types import SimpleNamespace

    from diffusers.modular_pipelines import MiniMaxH3Blocks

    from dit_sp import unparallelize
    from dit_sp.errors import ConfigError

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(transformer=build("minimax_h3"))
    stock = type(pipe)
    kwargs = inputs("minimax_h3")
    with torch.no_grad():
        ref = pipe.transformer(**kwargs, return_dict=False)[0]
        parallelize(pipe, init_parallel(ParallelConfig()))
        processors = {type(m.processor).__name__ for m in pipe.transformer.modules() if hasattr(m, "processor")}
        assert "SequenceParallelMiniMaxH3AttnProcessor" in processors
        assert type(pipe).__name__ == f"SequenceParallel{stock.__name__}"
        torch.testing.assert_close(pipe.transformer(**kwargs, return_dict=False)[0], ref, atol=0, rtol=0)
        unparallelize(pipe)
    assert type(pipe) is stock
    with pytest.raises(ConfigError, match=r"cfg parallelism \(cfg=2\) for MiniMaxH3ModularPipeline: .* guider"):
        parallelize(pipe, SimpleNamespace(cfg=2))


def test_cfg_parallel_is_refused_where_the_pipeline_reads_the_first_branch_early():
    """The Cosmos pipelines compute with the conditional prediction before the unconditional call: cfg=2 is refused
    in one line (only the layout's cfg degree is read before the refusal)."""
    from types import SimpleNamespace

    from dit_sp.errors import ConfigError

    pipe = SimpleNamespace(transformer=build("cosmos"))
    with pytest.raises(ConfigError, match=r"cfg parallelism \(cfg=2\) .* before they make the unconditional call"):
        parallelize(pipe, SimpleNamespace(cfg=2))


def test_single_process_parallelize_is_exact():
    """sp=1: the parallelized transformer computes exactly what the stock one does (channels-last latents, a
    family's own hooks, a plan with wildcards, Motif-Video's decoder layers as two streams)."""
    for name in ("kandinsky5", "helios", "minimax_h3", "motif_video-decoder"):
        model, kwargs = build(name), inputs(name)
        assert family_of(model).name in name
        with torch.no_grad():
            ref = model(**kwargs, return_dict=False)[0]
            with parallelize(model, init_parallel(ParallelConfig())):
                out = model(**kwargs, return_dict=False)[0]
                streams = {name: m.processor._dit_sp_streams for name, m in model.named_modules()
                           if hasattr(getattr(m, "processor", None), "_dit_sp_streams")}  # fmt: skip
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
        if name == "motif_video-decoder":  # 3 single-stream blocks, the last 2 decoder layers
            assert {key: n for key, n in streams.items() if n > 1} == {
                "single_transformer_blocks.1.attn": 2, "single_transformer_blocks.2.attn": 2}  # fmt: skip
            assert streams["single_transformer_blocks.0.attn"] == 1


def test_settings_are_registered():
    settings = dataclasses.asdict(GenerateConfig.load(overrides={"model": "tiny-kandinsky5"}))
    assert (settings["frames"], settings["height"], settings["width"]) == (9, 48, 32)


@pytest.mark.parametrize(("name", "low", "high", "blocks"), [
    ("kandinsky5-t2v-lite", 1.9e9, 2.1e9, 34), ("kandinsky5-t2v-pro", 18.5e9, 20e9, 64),
    ("cosmos1-7b-text2world", 6.9e9, 7.5e9, 28), ("cosmos1-14b-text2world", 13.5e9, 15e9, 36),
    ("helios-14b", 13.5e9, 15e9, 40)])  # fmt: skip
def test_the_planner_knows_the_real_checkpoints_at_their_published_sizes(name, low, high, blocks):
    """Kandinsky 5.0 Video Lite is published as 2B, Pro as 19B; Cosmos-1.0-Diffusion as 7B and 14B; Helios as 14B."""
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape

    class_name, config = ARCHITECTURES[name]["transformers"]["transformer"]
    shape = TransformerShape.of(class_name, config)
    assert low <= shape.params <= high, shape.params
    assert shape.layers == blocks and shape.block_params < shape.params / 10


def test_parallelize_with_a_cache_refuses_a_family_whose_blocks_cannot_take_one_in_one_line():
    """``parallelize(..., cache=...)`` gives the family's own reason (AnyFlow FAR: per-block KV caches)."""
    from dit_sp.errors import ConfigError
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-anyflow-far")
    refusal = r"^step caching is refused for AnyFlowFARTransformer3DModel \(anyflow_far family\): its blocks read"
    with pytest.raises(ConfigError, match=refusal) as error:
        parallelize(pipe, init_parallel(ParallelConfig()), cache="first_block")
    assert "\n" not in str(error.value)


def test_generate_sets_the_guiders_scale_and_refuses_a_pipeline_that_takes_no_guidance_at_all():
    """Motif-Video's pipelines guide through their guider and take no ``guidance_scale``: ``--guidance`` becomes the
    guider's scale; without a guider it is one line, not a TypeError."""
    from kandinsky_cosmos_checks import motif_video_pipeline

    from dit_sp.errors import ConfigError
    from dit_sp.inference import guidance_arguments

    pipe = motif_video_pipeline()
    assert guidance_arguments(pipe, GenerateConfig.load(overrides={"model": "tiny-wan", "guidance": 7.5})) == {}
    assert pipe.guider.guidance_scale == 7.5 and pipe.guider.num_conditions == 2
    guidance_arguments(pipe, GenerateConfig.load(overrides={"model": "tiny-wan", "guidance": 1.0}))
    assert pipe.guider.num_conditions == 1  # <= 1: no unconditional branch, as guidance_scale does elsewhere
    pipe.register_modules(guider=None)
    with pytest.raises(ConfigError, match="MotifVideoPipeline takes no guidance_scale .* generate cannot run it"):
        guidance_arguments(pipe, GenerateConfig.load(overrides={"model": "tiny-wan"}))
