"""DiffusionNFT (``algorithm: nft``): the loss's formula and gradient, its settings, and on the trainer the
one-process gradients on 1x2 and 2x1 and an exact resume on another layout."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from nft_checks import layouts_and_resume, nft_config
from train_runs import assert_grads_equal

from dit_sp import TrainConfig, spawn
from dit_sp.errors import ConfigError
from dit_sp.rl.nft_config import NFTConfig
from dit_sp.rl.nft_loss import nft_loss, optimality


def _inputs(seed: int = 0, batch: int = 3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, 2, 3, 4, generator=g, dtype=torch.float64) for _ in range(4))


@pytest.mark.parametrize("weighting", ["velocity", "adaptive"])
def test_nft_loss_is_the_formula_of_the_implicit_policies(weighting):
    """The loss equals ``mean_b [r D(v+) + (1-r) D(v-)] / beta`` written out by hand, for both weightings, with the
    KL term; its gradient equals autograd's of that expression."""
    v, v_old, x0, eps = _inputs()
    r, beta, sigma = torch.tensor([0.9, 0.2, 0.5], dtype=torch.float64), 0.3, 0.7
    v_ref = v_old + 0.1
    v1 = v.clone().requires_grad_(True)
    loss, stats = nft_loss(v1, v_old, x0, eps, sigma, r, beta=beta, weighting=weighting, v_ref=v_ref, kl_coef=0.5)
    loss.backward()

    v2 = v.clone().requires_grad_(True)
    x_s = (1 - sigma) * x0 + sigma * eps

    def distance(w):
        if weighting == "velocity":
            return ((w - (eps - x0)) ** 2).mean((1, 2, 3))
        error = (x_s - sigma * w) - x0  # the x0-prediction's error
        return (error**2).mean((1, 2, 3)) / error.detach().abs().mean((1, 2, 3))

    positive, negative = (1 - beta) * v_old + beta * v2, (1 + beta) * v_old - beta * v2
    expected = ((r * distance(positive) + (1 - r) * distance(negative)) / beta).mean()
    expected = expected + 0.5 * ((v2 - v_ref) ** 2).mean((1, 2, 3)).mean()
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(v1.grad, v2.grad, rtol=1e-10, atol=1e-14)
    assert stats.kl > 0 and stats.old_deviation == pytest.approx(((v - v_old) ** 2).mean().item())


def test_nft_gradient_at_the_old_policy_pulls_rewarded_samples_and_pushes_the_others():
    """At ``v = v_old`` the gradient is ``(2r - 1) dD/dv`` for every beta: r = 1 descends towards the flow-matching
    target of the sample, r = 0 ascends away from it, r = 1/2 gives nothing."""
    _, v_old, x0, eps = _inputs(1)
    r = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    for beta in (1.0, 0.1):
        v = v_old.clone().requires_grad_(True)
        nft_loss(v, v_old, x0, eps, 0.5, r, beta=beta, weighting="velocity")[0].backward()
        fm = 2 * (v_old - (eps - x0)) / v_old[0].numel() / 3  # d/dv of mean_b mean((v - u)^2)
        torch.testing.assert_close(v.grad, fm * (2 * r - 1).view(3, 1, 1, 1), rtol=1e-10, atol=1e-14)


def test_failed_rewards_are_masked_and_advantages_map_to_optimality():
    v, v_old, x0, eps = (t.float() for t in _inputs(2))
    v.requires_grad_(True)
    r = torch.tensor([0.7, float("nan"), 0.1])
    loss, stats = nft_loss(v, v_old, x0, eps, 0.4, r)
    loss.backward()
    assert stats.masked == 1 and torch.isfinite(loss) and (v.grad[1] == 0).all() and (v.grad[0] != 0).any()
    torch.testing.assert_close(optimality(torch.tensor([-9.0, -5.0, 0.0, 2.5, 7.0]), 5.0),
                               torch.tensor([0.0, 0.0, 0.5, 0.75, 1.0]))  # fmt: skip


def test_nft_settings_are_checked_and_the_old_decay_follows_the_paper():
    nft = NFTConfig()
    assert [nft.old_decay(u) for u in (0, 1, 100, 600, 5000)] == [0.0, 0.001, 0.1, 0.5, 0.5]
    assert NFTConfig(old_decay_flat=75, old_decay_rate=0.0075, old_decay_max=0.999).old_decay(70) == 0.0
    ok = {"algorithm": "nft", "grpo": {"same_noise_per_group": False}}
    assert TrainConfig.from_dict(ok).algorithm == "nft"
    refused = [
        ({"algorithm": "nft"}, "same_noise_per_group: false"),
        (ok | {"grpo": {"same_noise_per_group": False, "sde_window": [0, 2], "kl_coef": 0.1}},
         "no use for grpo.sde_window, grpo.kl_coef"),
        ({"nft": {"beta": 0.5}}, "algorithm is grpo"),
        (ok | {"nft": {"beta": 0}}, "beta must be > 0"),
        (ok | {"nft": {"old_decay_max": 1.0}}, "old_decay_max"),
        (ok | {"nft": {"bogus": 1}}, "bogus"),
        ({"algorithm": "ppo"}, "algorithm"),
    ]  # fmt: skip
    for values, message in refused:
        with pytest.raises(ConfigError, match=message):
            TrainConfig.from_dict(values)


def test_the_documented_toy_recipe_is_a_valid_nft_config():
    """docs/nft.md's YAML block, on top of grpo_toy, and its command line's settings, are the same NFT config."""
    doc = (Path(__file__).parents[2] / "docs" / "nft.md").read_text()
    block = yaml.safe_load(re.search(r"```yaml\n(.*?)```", doc, re.S).group(1))
    config = TrainConfig.load("grpo_toy", block)
    assert config.algorithm == "nft" and config.grpo.prompts_per_step == 8 and config.lora.rank == 8
    command = re.search(r"```bash\n(.*?)```", doc, re.S).group(1)
    flags = dict(item.split("=", 1) for item in re.findall(r"--set (\S+)", command))
    assert flags == {"algorithm": "nft", "grpo.same_noise_per_group": "false", "grpo.sde_window": "null",
                     "grpo.kl_coef": "0", "grpo.train_fraction": "0.2", "grpo.prompts_per_step": "8"}  # fmt: skip


@pytest.mark.slow  # spawns worker processes
def test_nft_gradients_on_1x2_and_2x1_equal_one_process_and_a_run_resumes_exactly_on_another_layout():
    """One process: step 0, a checkpoint, the gradients of step 1 (the old policy now lags the trained one), then
    steps 1 and 2. Two processes: the same gradients on ring 1 x ulysses 2 and ring 2 x ulysses 1 (1e-5), and the
    one-process run resumed from its checkpoint on ulysses 2 logs what the uninterrupted run logged."""
    cfg = nft_config(guidance=1.0, width=32, max_steps=3)
    single = spawn(layouts_and_resume, 1, args=([cfg], 3), timeout=300)[0]["layouts"][0]
    assert single["stats"]["old_deviation"] > 0 and single["rows"][0]["old_decay"] == 0.25
    layouts = [dataclasses.replace(cfg, ring=ring, ulysses=ulysses, output_dir=tempfile.mkdtemp(prefix="dit_sp_nft_"))
               for ring, ulysses in ((1, 2), (2, 1))]  # fmt: skip
    for result in spawn(layouts_and_resume, 2, args=(layouts, 1, dataclasses.replace(cfg, ulysses=2)), timeout=300):
        for layout, run in zip(layouts, result["layouts"]):
            what = f"{layout.ring}x{layout.ulysses} rank {run['rank']}"
            torch.testing.assert_close(run["rewards"], single["rewards"], atol=1e-6, rtol=0)
            assert_grads_equal(run["grads"], single["grads"], what)
            assert abs(run["stats"]["loss"] - single["stats"]["loss"]) <= 1e-5 * abs(single["stats"]["loss"])
        resumed, full = result["resumed"], single["rows"][1:]
        assert [r["step"] for r in resumed] == [1, 2]
        for a, b in zip(resumed, full):
            for key in ("loss", "reward_mean", "grad_norm", "old_deviation"):
                assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(b[key])), (key, a[key], b[key])
        assert full[0]["reward_mean"] != full[1]["reward_mean"] and full[1]["grad_norm"] > 0
