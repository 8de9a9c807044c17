"""GRPO policy of LTX-2 (``LTX2Policy``: the video stream, the audio isolated), text-to-video: its
Euler ODE at the scheduler's own noise levels is the stock pipeline's sampling where the stock pipeline's audio path
is the policy's (the audio-video cross-attentions isolated), and the test shows what differs where it is not. One
GRPO step on 1x2 and 2x1 is in tests/rl/test_family_policies.py (the families' shared spawn)."""

from __future__ import annotations

import pytest
import torch

from dit_sp.families import policy_for
from dit_sp.zoo import build_tiny

SETTINGS = {"num_frames": 9, "height": 32, "width": 32, "num_inference_steps": 2, "guidance_scale": 3.0,
            "max_sequence_length": 32}  # fmt: skip
"""The stock calls' size and classifier-free guidance (the policy's)."""

PLAIN_CFG = {"stg_scale": 0.0, "modality_scale": 1.0, "guidance_rescale": 0.0}
"""The stock pipeline's extra guidance off (spatio-temporal, modality isolation, rescale): not part of the policy."""


def _isolate(pipe, on: bool = True) -> None:
    """Every call of the pipeline's transformer with ``isolate_modalities`` (both audio-video cross-attentions off,
    the video's velocity independent of the audio), as the policy calls it; ``on=False`` removes that."""
    for handle in vars(pipe.transformer).pop("_isolating", []):
        handle.remove()
    if on:
        force = lambda module, args, kwargs: (args, kwargs | {"isolate_modalities": True})  # noqa: E731
        pipe.transformer._isolating = [pipe.transformer.register_forward_pre_hook(force, with_kwargs=True)]


def _stock(pipe, grid: tuple[int, int, int], **call) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock pipeline's final video latents ``(B, C, F, H, W)`` (read at its last step's callback, normalised as
    the policy's) and its video ``(B, F, C, H, W)``."""
    steps = []
    video = pipe(output_type="pt", callback_on_step_end=lambda p, i, t, kw: steps.append(kw["latents"]) or {},
                 **call).frames  # fmt: skip
    return pipe._unpack_latents(steps[-1], *grid, 1, 1), video


def _euler(policy, x: torch.Tensor, levels: list[float], cond) -> torch.Tensor:
    """The policy's Euler ODE (GRPO's SDE step without noise) through ``levels``, to 0."""
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_ltx2_policy_ode_is_the_pipelines_with_the_audio_isolated():
    """LTX2Pipeline with its transformer's audio-video cross-attentions isolated (the policy's audio path) and plain
    classifier-free guidance (guidance 3): its video latents are the policy's Euler ODE within 1e-5 and its video the
    policy's decode. Its own joint sampling differs: the video attends to the audio it denoises beside it. With the
    audio-to-video attention's output zeroed, the stock joint sampling (modality guidance 3 included) is the policy's
    again: that attention is the whole difference."""
    pipe = build_tiny("tiny-ltx2")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0,
                              max_sequence_length=32)  # fmt: skip
    assert type(policy).__name__ == "LTX2Policy" and not policy.takes_images
    grid = policy.shape[1:]
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    call = {"prompt": "a red circle", "negative_prompt": "", "latents": pipe._pack_latents(noise, 1, 1)} | SETTINGS
    _isolate(pipe)
    stock, video = _stock(pipe, grid, **call, **PLAIN_CFG)
    _isolate(pipe, on=False)
    ours = _euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), policy.encode(["a red circle"]))
    assert stock.abs().max() > 1
    print(f"LTX2Policy: ODE vs stock (audio isolated) {(ours - stock).abs().max():.2e}")
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours), video, atol=1e-5, rtol=0)
    joint, _ = _stock(pipe, grid, **call, **PLAIN_CFG)
    print(f"LTX2Policy: ODE vs stock joint audio-video sampling {(ours - joint).abs().max():.2e}")
    assert (ours - joint).abs().max() > 0.1
    for block in pipe.transformer.transformer_blocks:
        torch.nn.init.zeros_(block.audio_to_video_attn.to_out[0].weight)
        torch.nn.init.zeros_(block.audio_to_video_attn.to_out[0].bias)
    joint, _ = _stock(pipe, grid, **call, **PLAIN_CFG | {"modality_scale": 3.0})
    torch.testing.assert_close(ours, joint, atol=1e-5, rtol=0)
