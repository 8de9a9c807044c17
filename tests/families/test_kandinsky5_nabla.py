"""Kandinsky 5's NABLA sparse attention (``attention_type: nabla``) parallelized against one process (the stock model
on diffusers' flex backend) under Ulysses 2: a tiny transformer (256 tokens in 4 NABLA blocks, 3 heads over 2
processes), its masks equal to the one-process masks of each rank's heads, each rank's tokens a contiguous run of
whole blocks of the fractal-ordered sequence, its output, and its output and every gradient with flex attention made
dense SDPA under the same block mask in both runs (torch's flex attention has no CPU backward); a ring refused in one
line in NABLA mode only; ``generate --ulysses 2`` of the tiny pipeline saved with NABLA on against one process, and
``generate --ring 2`` of it refused in one line before loading (the CLI), as is ring 2 by the GRPO trainer's
preflight; GRPO's policy velocity and gradients on Ulysses 2 against one process; in one 2-process spawn. The memory
planner never picks or advises a ring for a NABLA checkpoint."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from cli_run import run_cli
from kandinsky5_nabla_checks import (
    NABLA,
    TOKENS,
    build,
    check_all,
    dense_block_attention,
    nabla_inputs,
    recorded_masks,
    save_nabla_checkpoint,
)

from dit_sp import GenerateConfig, ParallelConfig, generate, init_parallel, parallelize, spawn

TOL = 1e-5
GENERATE = {"frames": 5, "height": 128, "width": 128, "steps": 2, "guidance": 4.0, "max_sequence_length": 16}
"""A NABLA run of the tiny pipeline: 2 latent frames of 8 x 8 tokens (one NABLA block each), guided (two calls a
step)."""


def _settings(tmp, checkpoint: str, name: str, **flags) -> GenerateConfig:
    paths = {"out": str(tmp / f"{name}.mp4"), "save_latents": str(tmp / f"{name}.pt")}
    return GenerateConfig.load(overrides={"model": checkpoint, "verify_inputs": True, **GENERATE, **paths, **flags})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return save_nabla_checkpoint(tmp_path_factory.mktemp("kandinsky5_nabla") / "ckpt")


@pytest.fixture(scope="module")
def spawned(tmp_path_factory, checkpoint):
    tmp = tmp_path_factory.mktemp("kandinsky5_nabla_runs")
    single = generate(_settings(tmp, checkpoint, "single"), True)
    by_rank = spawn(check_all, 2, args=(_settings(tmp, checkpoint, "1x2", ulysses=2),), timeout=300)
    return {"single": single, "by_rank": by_rank}


@pytest.fixture(scope="module")
def runs(spawned):
    return [r["transformer"] for r in spawned["by_rank"]]


@pytest.mark.slow
def test_transformer_matches_single_process(runs):
    for rank, errors in enumerate(runs):
        assert errors["ref_scale"] > 0.1, errors  # a real output
        for key in ("flex", "out", "input_grads", "param_grads"):
            assert errors[key] <= TOL, f"rank {rank}: {key} error {errors[key]:.2e} ({errors.get(key + '_worst')})"
        assert errors["grads_compared"] == errors["params"] + 2  # every parameter's, the latents' and the text's
        # one mask per block; identical, block for block, to the one-process masks of this rank's heads
        assert errors["masks"] == 2 and errors["masks_equal"], errors
        assert 0.2 < errors["mask_density"] < 0.9, f"NABLA kept {errors['mask_density']:.0%} of the blocks"
        # the split: half the sequence, this rank's contiguous half of the one-process fractal order (2 whole blocks)
        assert errors["taken"] == (2, TOKENS // 2, 48) and errors["taken_error"] == 0.0, errors
        assert errors["left_stock"], "unparallelize left dit-sp's self-attention forward installed"


@pytest.mark.slow
def test_ring_is_refused_for_nabla_only(runs):
    refusal = runs[0]["ring_refusal"]
    # LayoutRefused: a NotImplementedError (a split refused) and a ConfigError (one line from the CLI)
    assert refusal.startswith("LayoutRefused: Kandinsky 5's NABLA sparse attention (attention_type 'nabla') keeps")
    assert refusal.endswith("use ring 1 (got ring 2)") and "\n" not in refusal
    assert runs[0]["dense_ring"]  # attention_type 'regular' is still split by a ring


@pytest.mark.slow
def test_grpo_policy_matches_single_process(spawned):
    """GRPO on a NABLA checkpoint (``Kandinsky5Policy`` passes the pipeline's ``sparse_params``): the guided velocity
    and its gradients (every transformer parameter's and the latents') on Ulysses 2 within 1e-5 of one process, the
    dense stand-in in both runs; NABLA's masks built (2 blocks, two calls: the prompt's and the negative prompt's texts
    differ in length), and they act: the velocity is not the dense model's."""
    for rank, errors in enumerate(r["policy"] for r in spawned["by_rank"]):
        assert errors["ref_scale"] > 0.1, errors
        for key in ("out", "input_grads", "param_grads"):
            assert errors[key] <= TOL, f"rank {rank}: {key} error {errors[key]:.2e} ({errors.get(key + '_worst')})"
        assert errors["grads_compared"] == errors["params"] + 1
        assert errors["masks"] == errors["ref_masks"] == 4, errors
        assert errors["vs_dense"] > 0.01, errors


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_grpo_policy_ode_is_the_pipelines_with_nabla():
    """One process: the policy's Euler ODE through the scheduler's own sigmas is the stock pipeline's NABLA sampling
    (guided, 2 steps), the masks' block sparsity applied in both (the dense stand-in): the policy passes the
    pipeline's own ``sparse_params``."""
    from kandinsky5_nabla_checks import POLICY, nabla_policy

    policy = nabla_policy(max_sequence_length=600)
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    masks: list[torch.Tensor] = []
    with dense_block_attention(), recorded_masks(masks):
        stock = policy.pipe(prompt="a red circle", negative_prompt="", max_sequence_length=600, output_type="latent",
                            latents=noise.permute(0, 2, 3, 4, 1).clone(), num_frames=POLICY["frames"],
                            height=POLICY["height"], width=POLICY["width"], num_inference_steps=2,
                            guidance_scale=POLICY["guidance"]).frames  # fmt: skip
        stock_masks = len(masks)
        cond, x = policy.encode(["a red circle"]), noise
        levels = policy.pipe.scheduler.sigmas[:-1].tolist()
        for s, s_next in zip(levels, [*levels[1:], 0.0]):
            x = x + (s_next - s) * policy.velocity(x, s, cond)
    assert stock_masks == 8 and len(masks) == 16, (stock_masks, len(masks))  # 2 blocks x 2 steps x 2 calls each
    assert stock.abs().max() > 1
    torch.testing.assert_close(x.permute(0, 2, 3, 4, 1), stock, atol=1e-5, rtol=0)


@pytest.mark.slow  # runs the CLI
def test_generate_refuses_a_ring_for_a_nabla_checkpoint_before_loading(checkpoint, tmp_path):
    """``generate --ring 2`` of a NABLA checkpoint: refused in one line (exit code 2, no traceback) from its
    transformer's config.json, before any weights load (the family keeps its ring for the dense checkpoints)."""
    result = run_cli("pipelines.generate", ["--model", checkpoint, "--ring", "2", "--out", str(tmp_path / "v.mp4")],
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --ring 2 for Kandinsky5T2VPipeline: Kandinsky 5's NABLA sparse attention "
                                "(attention_type 'nabla') keeps"), result.stderr[-2000:]  # fmt: skip
    assert lines[-1].endswith("use ring 1") and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "v.mp4").exists()


def test_grpo_preflight_refuses_a_ring_for_a_nabla_checkpoint(checkpoint, tmp_path, monkeypatch):
    """The GRPO trainer's checks before loading (``dit_sp.rl.preflight``) refuse ring 2 for a NABLA checkpoint from
    its config.json, and take Ulysses 2 (and ring 2 once the checkpoint's config is dense)."""
    import json

    from dit_sp import TrainConfig
    from dit_sp.errors import ConfigError
    from dit_sp.rl.preflight import check_before_loading

    def config(model: str, name: str, **layout) -> TrainConfig:
        overrides = {"model": model, "output_dir": str(tmp_path / name), "sample.frames": 5, "sample.height": 128,
                     "sample.width": 128, "grpo.prompts_per_step": 2, **layout}  # fmt: skip
        return TrainConfig.load(None, overrides)

    with pytest.raises(ConfigError, match=r"^ring 2 for .*: Kandinsky 5's NABLA sparse attention .* use ring 1$"):
        check_before_loading(config(checkpoint, "ring", ring=2), 2)
    check_before_loading(config(checkpoint, "ulysses", ulysses=2), 2)
    dense = tmp_path / "dense"
    shutil.copytree(checkpoint, dense)
    path = dense / "transformer" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"attention_type": "regular"}))
    check_before_loading(config(str(dense), "dense", ring=2), 2)


@pytest.mark.slow
def test_generate_matches_single_process(spawned):
    """``generate --model CKPT --ulysses 2`` of a NABLA checkpoint (the tiny pipeline saved with NABLA on) against
    ``generate`` on one process (the stock pipeline, its self-attention on diffusers' flex backend): frames and final
    latents within 1e-4, NABLA's masks built (2 blocks x 2 steps x 2 guidance calls), the tokens split."""
    reference = spawned["single"]
    assert reference["frames"].shape == (5, 128, 128, 3) and reference["frames"].std() > 0.01  # a real video
    reports = [r["generate"] for r in spawned["by_rank"]]
    leaders = [report for report in reports if "frames" in report]
    assert len(leaders) == 1, "exactly one rank writes the output"
    assert abs(leaders[0]["frames"] - reference["frames"]).max() <= 1e-4
    assert (leaders[0]["latents"] - torch.load(reference["latents"])).abs().max() <= 1e-4
    assert all(report["masks"] == 8 and report["attention_tokens"] == 64 for report in reports), reports


def test_single_process_parallelize_is_exact():
    """On one process the NABLA calls run dit-sp's processor (flex attention whatever the backend): bit-identical to
    the stock model on the flex backend."""
    model = build()
    kwargs = nabla_inputs(model, batch=1)
    with torch.no_grad():
        ref = model(**kwargs).sample
        with parallelize(model, init_parallel(ParallelConfig())):
            assert "forward" in vars(model.visual_transformer_blocks[0].self_attention)
            out = model(**kwargs).sample
    assert out.shape == (1, 2, 16, 32, 4)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_nabla_sizes_are_checked_in_one_line():
    """NABLA takes 8 x 8 token neighbourhoods: a size off that grid is refused before sampling, naming the multiple."""
    from dit_sp.errors import ConfigError
    from dit_sp.families import check_shape
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-kandinsky5")
    settings = dataclasses.asdict(GenerateConfig.load(overrides={"model": "tiny-kandinsky5", **GENERATE}))
    check_shape(pipe, settings | {"height": 48})  # the dense model: multiples of 16
    pipe.transformer.register_to_config(**NABLA)
    check_shape(pipe, settings)
    message = (
        r"^--height 200: must be a multiple of 128 \(NABLA's 8 x 8 token neighbourhoods, VAE x8, patch x2\), e\.g\. "
    )
    with pytest.raises(ConfigError, match=message):
        check_shape(pipe, settings | {"height": 200})  # e.g. 128 or 256


def test_the_planner_never_picks_or_advises_a_ring_for_nabla():
    """The memory planner on Kandinsky 5.0 Video Lite 10 s (``kandinsky5-t2v-lite-10s``: the Lite transformer, 2B as
    published, with NABLA): GRPO on 8 GPUs that fit on no layout picks Ulysses alone (Ulysses 8, its 28 heads padded to
    32, as ``parallelize`` takes it) where the dense Lite takes ring 2 x Ulysses 4; generate's advice offers no ring
    where the dense model's does; a ring given is refused in one line, sampling and training."""
    from dit_sp.errors import ConfigError
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name, plan_training
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling
    from dit_sp.rl.config import TrainConfig

    nabla, dense = "kandinsky5-t2v-lite-10s", "kandinsky5-t2v-lite"
    assert architecture_name(f"/models/{nabla}") == nabla and architecture_name(f"/models/{dense}") == dense
    shape = TransformerShape.of(*ARCHITECTURES[nabla]["transformers"]["transformer"])
    assert abs(shape.params - 2e9) <= 0.05 * 2e9 and shape.heads == 28, shape
    config = TrainConfig.load("grpo_kandinsky5_t2v_lite")
    layouts = {arch: plan_training(config, 8, 1, arch=arch).layout for arch in (nabla, dense)}
    assert layouts == {nabla: {"dp": 1, "ring": 1, "ulysses": 8}, dense: {"dp": 1, "ring": 2, "ulysses": 4}}, layouts
    with pytest.raises(ConfigError, match="^ring 2: Kandinsky 5's NABLA sparse attention .* use ring 1$"):
        plan_training(config, 8, 80, arch=nabla, ring=2, ulysses=2)
    video = {"frames": 241, "height": 512, "width": 768, "ulysses": 2}
    advice = {arch: plan_sampling(SamplingSettings(arch, **video), 2, 12).advice for arch in (nabla, dense)}
    assert advice[nabla] and not any("--ring" in line for line in advice[nabla]), advice[nabla]
    assert any(line.startswith("--ring 2") for line in advice[dense]), advice[dense]
    with pytest.raises(ConfigError, match="^ring 2: Kandinsky 5's NABLA sparse attention .* use ring 1$"):
        plan_sampling(SamplingSettings(nabla, **video | {"ring": 2}), 4)
