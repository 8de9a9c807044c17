"""LTX-2.5's diffusion decode stage (``LTX2VideoDiffusionDecodePipeline``: latents to frames by
``LTX2VideoDiffusionDecoderModel``) is no video sampler and has no transformer: ``parallelize`` and ``generate`` refuse
it in one line saying so and how to run it (``ModelFamily.refused_pipelines``); the table lists it as refused, and GRPO
refuses it with its reason (tests/rl/test_policy_coverage.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def decode_pipeline():
    """A tiny decode stage: a 4-channel latent decoder, x8 in space and x4 in time, 3 x 3 x 3 neighborhoods (its
    flex-attention decode takes minutes on a CPU, so it is not run here)."""
    import diffusers

    torch.manual_seed(0)
    decoder = diffusers.LTX2VideoDiffusionDecoderModel(
        latent_channels=4, patch_size=1, decoder_head_dim=8, decoder_stage_channels=(64, 32, 16, 16, 8),
        decoder_stage_depths=(1, 1, 1, 1, 1), decoder_stage_kernels=((3, 3, 3),) * 4, decoder_stage5_kernel=(3, 3, 3),
        decoder_t_emb_dim=16, spatial_compression_ratio=8, temporal_compression_ratio=4,
    )  # fmt: skip
    return diffusers.LTX2VideoDiffusionDecodePipeline(decoder, diffusers.FlowMatchEulerDiscreteScheduler())


def test_the_decode_stage_is_refused_by_parallelize_and_generate_in_one_line(decode_pipeline, tmp_path):
    from types import SimpleNamespace

    from dit_sp import GenerateConfig, generate, parallelize
    from dit_sp.errors import ConfigError
    from dit_sp.sp.handle import HANDLE_ATTR
    from dit_sp.zoo.table import family_table

    reason = r"it is LTX-2\.5's decode stage, not a video sampler: .* run it on one process on the latents of a split"
    with pytest.raises(ConfigError, match=rf"^LTX2VideoDiffusionDecodePipeline: {reason}[^\n]*$"):
        parallelize(decode_pipeline, SimpleNamespace(cfg=1))
    assert not hasattr(decode_pipeline, HANDLE_ATTR)  # nothing was installed
    decode_pipeline.save_pretrained(tmp_path / "decode")  # a checkpoint directory of the decode stage
    settings = GenerateConfig.load(overrides={"model": str(tmp_path / "decode"), "out": str(tmp_path / "out.mp4")})
    with pytest.raises(ConfigError, match=rf"decode \(LTX2VideoDiffusionDecodePipeline\): {reason}[^\n]*$"):
        generate(settings)
    assert not (tmp_path / "out.mp4").exists()
    assert "*LTX2VideoDiffusionDecodePipeline* (refused)" in family_table()
