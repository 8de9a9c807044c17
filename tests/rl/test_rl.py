"""Rewards: the registry, failures and the model-based scores (CLIP, PickScore, aesthetic, VLM, HPS)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rewards_for_tests import as_open_clip, tiny_clip, tiny_qwen2_vl

from dit_sp.errors import ConfigError
from dit_sp.rl import (
    build_reward,
)


def test_reward_registry_and_failures():
    videos = torch.rand(3, 4, 3, 8, 8)
    prompts = ["a red circle", "a blue square", "a green triangle"]
    combined = build_reward({"brightness": 1.0, "tests.support.rewards_for_tests:red": 2.0})
    expected = videos.flatten(1).mean(1) + 2 * videos[:, :, 0].flatten(1).mean(1)
    torch.testing.assert_close(combined(videos, prompts), expected)
    partial = build_reward("tests.support.rewards_for_tests:fails_on_blue")(videos, prompts)
    assert torch.isnan(partial[1]) and torch.isfinite(partial[[0, 2]]).all()
    assert torch.isnan(build_reward("tests.support.rewards_for_tests:nan_reward")(videos, prompts)).all()
    with pytest.raises(ValueError, match="unknown reward 'shiny'.*brightness"):
        build_reward("shiny")
    with pytest.raises(ValueError, match="cannot import"):
        build_reward("tests.support.rewards_for_tests:missing")
    smooth = build_reward("temporal_smoothness")(videos, prompts)
    assert (smooth <= 0).all()
    assert (build_reward("saturation")(videos, prompts) >= 0).all()


def test_clip_score_from_a_local_tiny_checkpoint(tmp_path):
    tiny_clip(tmp_path)
    reward = build_reward([{"name": "clip_score", "path": str(tmp_path), "frames": 2}])
    videos = torch.rand(2, 3, 3, 20, 20)
    scores = reward(videos, ["a red circle", "a blue square"])
    assert scores.shape == (2,) and torch.isfinite(scores).all() and (scores.abs() <= 1).all()
    assert not torch.equal(scores, reward(videos, ["a green triangle", "a blue square"]))
    with pytest.raises(FileNotFoundError, match="holds no CLIP checkpoint"):
        build_reward([{"name": "clip_score", "path": str(tmp_path / "nope")}])


def test_pickscore_and_aesthetic_head_from_tiny_local_checkpoints(tmp_path):
    from dit_sp.rl.rewards import ClipScore

    tiny_clip(tmp_path)
    videos, prompts = torch.rand(3, 5, 3, 20, 20), ["a red circle", "a blue square", "a green triangle"]
    clip = ClipScore(str(tmp_path), frames=3)
    frames, text = clip.frame_embeddings(videos), clip.text_embeddings(prompts)
    pick = build_reward([{"name": "pickscore", "path": str(tmp_path), "frames": 3}])
    expected = clip.model.logit_scale.exp() * (frames * text.unsqueeze(1)).sum(-1).mean(1)
    torch.testing.assert_close(pick(videos, prompts), expected.detach())
    torch.manual_seed(1)
    head = {"layers.0.weight": torch.randn(16, 8), "layers.0.bias": torch.randn(16),
            "layers.2.weight": torch.randn(1, 16), "layers.2.bias": torch.randn(1)}  # fmt: skip
    torch.save(head, tmp_path / "head.pth")
    aesthetic = build_reward([{"name": "aesthetic", "path": str(tmp_path), "head": str(tmp_path / "head.pth"),
                               "frames": 3}])  # fmt: skip
    manual = F.linear(F.linear(frames, head["layers.0.weight"], head["layers.0.bias"]), head["layers.2.weight"],
                      head["layers.2.bias"]).squeeze(-1).mean(1)  # fmt: skip
    torch.testing.assert_close(aesthetic(videos, prompts), manual.detach())
    torch.save({"layers.0.weight": torch.randn(4, 12), "layers.0.bias": torch.randn(4)}, tmp_path / "other.pth")
    with pytest.raises(ConfigError, match="12-dim features, the CLIP model gives 8"):
        build_reward([{"name": "aesthetic", "path": str(tmp_path), "head": str(tmp_path / "other.pth")}])
    with pytest.raises(FileNotFoundError, match="head"):
        build_reward([{"name": "aesthetic", "path": str(tmp_path), "head": str(tmp_path / "none.pth")}])


def test_vlm_score_rates_videos_with_a_tiny_local_qwen2_vl(tmp_path):
    tiny_qwen2_vl(tmp_path)
    reward = build_reward([{"name": "vlm_score", "path": str(tmp_path), "frames": 2}])
    videos = torch.rand(2, 3, 3, 32, 32)
    scores = reward(videos, ["a red circle", "a blue square"])
    assert scores.shape == (2,) and ((scores > 1) & (scores < 5)).all()  # an expected rating on 1..5
    assert torch.equal(scores, reward(videos, ["a red circle", "a blue square"]))  # deterministic
    assert not torch.equal(scores, reward(videos, ["a blue square", "a red circle"]))  # it reads the prompt
    assert not torch.equal(scores, reward(videos.flip(-1), ["a red circle", "a blue square"]))  # and the frames
    with pytest.raises(ConfigError, match="no single token"):
        build_reward([{"name": "vlm_score", "path": str(tmp_path), "scale": ["1", "10"]}])


def test_hps_loads_an_open_clip_checkpoint_into_the_clip_architecture(tmp_path):
    """An open_clip-format checkpoint (what HPSv2 ships) of one tiny CLIP, loaded into the architecture
    directory of another, scores exactly as the first: per-frame text-image cosine, averaged."""
    from transformers import CLIPModel

    from dit_sp.rl.rewards import ClipScore

    tiny_clip(tmp_path / "arch")
    tiny_clip(tmp_path / "trained")
    trained = CLIPModel.from_pretrained(tmp_path / "trained")
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.1 * torch.randn_like(p))  # other weights than the architecture directory's
    trained.save_pretrained(tmp_path / "trained")
    torch.save({"state_dict": {"module." + k: v for k, v in as_open_clip(trained.state_dict()).items()}},
               tmp_path / "hps.pt")  # fmt: skip
    videos, prompts = torch.rand(2, 4, 3, 20, 20), ["a red circle", "a blue square"]
    hps = build_reward([{"name": "hps", "path": str(tmp_path / "arch"), "weights": str(tmp_path / "hps.pt"),
                         "frames": 3}])  # fmt: skip
    reference = ClipScore(str(tmp_path / "trained"), frames=3)
    expected = (reference.frame_embeddings(videos) * reference.text_embeddings(prompts).unsqueeze(1)).sum(-1).mean(1)
    torch.testing.assert_close(hps(videos, prompts), expected.detach(), atol=1e-5, rtol=0)
    untouched = ClipScore(str(tmp_path / "arch"), frames=3)
    assert not torch.allclose(untouched.frame_embeddings(videos), reference.frame_embeddings(videos))
    torch.save({"visual.extra.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="unknown keys"):
        build_reward([{"name": "hps", "path": str(tmp_path / "arch"), "weights": str(tmp_path / "bad.pt")}])
