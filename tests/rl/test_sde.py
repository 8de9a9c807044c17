"""SDE steps and log-probabilities, trajectories (windows, branching) and ratio normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from dit_sp.rl import (
    SDEConfig,
    gaussian_log_prob,
    sample_trajectory,
    sde_mean_std,
    sde_step,
    shifted_sigmas,
)
from dit_sp.rl.rollout import branched_trajectory, representatives
from dit_sp.rl.update import drift_free_log_prob


def _velocity(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.sin(3 * x) * (1 + s)  # any smooth field


@pytest.mark.parametrize("config", [SDEConfig("ode"), SDEConfig("dance", eta=0.0), SDEConfig("flow", a=0.0)])
def test_zero_noise_is_the_euler_ode_sampler(config):
    """Noise 0 reproduces diffusers' FlowMatchEulerDiscreteScheduler exactly."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    sigmas = shifted_sigmas(6, shift=3.0)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(6)
    torch.testing.assert_close(torch.tensor(sigmas, dtype=torch.float32), scheduler.sigmas, atol=1e-6, rtol=0)
    noise = torch.randn(2, 4, 3, 5, generator=torch.Generator().manual_seed(0))
    ours = sample_trajectory(_velocity, noise, sigmas, config, generator=None).final
    x = noise.clone()
    for t in scheduler.timesteps:
        x = scheduler.step(_velocity(x, float(t) / 1000), t, x).prev_sample
    torch.testing.assert_close(ours, x, atol=1e-5, rtol=1e-5)


def test_log_prob_is_the_mean_gaussian_density():
    x, mean = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    expected = torch.distributions.Normal(mean, 0.2).log_prob(x).flatten(1).mean(1)
    torch.testing.assert_close(gaussian_log_prob(x, mean, 0.2), expected)
    with pytest.raises(ValueError, match="no log-probability"):
        gaussian_log_prob(x, mean, 0.0)


@pytest.mark.parametrize("kind", ["dance", "flow"])
def test_sde_noise_levels_and_recomputed_log_prob(kind):
    config = SDEConfig(kind, eta=0.3, a=0.7)
    x, v = torch.randn(2, 8), torch.randn(2, 8)
    mean, std = sde_mean_std(x, v, 0.6, 0.4, config, s_cap=0.9)
    g = 0.3 if kind == "dance" else 0.7 * math.sqrt(0.6 / 0.4)
    assert std == pytest.approx(g * math.sqrt(0.2))
    torch.testing.assert_close(mean, x - 0.2 * (v + g * g / 1.2 * (x + 0.4 * v)))
    sampled = sde_step(x, v, 0.6, 0.4, config, s_cap=0.9, generator=torch.Generator().manual_seed(1))
    again = sde_step(x, v, 0.6, 0.4, config, s_cap=0.9, x_next=sampled.x_next)
    torch.testing.assert_close(sampled.log_prob, again.log_prob)
    torch.testing.assert_close(again.mean, mean)
    noise = (sampled.x_next - mean) / std  # the same step from explicit noise gives the same sample
    torch.testing.assert_close(sde_step(x, v, 0.6, 0.4, config, s_cap=0.9, noise=noise).x_next, sampled.x_next)
    # The first step from s=1 stays finite for Flow-GRPO thanks to the cap.
    assert math.isfinite(sde_mean_std(x, v, 1.0, 0.9, config, s_cap=0.9)[1])


def test_trajectory_log_probs_recompute_exactly():
    """The on-policy check: recomputing each transition with the same model gives ratio exactly 1."""
    sigmas = shifted_sigmas(4, 2.0)
    config = SDEConfig("flow")
    traj = sample_trajectory(_velocity, torch.randn(2, 6), sigmas, config, torch.Generator().manual_seed(0))
    for t in range(4):
        step = traj.transition(t, _velocity(traj.latents[t], traj.sigmas[t]), config)
        assert torch.equal(step.log_prob, traj.log_probs[t])


def test_sde_window_is_stochastic_only_inside():
    """An SDE window: ODE steps outside (identical across noise draws, log-prob 0), SDE steps inside."""
    sigmas, config, noise = shifted_sigmas(6, 2.0), SDEConfig("flow"), torch.randn(2, 6)
    ode = sample_trajectory(_velocity, noise, sigmas, SDEConfig("ode"))
    window = range(2, 4)
    runs = [sample_trajectory(_velocity, noise, sigmas, config, torch.Generator().manual_seed(seed), sde_steps=window)
            for seed in (0, 1)]  # fmt: skip
    for traj in runs:
        assert torch.equal(traj.latents[:3], ode.latents[:3])  # steps 0 and 1: the ODE
        assert (traj.log_probs[[0, 1, 4, 5]] == 0).all() and (traj.log_probs[2:4] != 0).all()
        for t in (2, 3):
            step = traj.transition(t, _velocity(traj.latents[t], traj.sigmas[t]), config)
            assert torch.equal(step.log_prob, traj.log_probs[t])
    assert not torch.allclose(runs[0].latents[3], runs[1].latents[3])  # the window's noise
    assert not torch.allclose(runs[0].final, runs[1].final)


def test_branched_trajectory_shares_the_start_of_each_group_and_equals_the_plain_one():
    """Two groups of three (same initial noise within a group): the ODE step before the window and the velocity
    at its first step run once per group, the samples then branch; the trajectory is the plain one."""
    sigmas, config = shifted_sigmas(5, 2.0), SDEConfig("flow")
    keys = torch.tensor([7, 7, 7, 9, 9, 9])
    noise = torch.randn(2, 8)[torch.tensor([0, 0, 0, 1, 1, 1])]
    step_noise = torch.randn(5, 6, 8)
    calls = []

    def velocity(x, s, index=None):
        calls.append(x.shape[0])
        return _velocity(x, s)

    window = range(1, 3)
    plain = sample_trajectory(velocity, noise, sigmas, config, step_noise=step_noise, sde_steps=window)
    plain_calls, calls[:] = sum(calls), []
    branched = branched_trajectory(velocity, noise, sigmas, config, keys, step_noise=step_noise, sde_steps=window)
    assert calls == [2, 2, 6, 6, 6] and plain_calls == 30  # steps 0 and 1 once per group, then every sample
    torch.testing.assert_close(branched.latents, plain.latents, atol=1e-6, rtol=0)
    torch.testing.assert_close(branched.log_probs, plain.log_probs, atol=1e-6, rtol=0)
    assert branched.window == (1, 3) and branched.branch_step == 1 and torch.equal(branched.branch_keys, keys)
    assert not torch.equal(branched.latents[2, 0], branched.latents[2, 1])  # branched at step 1
    first, inverse = representatives(torch.tensor([5, 3, 5, 3, 8]))
    assert first.tolist() == [1, 0, 4] and inverse.tolist() == [1, 0, 1, 0, 2]


def test_ratio_normalisation_removes_the_drift_below_one_and_keeps_the_on_policy_ratio():
    """Sampled from the old policy, the plain log-ratio of a moved mean averages -mean(d^2)/(2 std^2) < 0 (every
    step's ratio drifts below 1, so clipping is lopsided); without that term it averages 0, and where the mean
    has not moved it is exactly the log-probability, with the same gradient."""
    sigmas, config = shifted_sigmas(4, 2.0), SDEConfig("flow")
    x = torch.randn(20000, 16, dtype=torch.float64)
    v_old = torch.sin(3 * x)
    old = sde_step(x, v_old, sigmas[1], sigmas[2], config, s_cap=sigmas[1], generator=torch.Generator().manual_seed(0))
    v_new = (v_old + 0.3).requires_grad_()
    new = sde_step(x, v_new, sigmas[1], sigmas[2], config, s_cap=sigmas[1], x_next=old.x_next)
    plain, centred = new.log_prob - old.log_prob, drift_free_log_prob(new, old.mean) - old.log_prob
    drift = ((new.mean - old.mean) ** 2).flatten(1).mean(1) / (2 * new.std**2)
    assert plain.mean() < -0.5 * drift.mean() < 0 and abs(centred.mean()) < 0.1 * drift.mean()
    same = sde_step(x, v_old.clone().requires_grad_(), sigmas[1], sigmas[2], config, s_cap=sigmas[1],
                    x_next=old.x_next)  # fmt: skip
    assert torch.equal(drift_free_log_prob(same, old.mean), same.log_prob)  # on-policy: ratio exactly 1


def test_bad_steps_and_configs_are_clear_errors():
    with pytest.raises(ValueError, match="0 <= s' < s <= 1"):
        sde_mean_std(torch.zeros(1, 1), torch.zeros(1, 1), 0.3, 0.5, SDEConfig(), 1.0)
    with pytest.raises(ValueError, match="'dance', 'flow', 'cps' or 'ode'"):
        SDEConfig("sde")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        shifted_sigmas(0)
