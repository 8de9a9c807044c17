"""GRPO policies of pipelines whose sampler is one trajectory from pure noise in one mode: Kandinsky 5 text-to-image
(one frame). Its GRPO step on 1x2 and 2x1 is in test_family_policies.py's layout test
(``policy_checks.family_configs``)."""

from __future__ import annotations

import pytest
import torch
from grpo_checks import tiny_config

from dit_sp.families.kandinsky5 import Kandinsky5Policy
from dit_sp.rl.preflight import check_before_loading
from dit_sp.zoo import build_tiny


def _euler(policy, noise: torch.Tensor, levels: list[float], cond) -> torch.Tensor:
    """The policy's Euler ODE (GRPO's SDE step without noise) through ``levels``, to 0."""
    x = noise
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_kandinsky5_text_to_image_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """Kandinsky5T2IPipeline: the policy's Euler ODE over one latent frame (rotary scale 1, no sparse attention, each
    text at its own length, guidance 4) is the stock pipeline's sampling, and its decode (the image VAE's, one frame
    ``(B, 1, C, H, W)``) the pipeline's image; a size off the pipeline's resolutions is refused in one line, and so is
    a reward between frames for one frame, before loading."""
    pipe = build_tiny("tiny-kandinsky5-t2i")
    policy = Kandinsky5Policy(pipe, pipe.transformer, frames=1, height=64, width=64, guidance=4.0,
                              max_sequence_length=64)  # fmt: skip
    assert policy.latent_shape() == (4, 1, 8, 8) and not policy.takes_images
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    call = {"prompt": "a red circle", "negative_prompt": "", "max_sequence_length": 64, "height": 64, "width": 64,
            "num_inference_steps": 3, "guidance_scale": 4.0}  # fmt: skip
    stock = pipe(latents=noise.permute(0, 2, 3, 4, 1).clone(), output_type="latent", **call).image  # (B, 1, H, W, C)
    cond = policy.encode(["a red circle"])
    assert cond[0][1].item() > cond[1][1].item() > 0  # the prompt's and the negative prompt's own lengths
    ours = _euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), cond)
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours.permute(0, 2, 3, 4, 1), stock, atol=1e-5, rtol=0)
    image = pipe(latents=noise.permute(0, 2, 3, 4, 1).clone(), output_type="pt", **call).image  # (B, C, H, W)
    decoded = policy.decode(ours)
    assert decoded.shape == (1, 1, 3, 64, 64)
    torch.testing.assert_close(decoded[:, 0], image, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"^Kandinsky5T2IPipeline samples at its resolutions alone \(width x height: "
                                         r"64x64\) and moves 32x64 to the nearest; set sample.width"):  # fmt: skip
        Kandinsky5Policy(pipe, pipe.transformer, frames=1, height=64, width=32, guidance=4.0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    image_run = {"model": "tiny-kandinsky5-t2i", "prompts": str(prompts), "frames": 1, "height": 64, "width": 64}
    with pytest.raises(ValueError, match=r"^reward 'temporal_smoothness' scores the change between consecutive frames, "
                                         "and sample.frames 1 makes one frame"):  # fmt: skip
        check_before_loading(tiny_config(**image_run, reward={"brightness": 1.0, "temporal_smoothness": 1.0}), 1)
    check_before_loading(tiny_config(**image_run, reward="brightness"), 1)
