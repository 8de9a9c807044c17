"""The cache-enabled pipelines no family-cache run covered, each run through ``generate --cache`` with first-block and
TeaCache on Ulysses 2 against one process (one spawn for all): Cosmos-Transfer2.5 (its ControlNet runs every step,
uncached; its prompts, (text, image context) tuples, name the guidance branches), Cosmos 1 text-to-world, Kandinsky 5
image-to-video and text-to-image, and LTX-2's TeaCache (the video stream's modulated input). Each skips the same steps
as one process (some, not all), its frames and latents within 1e-4 (Cosmos' uint8 frames within one 8-bit step).
Beside them: the ControlNet itself refuses a step cache in one line, LTX-2's probe is the input its first block's
video self-attention gets, and the tiny Kandinsky 5 pipelines' cond and uncond texts differ."""

from __future__ import annotations

import pytest
import torch
from cache_coverage_checks import MODELS, RUNS, branch_prompt_embeds, settings, write_inputs
from variant_generate_checks import assert_same_video, layout_reports

from dit_sp import generate
from dit_sp.cache import enable_cache
from dit_sp.errors import ConfigError
from dit_sp.zoo import build_tiny


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache_coverage")
    write_inputs(tmp)
    reports = {(*run, "single"): generate(settings(tmp, *run, "single"), True) for run in RUNS}
    return reports | layout_reports([((*run, "1x2"), settings(tmp, *run, "1x2", ulysses=2)) for run in RUNS])


@pytest.mark.slow  # spawns worker processes
@pytest.mark.parametrize(("model", "policy"), RUNS)
def test_the_step_cache_decides_as_one_process(videos, model, policy):
    reference, report = videos[(model, policy, "single")], videos[(model, policy, "1x2")]
    assert report["cache"]["computed"] == reference["cache"]["computed"]
    assert 0 < reference["cache"]["saved_fraction"] < 1, reference["cache"]  # it skipped some blocks, not all
    if model != "tiny-ltx2":  # calls per guidance branch outside cache contexts: each named, each its own state
        assert sorted(reference["cache"]["computed"]) == ["cond", "uncond"], reference["cache"]
    assert_same_video(report, reference, MODELS[model][3])


def test_the_cosmos_transfer_controlnet_refuses_a_step_cache_in_one_line():
    """``enable_cache`` on the pipeline caches its transformer (the runs above); on the ControlNet alone it is refused
    with the ControlNet family's reason."""
    pipe = build_tiny("tiny-cosmos2.5-transfer")
    refusal = (r"^step caching is refused for CosmosControlNetModel \(cosmos-controlnet family\): a ControlNet returns "
               r"a residual per block .*; cache the pipeline, .*; run without --cache$")  # fmt: skip
    with pytest.raises(ConfigError, match=refusal) as error:
        enable_cache(pipe.controlnet, "first_block")
    assert "\n" not in str(error.value)
    enable_cache(pipe, "teacache").undo()  # the pipeline: its transformer alone


@torch.no_grad()
@pytest.mark.parametrize("cross_attn_mod", [False, True])
def test_the_ltx2_teacache_probe_is_the_first_blocks_modulated_video_input(cross_attn_mod):
    """The probe, computed from the first block's call, equals what that block's video self-attention (``attn1``)
    takes: ``norm1`` of the video, scaled and shifted by the video stream's modulation (6 rows, or 9 with the
    cross-attention modulation, ``cross_attn_mod``)."""
    from dit_sp.cache.blocks import block_metadata, register_declared_blocks
    from dit_sp.families import family_of

    model = build_tiny("tiny-ltx2", "transformer")
    if cross_attn_mod:
        torch.manual_seed(0)
        model = type(model).from_config(model.config, cross_attn_mod=True).eval()
    assert model.transformer_blocks[0].scale_shift_table.shape[0] == (9 if cross_attn_mod else 6)
    family = family_of(model)
    register_declared_blocks(model, family.block_outputs)
    block = model.transformer_blocks[0]
    seen = {}

    def probe(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen["probe"] = family.teacache_probe(module, block_metadata(module), args, kwargs)

    def attn1(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen["attn1"] = kwargs["hidden_states"]

    hooks = [block.register_forward_pre_hook(probe, with_kwargs=True),
             block.attn1.register_forward_pre_hook(attn1, with_kwargs=True)]  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    config = model.config
    width = config.num_attention_heads * config.attention_head_dim
    try:
        # one timestep for the sample (temb (B, 1, 6C)), and one per token (conditioning frames: (B, S, 6C))
        for timestep in (torch.tensor([0.7]), torch.rand(1, 12, generator=generator)):
            seen.clear()
            model(hidden_states=torch.randn(1, 12, config.in_channels, generator=generator),
                  audio_hidden_states=torch.randn(1, 3, config.audio_in_channels, generator=generator),
                  encoder_hidden_states=torch.randn(1, 4, config.caption_channels, generator=generator),
                  audio_encoder_hidden_states=torch.randn(1, 4, config.caption_channels, generator=generator),
                  timestep=timestep, audio_timestep=torch.tensor([0.7]), sigma=torch.tensor([0.7]), num_frames=3,
                  height=2, width=2, audio_num_frames=3, return_dict=False)  # fmt: skip
            probe, per_token = seen["probe"]
            assert per_token and probe.shape == seen["attn1"].shape == (1, 12, width)
            torch.testing.assert_close(probe, seen["attn1"], atol=0, rtol=0)
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("model", ["tiny-kandinsky5", "tiny-kandinsky5-i2v", "tiny-kandinsky5-t2i"])
def test_the_tiny_kandinsky5_branches_get_different_texts(model):
    """Under ``generate``'s defaults (the tiny pipelines' family-cache inputs) the conditional and unconditional
    Qwen2.5-VL texts differ from their first token: the tiny tokenizer's template is dropped up to the prompt
    (``prompt_template_encode_start_idx``), so the branches differ in more than CLIP's pooled embedding."""
    cond, uncond = branch_prompt_embeds(model)
    first = min(cond.shape[1], uncond.shape[1])
    assert (cond[:, :1] - uncond[:, :1]).abs().max() > 1e-3, "the first text token is the same in both branches"
    assert (cond[:, :first] - uncond[:, :first]).abs().amax(dim=-1).min() > 1e-4  # every shared position differs
