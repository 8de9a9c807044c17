"""The GRPO loss: on-policy value, clipping, the KL term and masked samples."""

from __future__ import annotations

import pytest
import torch

from dit_sp.rl import (
    grpo_loss,
    kl_to_reference,
)


def test_grpo_loss_on_policy_and_clipping():
    adv = torch.tensor([1.0, -2.0])
    log_prob = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, stats = grpo_loss(log_prob, log_prob.detach(), adv, clip_range=0.1)
    assert stats.ratio_mean == 1.0 and stats.clip_fraction == 0.0
    assert loss.item() == pytest.approx(0.5)  # -mean(A)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -adv / 2)  # push up positive advantage
    moved = torch.tensor([-0.5, -2.0], requires_grad=True)  # ratio e^0.5 on a positive advantage: clipped
    loss, stats = grpo_loss(moved, torch.tensor([-1.0, -2.0]), adv, clip_range=0.1)
    loss.backward()
    assert stats.clip_fraction == 0.5 and moved.grad[0] == 0
    kl = kl_to_reference(torch.ones(2, 3), torch.zeros(2, 3), std=0.5)
    torch.testing.assert_close(kl, torch.tensor([2.0, 2.0]))


def test_grpo_loss_masks_failed_samples_without_nan_gradients():
    """A failed reward (NaN advantage) or a NaN sampled log-probability leaves the sample out: the loss and
    the gradient are those of the other samples (over the same B), finite."""
    log_prob = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    old = torch.tensor([-1.1, float("nan"), -2.9])
    adv = torch.tensor([1.0, 2.0, float("nan")])
    kl = torch.tensor([0.1, 0.2, 0.3])
    loss, stats = grpo_loss(log_prob, old, adv, clip_range=0.5, kl=kl, kl_coef=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_prob.grad).all() and stats.masked == 2
    alone = torch.tensor([-1.0], requires_grad=True)
    expected, _ = grpo_loss(alone, old[:1], adv[:1], clip_range=0.5, kl=kl[:1], kl_coef=1.0)
    (expected / 3).backward()  # the same sample alone, averaged over the batch of 3
    torch.testing.assert_close(loss, expected / 3)
    torch.testing.assert_close(log_prob.grad, torch.cat([alone.grad, torch.zeros(2)]))
