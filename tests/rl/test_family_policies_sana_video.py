"""GRPO policy of Sana-Video T2V (flow prediction on flow sigmas: the velocity as it is) and the refusals of Cosmos 1
text-to-world (EDM), Latte and Allegro (epsilon on a VP schedule), whose noisiest level is not pure noise. One GRPO
step of Sana-Video on 1x2 and 2x1 is in tests/rl/test_family_policies.py (the families' shared spawn)."""

from __future__ import annotations

import pytest
import torch
from policy_checks import unrounded_dpm_solver

from dit_sp.families import policy_for
from dit_sp.families.sana_video import SanaVideoPolicy
from dit_sp.zoo import build_tiny


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_sana_video_policy_ode_and_decode_are_the_pipelines():
    """Sana-Video T2V: the policy's Euler ODE (Gemma 2 text behind the pipeline's complex-human instruction, masked;
    guidance as one batch) is the stock SanaVideoPipeline's first-order DPM-solver++ sampling with flow_prediction
    (shift 8, guidance 3), and its decode (the Wan VAE's mean and std) the pipeline's video."""
    pipe = build_tiny("tiny-sana-video")
    assert type(pipe.scheduler).__name__ == "DPMSolverMultistepScheduler"
    pipe.scheduler = unrounded_dpm_solver(pipe.scheduler)
    policy = SanaVideoPolicy(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=3.0,
                             max_sequence_length=16)  # fmt: skip
    positive, negative = policy.encode(["a red circle"])
    # the prompt's 13 byte tokens, behind them the instruction's (the first token is the instruction's too)
    assert positive[1].sum() == 14 and negative[1].sum() == 1
    settings = {"frames": 5, "height": 32, "width": 32, "num_inference_steps": 3, "guidance_scale": 3.0,
                "max_sequence_length": 16, "use_resolution_binning": False}  # fmt: skip
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    stock = pipe(prompt="a red circle", negative_prompt="", latents=noise.clone(), output_type="latent",
                 **settings).frames  # fmt: skip
    pipe.scheduler.set_timesteps(3)
    levels = pipe.scheduler.sigmas[:-1].tolist()
    assert levels[0] > 0.999 and levels[-1] < 0.9  # shifted flow sigmas
    x = noise
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, (positive, negative))
    assert stock.abs().max() > 1
    torch.testing.assert_close(x, stock, atol=1e-5, rtol=0)
    video = pipe(prompt="a red circle", negative_prompt="", latents=noise.clone(), output_type="pt", **settings).frames
    torch.testing.assert_close(policy.decode(x), video, atol=1e-5, rtol=0)


def test_sana_video_policy_refuses_what_it_cannot_match():
    from diffusers import DPMSolverMultistepScheduler

    pipe = build_tiny("tiny-sana-video")
    size = {"frames": 5, "height": 32, "width": 32, "guidance": 3.0, "max_sequence_length": 16}
    assert policy_for(pipe) is SanaVideoPolicy
    config = dict(pipe.scheduler.config)
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(config | {"prediction_type": "epsilon"})
    with pytest.raises(ValueError, match="^Sana-Video GRPO trains a flow velocity; this DPMSolverMultistepScheduler "
                                         "predicts 'epsilon'"):  # fmt: skip
        SanaVideoPolicy(pipe, pipe.transformer, **size)
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(config)
    pipe.vae = torch.nn.Identity()
    with pytest.raises(ValueError, match="^Sana-Video GRPO decodes with Wan's VAE .* this pipeline has Identity$"):
        SanaVideoPolicy(pipe, pipe.transformer, **size)


def test_cosmos1_latte_allegro_are_refused_with_their_noisiest_level():
    """Their samplers start below pure noise: the level each refusal names is the one their schedulers reach."""
    for model, name in (("tiny-latte", "LattePipeline"), ("tiny-allegro", "AllegroPipeline")):
        pipe = build_tiny(model)
        alphas = pipe.scheduler.alphas_cumprod.double()[-1]
        level = (1 - alphas).sqrt() / ((1 - alphas).sqrt() + alphas.sqrt())
        with pytest.raises(ValueError, match=f"^GRPO does not train {name}: it predicts epsilon on a variance-") as err:
            policy_for(pipe)
        assert f"flow noise level {level.item():.4f}, not pure noise" in str(err.value)
    pipe = build_tiny("tiny-cosmos1-t2w")
    sigma = pipe.scheduler.config.sigma_max
    with pytest.raises(ValueError, match="^GRPO does not train CosmosTextToWorldPipeline: Cosmos 1 is an EDM") as err:
        policy_for(pipe)
    assert f"sigma_max {sigma} is flow noise level {sigma / (1 + sigma):.4f}, not pure noise" in str(err.value)
