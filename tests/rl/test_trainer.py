"""The GRPO trainer: layouts give the single-process gradients, the run resumes exactly, exports load."""

from __future__ import annotations

import sys

import pytest
import torch
from cli_run import run_python
from grpo_checks import each_moved_window_gradients, evaluation, moved_window_gradients, step_gradients, tiny_config
from train_runs import assert_grads_equal, train_cmd

from dit_sp import spawn

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLIs end to end


@pytest.fixture(scope="module")
def single():
    return spawn(step_gradients, 1, args=(tiny_config(),), timeout=300)[0]


def test_on_policy_ratio_is_exactly_one(single):
    assert single["ratio_min"] == 1.0 and single["ratio_max"] == 1.0
    # The sharded transformer's output owns its storage, so FSDP has nothing to warn about (an in-place op
    # on a view output would silently drop its backward all-gather).
    assert not [w for w in single["warnings"] if "view tensor" in w], single["warnings"]
    assert max(g.abs().max().item() for g in single["grads"].values()) > 0  # a real gradient


@pytest.mark.parametrize(("world", "ring", "ulysses"), [(2, 1, 2), (2, 2, 1), (4, 2, 2)])
def test_sequence_parallel_step_equals_single_process(single, world, ring, ulysses):
    results = spawn(step_gradients, world, args=(tiny_config(ring=ring, ulysses=ulysses),), timeout=300)
    for result in results:  # every rank holds the same rewards and, after FSDP, the same full gradient
        torch.testing.assert_close(result["rewards"], single["rewards"], atol=1e-6, rtol=0)
        assert_grads_equal(result["grads"], single["grads"], f"rank {result['rank']}")


def test_sliding_window_step_equals_single_process_on_1x2_and_2x1():
    """MixGRPO's sliding window at iteration 3 (moved to steps [1, 3) of 4): stochastic and trained only
    there, exactly on-policy, and the same gradients on every layout."""
    window = {"grpo.sliding_window": {"size": 2, "every": 2, "stride": 1}, "steps": 4}
    single = spawn(moved_window_gradients, 1, args=(tiny_config(**window), 3), timeout=300)[0]
    assert single["window"] == (1, 3) and single["trained"] == 2 and single["ratio"] == (1.0, 1.0)
    log_probs = single["log_probs"]
    assert (log_probs[[0, 3]] == 0).all() and (log_probs[1:3] != 0).all()
    for ring, ulysses in ((1, 2), (2, 1)):
        results = spawn(moved_window_gradients, 2, args=(tiny_config(ring=ring, ulysses=ulysses, **window), 3),
                        timeout=300)  # fmt: skip
        for result in results:
            assert result["window"] == (1, 3) and result["ratio"] == (1.0, 1.0)
            assert_grads_equal(result["grads"], single["grads"], f"{ring}x{ulysses} rank")


def test_branched_rollouts_are_on_policy_and_give_the_plain_gradients_on_every_layout():
    """Groups of 4 share the ODE step before the SDE window [1, 3) and the velocity at step 1: exactly on-policy,
    the unbranched step's gradients, and the one-process gradients on 1x2, 2x1 and dp 2."""
    settings = {"grpo.sde_window": [1, 3], "steps": 4, "group_size": 4, "prompts_per_step": 1}
    configs = [tiny_config(**settings), tiny_config(**settings, **{"grpo.branch": True})]
    plain, branched = spawn(each_moved_window_gradients, 1, args=(configs, 0), timeout=300)[0]
    assert branched["ratio"] == (1.0, 1.0) and branched["window"] == (1, 3)
    # 4 samples x 2 guidance branches: rollout 4 steps, training steps 1 and 2; branched, steps 0 and 1 once
    assert plain["forwards"] == 8 * 4 + 8 * 2 and branched["forwards"] == 2 + 2 + 8 * 2 + 2 + 8
    torch.testing.assert_close(branched["log_probs"], plain["log_probs"], atol=1e-5, rtol=0)
    assert_grads_equal(branched["grads"], plain["grads"], "branched vs plain")
    for layout in ({"ulysses": 2}, {"ring": 2}, {"dp": 2}):
        results = spawn(moved_window_gradients, 2, args=(tiny_config(**settings, **layout, **{"grpo.branch": True}), 0),
                        timeout=300)  # fmt: skip
        for result in results:
            assert result["ratio"] == (1.0, 1.0)
            assert_grads_equal(result["grads"], branched["grads"], f"{layout} rank")


def test_coarse_ode_tail_is_on_policy_cheaper_and_the_same_on_every_layout():
    """grpo.tail_steps: the ODE steps after the SDE window [0, 2) of 5 re-spaced into 1. The window's steps
    keep their noise levels, the step is exactly on-policy and the gradients are one process's on 1x2 and 2x1;
    branched, the branch step and its KL reference run once per group."""
    settings = {"grpo.sde_window": [0, 2], "steps": 5, "group_size": 4, "prompts_per_step": 1,
                "grpo.tail_steps": 1, "grpo.kl_coef": 0.1}  # fmt: skip
    configs = [tiny_config(**settings), tiny_config(**settings, **{"grpo.branch": True})]
    single, branched = spawn(each_moved_window_gradients, 1, args=(configs, 0), timeout=300)[0]
    assert single["ratio"] == (1.0, 1.0) and single["trained"] == 2
    assert single["log_probs"].shape[0] == 3  # 2 window steps + 1 tail step
    # 4 samples x 2 guidance branches: rollout 3 steps; training 2 steps, each with its reference
    assert single["forwards"] == 8 * 3 + 8 * 2 * 2
    for layout in ({"ulysses": 2}, {"ring": 2}):
        for result in spawn(moved_window_gradients, 2, args=(tiny_config(**settings, **layout), 0), timeout=300):
            assert result["ratio"] == (1.0, 1.0)
            assert_grads_equal(result["grads"], single["grads"], f"{layout} rank")
    assert branched["ratio"] == (1.0, 1.0)
    assert branched["forwards"] == (2 + 8 + 8) + (2 + 2) + (8 + 8)  # rollout; step 0 once per group; step 1
    assert_grads_equal(branched["grads"], single["grads"], "branched vs plain")


THREE_SAMPLES = {"group_size": 3, "prompts_per_step": 1}


@pytest.fixture(scope="module")
def three_samples():
    """The one-process step of a batch of 3 samples (one prompt's group of 3)."""
    return spawn(step_gradients, 1, args=(tiny_config(**THREE_SAMPLES),), timeout=300)[0]


@pytest.mark.parametrize("layout", [{"ulysses": 2}, {"ring": 2}], ids=["1x2", "2x1"])
@pytest.mark.parametrize("batch", [{}, THREE_SAMPLES], ids=["4 samples", "3 samples"])
def test_decode_split_by_samples_equals_one_process(single, three_samples, layout, batch):
    """vae_split: samples: every SP rank decodes whole videos, its share of the batch (4 samples as 2 + 2; 3
    as 2 + 2, the second rank's last a repeat that is dropped); rewards and gradients are one process's."""
    reference = three_samples if batch else single
    for result in spawn(step_gradients, 2, args=(tiny_config(vae_split="samples", **layout, **batch),), timeout=300):
        torch.testing.assert_close(result["rewards"], reference["rewards"], atol=1e-6, rtol=0)
        assert_grads_equal(result["grads"], reference["grads"], f"rank {result['rank']}")


@pytest.mark.parametrize(
    "settings",
    [{"vae_batch": 1}, {"micro_batch": 3, "grpo.overlap_rewards": True}, {"vae_batch": 2, "vae_split": "rows"}],
    ids=["chunks of 1", "overlapped in micro-batches of 3", "rows split in chunks of 2"],
)
def test_decode_in_chunks_and_overlapped_shares_equal_one_process(single, settings):
    """vae_batch decodes a few videos per VAE call, whatever the micro-batch; with overlap_rewards each
    micro-batch (3 + 1 samples) is decoded and its shares scored by their SP ranks while the next samples.
    The rewards and gradients are still one process's on 1x2."""
    reference = single
    config = tiny_config(ulysses=2, **({"vae_split": "samples"} | settings))
    for result in spawn(step_gradients, 2, args=(config,), timeout=300):
        torch.testing.assert_close(result["rewards"], reference["rewards"], atol=1e-6, rtol=0)
        assert_grads_equal(result["grads"], reference["grads"], f"rank {result['rank']}")


def test_reward_models_score_the_same_on_every_layout(tmp_path):
    """CLIP-family and vision-language reward models from tiny local checkpoints: the rollouts' rewards on
    1x2 and 2x1 are the one-process rewards (the videos are scored once per sample, on its first SP rank,
    then shared)."""
    from rewards_for_tests import tiny_clip, tiny_qwen2_vl

    tiny_clip(tmp_path)
    tiny_qwen2_vl(tmp_path / "vlm")
    torch.save({"layers.0.weight": torch.randn(1, 8), "layers.0.bias": torch.zeros(1)}, tmp_path / "head.pth")
    head = str(tmp_path / "head.pth")
    reward = [{"name": "pickscore", "path": str(tmp_path), "frames": 2},
              {"name": "aesthetic", "path": str(tmp_path), "head": head, "weight": 0.5},
              {"name": "vlm_score", "path": str(tmp_path / "vlm"), "frames": 2, "weight": 0.1}]  # fmt: skip
    single = spawn(step_gradients, 1, args=(tiny_config(reward=reward),), timeout=300)[0]
    assert torch.isfinite(single["rewards"]).all() and single["rewards"].std() > 0
    for layout in ({"ulysses": 2}, {"ring": 2}):
        for result in spawn(step_gradients, 2, args=(tiny_config(reward=reward, **layout),), timeout=300):
            torch.testing.assert_close(result["rewards"], single["rewards"], atol=1e-4, rtol=0)


def test_ratio_normalised_step_is_on_policy_with_the_plain_gradients(single):
    """With grpo.ratio_norm the first step is still exactly on-policy and, the means not having moved, its
    gradients are the plain step's, in one process and on 1x2."""
    normed = {"grpo.ratio_norm": True}
    one = spawn(step_gradients, 1, args=(tiny_config(**normed),), timeout=300)
    two = spawn(step_gradients, 2, args=(tiny_config(ulysses=2, **normed),), timeout=300)
    for result in one + two:
        assert result["ratio_min"] == 1.0 and result["ratio_max"] == 1.0
        assert_grads_equal(result["grads"], single["grads"], "ratio-normalised")


@pytest.mark.parametrize("layout", [{"ulysses": 2}, {"dp": 2}], ids=["1x2", "dp2"])
def test_micro_batched_step_equals_the_one_batch_step(layout):
    """Rollouts and training one sample per forward (gradients accumulated) give the one-batch step."""
    whole = spawn(step_gradients, 2, args=(tiny_config(**layout),), timeout=300)
    micro = spawn(step_gradients, 2, args=(tiny_config(micro_batch=1, **layout),), timeout=300)
    for a, b in zip(micro, whole):
        assert a["ratio_min"] == 1.0 and a["ratio_max"] == 1.0  # still exactly on-policy
        torch.testing.assert_close(a["rewards"], b["rewards"], atol=1e-6, rtol=0)
        assert_grads_equal(a["grads"], b["grads"], f"micro-batched rank {a['rank']}")


def test_data_parallel_fsdp_step_equals_single_process(single):
    """dp=2: each rank rolls out one prompt's group; the FSDP2 step equals one process doing both."""
    results = spawn(step_gradients, 2, args=(tiny_config(dp=2),), timeout=300)
    assert [r["prompt_ids"].unique().numel() for r in results] == [1, 1]
    torch.testing.assert_close(torch.cat([r["rewards"] for r in results]), single["rewards"], atol=1e-6, rtol=0)
    for result in results:
        assert_grads_equal(result["grads"], single["grads"], f"rank {result['rank']}")


@pytest.fixture(scope="module")
def one_process_evaluation(tmp_path_factory):
    """The held-out evaluation in one process: (its report, the video it wrote)."""
    video = tmp_path_factory.mktemp("evaluation") / "one.mp4"
    return spawn(evaluation, 1, args=(tiny_config(), str(video)), timeout=300)[0], video


@pytest.mark.parametrize("split", ["rows", "samples", None], ids=["rows split", "samples split", "one process decodes"])
def test_evaluation_on_ulysses_2_equals_one_process(one_process_evaluation, tmp_path, split):
    """Held-out evaluation decodes its ODE samples split over the SP ranks (or on rank 0 alone): the reward and
    the written video are those of one process."""
    import imageio.v3 as iio

    one, one_video = one_process_evaluation
    cfg = tiny_config(ulysses=2, parallel_vae=split is not None, vae_split=split or "rows")
    two = spawn(evaluation, 2, args=(cfg, str(tmp_path / "two.mp4")), timeout=300)
    assert 0 < one["reward"] < 1
    for result in two:
        assert abs(result["reward"] - one["reward"]) < 1e-5, (result, one)
    # the frames agree to ~1e-6, which flips a few 8-bit levels by one; H.264 (ffmpeg 9's x264 in imageio-ffmpeg
    # 0.8.1) spreads such a flip over its block (up to 6 levels measured), so the file is compared on average too
    difference = abs(iio.imread(tmp_path / "two.mp4").astype(int) - iio.imread(one_video).astype(int))
    assert difference.mean() < 0.1 and difference.max() <= 16, (difference.mean(), difference.max())


def test_wandb_offline_run_gets_the_metrics_and_the_eval_videos(tmp_path):
    out = tmp_path / "run"
    run_python(train_cmd(out, "--max-steps", "2", "--eval-every", "1", "--set", "wandb={mode: offline, name: t}"),
               check=True, timeout=600)  # fmt: skip
    (run,) = (out / "wandb").glob("offline-run-*")
    records = next(run.glob("run-*.wandb")).read_bytes()
    for key in (b"reward_mean", b"grad_norm", b"eval_reward", b"seconds/sample", b"eval/video"):
        assert key in records, key
    assert len(list((run / "files" / "media" / "videos").rglob("*.mp4"))) == 2  # one per evaluation
    assert (out / "wandb_run_id").read_text() in run.name  # a resumed run continues this one


def test_run_errors(tmp_path):
    def error(*overrides: str) -> str:
        cmd = train_cmd(tmp_path / "out", "--max-steps", "1", *overrides)
        result = run_python(cmd, timeout=300)
        assert result.returncode != 0
        return result.stderr

    assert "prompt file" in error("--prompts", str(tmp_path / "none.txt"))
    assert "cannot be split evenly over dp=3" in error("--dp", "3")
    reward = tmp_path / "r.yaml"
    reward.write_text("reward: shiny\nprompts: prompts_demo.txt\n")
    cmd = [sys.executable, "-m", "pipelines.train_grpo", "--config", str(reward), "--max-steps", "1",
           "--output-dir", str(tmp_path / "o")]  # fmt: skip
    result = run_python(cmd, timeout=300)
    assert "unknown reward 'shiny'" in result.stderr


@pytest.mark.parametrize(
    ("world", "overrides"),
    [
        (2, {"ulysses": 2, "activation_checkpointing": True}),  # recomputed blocks must not re-split
        (4, {"ulysses": 2, "dp": 2, "hsdp": True}),  # HSDP: shard over SP, replicate over dp
    ],
)
def test_checkpointing_and_hsdp_steps_equal_single_process(single, world, overrides):
    results = spawn(step_gradients, world, args=(tiny_config(**overrides),), timeout=300)
    for result in results:
        assert_grads_equal(result["grads"], single["grads"], f"rank {result['rank']}")


@pytest.mark.parametrize(("ring", "ulysses"), [(1, 2), (2, 1)])
def test_full_fine_tuning_kl_step_equals_single_process(ring, ulysses):
    """Full fine-tuning with a KL term to a frozen sharded copy of the initial weights (built on the meta
    device, filled shard by shard): with moved weights the KL is positive and every layout gives the
    single-process gradient."""
    one = spawn(step_gradients, 1, args=(tiny_config(kl_coef=1.0), 1e-3), timeout=300)[0]
    assert one["kl"] > 1e-8
    if ulysses == 2:  # unmoved, the copy is exact: the policy is its reference
        unmoved = spawn(step_gradients, 2, args=(tiny_config(ulysses=2, kl_coef=1.0),), timeout=300)
        assert [r["kl"] for r in unmoved] == [0.0, 0.0]
    results = spawn(step_gradients, 2, args=(tiny_config(ring=ring, ulysses=ulysses, kl_coef=1.0), 1e-3), timeout=300)
    for result in results:
        assert abs(result["kl"] - one["kl"]) <= 1e-6 * max(1.0, one["kl"])
        assert_grads_equal(result["grads"], one["grads"], f"rank {result['rank']}")


@pytest.fixture(scope="module")
def guidance_distilled_hunyuan(tmp_path_factory) -> str:
    """The tiny HunyuanVideo pipeline with an embedded-guidance input, as the real (distilled) model has."""
    from diffusers import HunyuanVideoTransformer3DModel

    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-hunyuanvideo")
    torch.manual_seed(0)
    pipe.transformer = HunyuanVideoTransformer3DModel(**{**pipe.transformer.config, "guidance_embeds": True})
    path = tmp_path_factory.mktemp("hunyuan") / "pipe"
    pipe.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(("ring", "ulysses"), [(1, 2), (2, 1)])
def test_hunyuan_video_step_equals_single_process(guidance_distilled_hunyuan, ring, ulysses):
    """HunyuanVideo (joint text-video attention, masked text, 3 heads over 2 ranks, embedded and true CFG)."""
    settings = {"model": guidance_distilled_hunyuan, "embedded_guidance": 6.0, "width": 32}
    one = spawn(step_gradients, 1, args=(tiny_config(**settings),), timeout=300)[0]
    assert one["ratio_min"] == 1.0 and one["ratio_max"] == 1.0
    assert any("guidance_embedder" in name for name in one["grads"])  # the embedded guidance reaches the model
    results = spawn(step_gradients, 2, args=(tiny_config(ring=ring, ulysses=ulysses, **settings),), timeout=300)
    for result in results:
        torch.testing.assert_close(result["rewards"], one["rewards"], atol=1e-6, rtol=0)
        assert_grads_equal(result["grads"], one["grads"], f"rank {result['rank']}")


def test_embedded_guidance_is_refused_for_wan():
    with pytest.raises(Exception, match="embedded_guidance is a HunyuanVideo setting"):
        spawn(step_gradients, 1, args=(tiny_config(embedded_guidance=6.0),), timeout=300)


def test_policy_settings_are_checked_against_the_model():
    """Bad sizes and guidance settings fail when the policy is built, before the model is sharded."""
    from dit_sp.families.hunyuan_video import HunyuanVideoPolicy
    from dit_sp.families.wan import WanPolicy
    from dit_sp.zoo import build_tiny

    wan, hunyuan = build_tiny("tiny-wan"), build_tiny("tiny-hunyuanvideo")
    size = {"frames": 5, "height": 32, "width": 32, "guidance": 1.0}
    with pytest.raises(ValueError, match=r"^frames 6: the VAE needs 4\*k\+1 frames"):
        WanPolicy(wan, wan.transformer, **(size | {"frames": 6}))
    with pytest.raises(ValueError, match="^width 40: must be a multiple of 16"):
        HunyuanVideoPolicy(hunyuan, hunyuan.transformer, **(size | {"width": 40}))
    with pytest.raises(ValueError, match="this HunyuanVideo transformer takes no guidance input"):
        HunyuanVideoPolicy(hunyuan, hunyuan.transformer, embedded_guidance=6.0, **size)
    assert HunyuanVideoPolicy(hunyuan, hunyuan.transformer, **size).embedded_guidance is None
    assert WanPolicy(wan, wan.transformer, **size).latent_shape() == (4, 2, 4, 4)
