"""Kandinsky 6 SR parallelized against one process under Ulysses 2: the built-in ``tiny-kandinsky6-sr`` transformer
(NABLA sparse attention through flex attention, 384 tokens in 6 blocks, 3 heads over 2 processes), its masks equal to
the one-process masks of each rank's heads, its output, and its output and every gradient with flex attention made
dense SDPA under the same block mask in both runs (torch's flex attention has no CPU backward, and eager flex ignores
a block mask without ``mask_mod``: the stand-in applies NABLA's sparsity as the compiled kernel does), the split
checked; a ring and CFG parallelism refused in one line; the tiny pipeline and ``generate`` on Ulysses 2, the K-VAE
split by rows; in one 2-process spawn."""

from __future__ import annotations

import pytest
import torch
from kandinsky6_sr_checks import MODEL, TOKENS, check_all, sr_inputs, write_video
from split_errors import assert_matches_one_process

from dit_sp import GenerateConfig, ParallelConfig, init_parallel, parallelize, spawn
from dit_sp.families import family_of
from dit_sp.zoo import build_tiny

TOL = 1e-5


def _settings(tmp, name: str, video: str, **flags) -> GenerateConfig:
    paths = {"out": str(tmp / f"{name}.mp4"), "save_latents": str(tmp / f"{name}.pt")}
    return GenerateConfig.load(overrides={"model": MODEL, "video": video, "verify_inputs": True, **paths, **flags})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kandinsky6_sr")
    (tmp / "video").mkdir()
    video = write_video(tmp / "video")
    jobs = [_settings(tmp, name, video, **flags) for name, flags in (("1x2", {"ulysses": 2}), ("2x1", {"ring": 2}))]
    return {"by_rank": spawn(check_all, 2, args=(video, *jobs), timeout=300)}


@pytest.fixture(scope="module")
def results(runs):
    return [r["transformer"] for r in runs["by_rank"]]


@pytest.mark.slow
def test_transformer_matches_single_process(results):
    for rank, errors in enumerate(results):
        assert_matches_one_process(errors, TOL, f"{MODEL} ulysses 2 rank {rank}")
        assert errors["flex"] <= TOL, f"flex attention output error {errors['flex']:.2e}"
        assert errors["grads_compared"] == errors["params"] + 1  # every parameter's and the latents'
        # with gradient checkpointing (the blocks recomputed in backward) too
        assert errors["checkpointed_out"] <= TOL and errors["checkpointed_grads"] <= TOL, errors
        # one mask per block and run; identical, block for block, to the one-process masks of this rank's heads
        assert errors["masks"] == 2 and errors["masks_equal"], errors
        assert 0.2 < errors["mask_density"] < 0.9, f"NABLA kept {errors['mask_density']:.0%} of the blocks"
        assert errors["seen"] == [TOKENS // 2], f"the self-attention took {errors['seen']} tokens, not half"


@pytest.mark.slow
def test_ring_and_cfg_parallel_are_refused_in_one_line(results):
    errors = results[0]
    # LayoutRefused: a NotImplementedError (a split refused) and a ConfigError (a user's layout: one line from the CLI)
    assert errors["ring_refusal"].startswith(
        "LayoutRefused (NotImplementedError, ConfigError): Kandinsky 6 SR's NABLA sparse attention keeps"
    )
    assert errors["ring_refusal"].endswith("use ring 1 (got ring 2)")
    assert errors["cfg_refusal"].startswith(
        "ConfigError (ConfigError): cfg parallelism (cfg=2) for Kandinsky6SRPipeline"
    )
    assert "does not guide" in errors["cfg_refusal"]
    assert not any("\n" in errors[key] for key in ("ring_refusal", "cfg_refusal"))
    assert errors["left_stock"], "a refused parallelize left dit-sp's processors installed"


PIPELINE_TOKENS = 384
"""The tile: 3 latent frames of 8 x 16 (the 16 x 32 video upscaled 2x to the 32 x 64 tile, the VAE x4 in space)."""
VAE_ROWS = {"encoder": [(32, 32 // 2)], "decoder": [(8, 8 // 2)]}
"""The K-VAE's calls on the one tile, split by rows over 2 processes: (the rows each part was given, the rows its first
causal convolution ran on each rank): the tile's 32 pixel rows encoded once, its 8 denoised latent rows decoded once."""


@pytest.mark.slow
def test_pipeline_matches_single_process(runs):
    """``Kandinsky6SRPipeline`` (one tile, two steps; the masks' block sparsity applied by the dense stand-in) on
    Ulysses 2 with ``frames_on="leader"``: frames within 1e-4 on every rank (the pipeline blends its decoded tiles
    itself, so they assemble on every rank) and every step's latents (from the split encode) within 1e-5 of one
    process, the tokens and the K-VAE's rows really split."""
    for errors in (r["pipeline"] for r in runs["by_rank"]):
        assert errors["shapes"] == {"frames": (1, 5, 32, 64, 3), "latents": (2, 1, 3, 8, 16, 4)}, errors
        for key, tol in (("frames", 1e-4), ("latents", 1e-5)):
            assert errors["std"][key] > 0.01, f"{key}: not a real output ({errors['std']})"
            assert errors[key] <= tol, f"{key} error {errors[key]:.2e} above {tol:.0e}"
        assert errors["seen"] == [PIPELINE_TOKENS // 2], errors["seen"]
        assert errors["vae_rows"] == VAE_ROWS, errors["vae_rows"]


@pytest.mark.slow
def test_generate_matches_single_process(runs):
    """``generate --model tiny-kandinsky6-sr --video DIR --ulysses 2`` against the stock pipeline on one process called
    as ``generate`` calls it (seed 0, the spec's ``resolution_scale`` 2, 2 steps): frames within 1e-4 and final
    latents within 1e-5, one rank writing, the tokens split, and the K-VAE split by rows on every rank (its encode of
    the tile and its decode, each rank its half of the rows: not a leader decode); ``--ring 2`` refused in one line
    before loading (a ``ConfigError``: the CLI's one line)."""
    reports = [r["generate"] for r in runs["by_rank"]]
    leaders = [report for report in reports if report["writes"]]
    assert len(leaders) == 1, "exactly one rank writes the output"
    assert leaders[0]["shape"] == (5, 32, 64, 3), leaders[0]
    assert leaders[0]["frames"] <= 1e-4 and leaders[0]["latents"] <= 1e-5, leaders[0]
    assert all(report["attention_tokens"] == [PIPELINE_TOKENS // 2] for report in reports), reports
    assert all(report["vae_rows"] == VAE_ROWS for report in reports), [report["vae_rows"] for report in reports]
    refusal = runs["by_rank"][0]["generate_ring"]
    # refused before loading (ModelFamily.ring_refused), as the CLI's one line
    assert refusal.startswith("ConfigError (ConfigError): --ring 2 for Kandinsky6SRPipeline: Kandinsky 6 SR's NABLA")
    assert refusal.endswith("use ring 1") and "\n" not in refusal


def test_single_process_parallelize_is_exact():
    model = build_tiny(MODEL, "transformer")
    assert family_of(model).name == "kandinsky6_sr"
    kwargs = sr_inputs()
    with torch.no_grad():
        ref = model(**kwargs, return_dict=False)[0]
        with parallelize(model, init_parallel(ParallelConfig())):
            processor = model.visual_transformer_blocks[0].self_attention.processor
            assert type(processor).__name__ == "SequenceParallelNablaProcessor"
            out = model(**kwargs, return_dict=False)[0]
    assert out.shape == (2, 3, 8, 16, 4)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["subclass", "other"])
def test_a_processor_that_is_not_the_stock_one_is_refused_in_one_line(kind):
    """A block whose self-attention runs another processor than diffusers' ``Kandinsky6SRAttnProcessor`` (a subclass
    that changes it, or another class: an upstream change) is refused in one line, not replaced silently; nothing is
    left installed, and with the stock one set back it splits."""
    from diffusers.models.transformers.transformer_kandinsky6_sr import Kandinsky6SRAttnProcessor

    class Changed(Kandinsky6SRAttnProcessor):
        pass

    class Other:
        def __call__(self, attn, hidden_states, rotary_emb, sparse_params):
            return hidden_states

    model = build_tiny(MODEL, "transformer")
    blocks = model.visual_transformer_blocks
    blocks[-1].self_attention.processor = Changed() if kind == "subclass" else Other()
    name = "Changed" if kind == "subclass" else "Other"
    message = rf"^Kandinsky 6 SR: visual_transformer_blocks\.{len(blocks) - 1}\.self_attention runs \S*\.{name}, not "
    with pytest.raises(NotImplementedError, match=message + "diffusers' Kandinsky6SRAttnProcessor") as e:
        parallelize(model, init_parallel(ParallelConfig()))
    assert "\n" not in str(e.value)
    assert all(type(b.self_attention.processor) is Kandinsky6SRAttnProcessor for b in blocks[:-1])
    assert not model._forward_hooks and not model._forward_pre_hooks
    blocks[-1].self_attention.set_processor(Kandinsky6SRAttnProcessor())
    with parallelize(model, init_parallel(ParallelConfig())):
        assert type(blocks[-1].self_attention.processor).__name__ == "SequenceParallelNablaProcessor"
