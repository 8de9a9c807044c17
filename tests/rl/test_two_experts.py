"""Wan 2.2 A14B's two experts: rollouts run the expert (and guidance) the stock pipeline runs at each step;
GRPO trains both (or the configured one) on every layout alike, and the export loads in ``generate``."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from cli_run import run_python
from grpo_checks import step_gradients, tiny_config, trained_experts

from dit_sp import spawn
from dit_sp.families import policy_for
from dit_sp.rl.rollout import sample_trajectory
from dit_sp.rl.sde import SDEConfig
from dit_sp.zoo import build_tiny

MODEL = "tiny-wan2.2-a14b"


def _record_calls(pipe) -> list[str]:
    calls: list[str] = []
    for name in ("transformer", "transformer_2"):
        getattr(pipe, name).register_forward_pre_hook(lambda *_, name=name: calls.append(name))
    return calls


def test_rollout_runs_the_expert_and_guidance_the_stock_pipeline_runs():
    pipe = build_tiny(MODEL)
    calls = _record_calls(pipe)
    size = {"num_frames": 9, "height": 48, "width": 32}
    noise = torch.randn(1, 4, 3, 6, 4, generator=torch.Generator().manual_seed(0))
    stock = pipe(prompt="a red circle", negative_prompt="", num_inference_steps=6, guidance_scale=4.0,
                 guidance_scale_2=2.0, latents=noise.clone(), output_type="latent", max_sequence_length=16,
                 **size).frames  # fmt: skip
    stock_experts = calls[::2]  # the stock pipeline runs the conditional and unconditional branch in turn
    sigmas = [float(s) for s in pipe.scheduler.sigmas]
    assert set(stock_experts) == {"transformer", "transformer_2"}, "the schedule crosses the boundary"

    calls.clear()
    policy = policy_for(pipe)(pipe, pipe.transformer, transformer_2=pipe.transformer_2, frames=9, height=48, width=32,
                              guidance=4.0, guidance_2=2.0, max_sequence_length=16)  # fmt: skip
    cond = policy.encode(["a red circle"])
    traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise, sigmas, SDEConfig("ode"))
    assert calls == stock_experts
    assert (traj.final - stock).abs().max() <= 1e-4

    # the low-noise expert's own guidance counts: another guidance_2 gives another video
    policy.guidance_2 = 4.0
    other = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise, sigmas, SDEConfig("ode"))
    assert (other.final - stock).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(("experts", "lora"), [(None, {}), (["transformer_2"], {}),
                                               (None, {"lora_rank": 2, "kl_coef": 0.01})],
                         ids=["both", "low", "lora"])  # fmt: skip
def test_one_step_moves_the_trained_experts_and_the_export_generates_the_same_video(tmp_path, experts, lora):
    """Full fine-tuning or LoRA (adapters on both experts, each expert's KL to itself with adapters off):
    the export (LoRA merged) generates what the trained pipeline generates."""
    cfg = tiny_config(model=MODEL, experts=experts, steps=4, width=32, **lora)
    result = spawn(trained_experts, 1, args=(cfg, str(tmp_path / "export")), timeout=300)[0]
    assert result["moved"] == (experts or ["transformer", "transformer_2"])
    assert result["trained"].shape == result["exported"].shape
    assert np.abs(result["trained"] - result["exported"]).max() <= 1e-4
    assert result["trained"].std() > 0.01
    if lora:  # each expert's adapters alone, as stock diffusers loads them onto the base model: the same video
        from dit_sp.zoo import load_pipeline

        stock = load_pipeline(MODEL, torch.float32, "cpu")
        stock.load_lora_weights(str(tmp_path / "export" / "lora"))
        stock.load_lora_weights(str(tmp_path / "export" / "lora_2"), load_into_transformer_2=True)
        frames = stock(prompt="a red circle", num_frames=cfg.sample.frames, height=cfg.sample.height,
                       width=cfg.sample.width, num_inference_steps=4, guidance_scale=cfg.sample.guidance,
                       negative_prompt="", max_sequence_length=16, generator=torch.Generator().manual_seed(3),
                       output_type="np").frames[0]  # fmt: skip
        assert np.abs(frames - result["exported"]).max() <= 1e-4
        for expert in (stock.transformer, stock.transformer_2):  # each took its own trained (moved) adapters
            assert any(p.abs().max() > 0 for name, p in expert.named_parameters() if "lora_B" in name)


@pytest.mark.slow
def test_two_expert_gradients_on_ulysses_and_ring_equal_one_process():
    cfg = tiny_config(model=MODEL, steps=4, width=32, ring=1, ulysses=1)
    single = spawn(step_gradients, 1, args=(cfg,), timeout=300)[0]
    assert {name.split(".")[0] for name in single["grads"]} == {"transformer", "transformer_2"}
    for ring, ulysses in ((1, 2), (2, 1)):
        layout = tiny_config(model=MODEL, steps=4, width=32, ring=ring, ulysses=ulysses)
        for grads in (r["grads"] for r in spawn(step_gradients, 2, args=(layout,), timeout=300)):
            assert grads.keys() == single["grads"].keys()
            worst = max((grads[k] - single["grads"][k]).abs().max().item() for k in grads)
            assert worst <= 1e-5, f"ring {ring} x ulysses {ulysses}: gradients differ by {worst:.2e}"


@pytest.mark.slow
def test_a_two_expert_run_resumes_exactly(tmp_path):
    """Both experts' weights and optimizer state are checkpointed: stopped after step 1 and resumed, the run
    logs what an uninterrupted one logs."""

    def train(out, *extra):
        command = [sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_tiny_wan", "--model", MODEL,
                   "--output-dir", str(out), "--eval-every", "0", "--set", "sample.frames=5", "--set", "grpo.steps=3",
                   "--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=2", "--set", "optim.lr=0.001",
                   *extra]  # fmt: skip
        result = run_python(command, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    cut = tmp_path / "cut"
    full = train(cut, "--max-steps", "2", "--checkpoint-every", "1")  # uninterrupted: the steps to compare to
    # stopped after step 1: no later checkpoint, metrics line or export
    shutil.rmtree(cut / "checkpoints" / "step_00000002")
    shutil.rmtree(cut / "final")
    (cut / "metrics.jsonl").write_text((cut / "metrics.jsonl").read_text().splitlines(keepends=True)[0])
    resumed = train(cut, "--max-steps", "2", "--resume")
    assert [r["step"] for r in resumed] == [0, 1]
    for a, b in zip(resumed[1:], full[1:]):
        for key in ("loss", "reward_mean", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(b[key])), (key, a, b)
    assert full[1]["grad_norm"] > 0 and full[0]["reward_mean"] != full[1]["reward_mean"]
    assert (cut / "final" / "transformer_2" / "config.json").is_file()
