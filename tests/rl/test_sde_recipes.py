"""Flow-GRPO's sampling recipes: the CPS step, Wan's noise schedule, Flow-GRPO-Fast's random SDE window, and
the KL weight in Flow-GRPO's units. Each is checked against its own formula, derived here independently."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dit_sp.errors import ConfigError
from dit_sp.parallel.state import single_process_state
from dit_sp.rl import SDEConfig, sample_trajectory, sde_step
from dit_sp.rl.batch import make_batch, rollout_sigmas, sde_window_at, stochastic_steps, trained_steps
from dit_sp.rl.config import TrainConfig
from dit_sp.rl.grpo_config import GRPOConfig, RandomWindow
from dit_sp.rl.schedule import schedule_sigmas, wan_sigmas
from dit_sp.rl.update import accumulate_gradients


def test_cps_step_preserves_the_coefficients_and_its_log_prob_is_the_gaussian_density():
    """With a perfect velocity (``v = eps - x0`` at ``x = (1-s) x0 + s eps``), the CPS step lands exactly on
    level ``s'``: ``x' = (1-s') x0 + s' (cos(a pi/2) eps + sin(a pi/2) z)``, whose noise has variance ``s'^2``.
    The log-probability is the Gaussian density of that (not Flow-GRPO's ``-mean((x'-m)^2)``)."""
    g = torch.Generator().manual_seed(0)
    x0, eps, z = (torch.randn(3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    s, s_next, a = 0.7, 0.45, 0.8
    x, v = (1 - s) * x0 + s * eps, eps - x0
    step = sde_step(x, v, s, s_next, SDEConfig("cps", a=a), noise=z)
    cos, sin = math.cos(a * math.pi / 2), math.sin(a * math.pi / 2)
    torch.testing.assert_close(step.x_next, (1 - s_next) * x0 + s_next * (cos * eps + sin * z))
    assert step.std == pytest.approx(s_next * sin)
    torch.testing.assert_close(step.mean, (1 - s_next) * x0 + s_next * cos * eps)
    expected = torch.distributions.Normal(step.mean, s_next * sin).log_prob(step.x_next).flatten(1).mean(1)
    torch.testing.assert_close(step.log_prob, expected)
    # any velocity: the mean is linear in v with the coefficients of x0_hat = x - s v and eps_hat = x + (1-s) v
    v = torch.randn_like(x)
    mean = sde_step(x, v, s, s_next, SDEConfig("cps", a=a), noise=z).mean
    torch.testing.assert_close(mean, (1 - s_next) * (x - s * v) + s_next * cos * (x + (1 - s) * v))
    # a = 0 is the Euler (ODE) step; the last step (to 0) has no noise
    torch.testing.assert_close(sde_step(x, v, s, s_next, SDEConfig("cps", a=0.0)).x_next, x + (s_next - s) * v)
    last = sde_step(x, v, 0.2, 0.0, SDEConfig("cps", a=a))
    assert last.std == 0 and last.log_prob is None
    torch.testing.assert_close(last.x_next, x - 0.2 * v)
    with pytest.raises(ValueError, match="0 <= a <= 1"):
        SDEConfig("cps", a=1.5)


class _Policy:
    """A policy with one trained weight (``velocity = w * sin(3x) (1+s)``, the reference's ``w = 1``) that
    records the levels it is evaluated at."""

    def __init__(self, w: float = 1.0) -> None:
        self.w = torch.nn.Parameter(torch.tensor(w, dtype=torch.float64))
        self.levels: list[float] = []

    def velocity(self, x, s, cond, *, reference=False):
        self.levels.append(s)
        return (torch.ones((), dtype=x.dtype) if reference else self.w) * torch.sin(3 * x) * (1 + s)

    def trains(self, s: float) -> bool:
        return True


def _trained_levels(config: GRPOConfig, window: tuple[int, int] | None, policy: _Policy | None = None):
    policy = policy or _Policy()
    sigmas = rollout_sigmas(config, window)
    noise = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sde_steps = range(*window) if window else None
    with torch.no_grad():
        traj = sample_trajectory(lambda x, s: policy.velocity(x, s, None), noise, sigmas, config.sde,
                                 torch.Generator().manual_seed(2), sde_steps=sde_steps)  # fmt: skip
    policy.levels.clear()
    stats = accumulate_gradients(policy, traj, None, torch.tensor([1.0, -1.0, 0.5, -0.5]), config, step_seed=3)
    return [sigmas.index(s) for s in policy.levels if s in sigmas], stats, traj


def test_deterministic_steps_are_never_trained():
    """CPS's last step has no noise: it is not stochastic, no training step picks it, even in a window or
    with every step trained."""
    config = GRPOConfig(steps=4, sde=SDEConfig("cps", a=0.7), train_fraction=1.0)
    sigmas = rollout_sigmas(config, None)
    assert stochastic_steps(config, sigmas) == [0, 1, 2]
    assert stochastic_steps(GRPOConfig(steps=4), sigmas) == [0, 1, 2, 3]  # Flow-GRPO's SDE: noise to the end
    steps, stats, traj = _trained_levels(config, None)
    assert steps == [0, 1, 2] and stats["trained_steps"] == 3 and (traj.log_probs[3] == 0).all()
    assert _trained_levels(config, (2, 4))[0] == [2]  # a window holding the last step trains the others


def test_random_window_is_drawn_per_iteration_and_only_its_steps_are_stochastic_and_trained():
    config = GRPOConfig(steps=10, random_window=RandomWindow(size=2, within=(0, 6)), sde=SDEConfig("flow"))
    windows = [sde_window_at(config, step, seed=5) for step in range(60)]
    assert {w[0] for w in windows} == {0, 1, 2, 3, 4} and all(w[1] == w[0] + 2 for w in windows)
    assert windows == [sde_window_at(config, step, seed=5) for step in range(60)]  # the same on every rank
    assert windows != [sde_window_at(config, step, seed=6) for step in range(60)]  # and per run
    assert make_batch(["a", "b"], 7, 5, config, single_process_state()).window == windows[7]
    steps, stats, traj = _trained_levels(config, windows[7])
    assert steps == list(range(*windows[7])) and stats["trained_steps"] == 2
    outside = [t for t in range(10) if t not in range(*windows[7])]
    assert (traj.log_probs[outside] == 0).all() and (traj.log_probs[list(range(*windows[7]))] != 0).all()
    assert trained_steps(config, 0, window=windows[7]) == list(range(*windows[7]))
    loaded = TrainConfig.from_dict({"grpo": {"steps": 10, "random_window": {"size": 3, "within": [2, 8]}}})
    assert loaded.grpo.random_window == RandomWindow(3, (2, 8))
    with pytest.raises(ConfigError, match="exclude each other"):
        GRPOConfig(sde_window=(0, 2), random_window=RandomWindow())
    with pytest.raises(ConfigError, match="fewer than size"):
        RandomWindow(size=3, within=(0, 2))
    with pytest.raises(ConfigError, match="must fit in steps"):
        GRPOConfig(steps=4, random_window=RandomWindow(size=2, within=(3, 6)))


def test_wan_schedule_is_the_unipc_flow_schedule_of_wan():
    """Wan's diffusers scheduler (UniPC, flow sigmas, flow_shift 3) makes these levels (its first one lowered
    by 1e-6 for its own logarithm); its last step before 0 is a full one, unlike the Euler grid's."""
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    for steps in (6, 20):
        scheduler.set_timesteps(steps)
        ours = wan_sigmas(steps, 3.0)
        torch.testing.assert_close(torch.tensor(ours[1:], dtype=torch.float32), scheduler.sigmas[1:], atol=1e-6, rtol=0)
        assert ours[0] == 1.0 and abs(float(scheduler.sigmas[0]) - 1.0) < 2e-6
    assert schedule_sigmas("wan", 6, 3.0) == wan_sigmas(6, 3.0) != schedule_sigmas("flow_match", 6, 3.0)
    assert wan_sigmas(6, 3.0)[-2] > 0.3 > 0.01 > schedule_sigmas("flow_match", 6, 3.0)[-2]
    assert rollout_sigmas(GRPOConfig(steps=6, shift=3.0, schedule="wan"), None) == wan_sigmas(6, 3.0)
    with pytest.raises(ConfigError, match="schedule must be"):
        GRPOConfig(schedule="unipc")


@pytest.mark.parametrize("kind", ["flow", "cps"])
def test_kl_in_flow_grpo_units_is_flow_grpo_s_term(kind):
    """``kl_units: flow_grpo``: the KL term is Flow-GRPO's ``mean((m - m_ref)^2) / (2 std_dev_t^2)``, with its
    ``std_dev_t = a sqrt(s / (1 - s))`` (the SDE) or ``s' sin(a pi/2)`` (CPS), written out here from its paper;
    ``nats`` is the exact KL of the step's Gaussians, the same for CPS and ``1/(s - s')`` times more for the SDE."""
    a = 0.7
    base = dict(steps=5, shift=1.0, sde=SDEConfig(kind, a=a), sde_window=(1, 3), kl_coef=0.1)
    policy = _Policy(w=1.3)  # the reference is w = 1
    _, stats, traj = _trained_levels(GRPOConfig(**base, kl_units="flow_grpo"), (1, 3), policy)
    _, nats, _ = _trained_levels(GRPOConfig(**base), (1, 3), _Policy(w=1.3))
    terms = []
    for t in (1, 2):
        s, s_next, x = traj.sigmas[t], traj.sigmas[t + 1], traj.latents[t]
        dv = 0.3 * torch.sin(3 * x) * (1 + s)  # v - v_ref
        if kind == "flow":  # Flow-GRPO's SDE mean: x + (v + c^2/(2s) (x + (1-s) v)) dt
            c = a * math.sqrt(s / (1 - s))
            dm = (s_next - s) * (1 + c * c * (1 - s) / (2 * s)) * dv
        else:  # CPS: (1-s')(x - s v) + sqrt(s'^2 - c^2)(x + (1-s) v)
            c = s_next * math.sin(a * math.pi / 2)
            dm = (-(1 - s_next) * s + math.sqrt(s_next**2 - c**2) * (1 - s)) * dv
        terms.append(((dm**2).mean(1) / (2 * c * c)).mean().item())
    assert stats["kl"] == pytest.approx(sum(terms) / 2, rel=1e-5)  # trajectories are kept in fp32
    ratio = nats["kl"] / stats["kl"]
    if kind == "cps":
        assert ratio == pytest.approx(1.0, rel=1e-6)
    else:  # 1/(s - s'), the same for both steps of this uniform grid (shift 1)
        assert ratio == pytest.approx(1 / (traj.sigmas[1] - traj.sigmas[2]), rel=1e-5)
        assert traj.sigmas[1] - traj.sigmas[2] == pytest.approx(traj.sigmas[2] - traj.sigmas[3])
    with pytest.raises(ConfigError, match="kl_units must be"):
        GRPOConfig(kl_units="bits")


def test_the_recipe_page_s_config_loads():
    """docs/sde-recipes.md's YAML block is a valid config with the recipes it names."""
    from pathlib import Path

    import yaml

    page = Path(__file__).resolve().parents[2] / "docs" / "sde-recipes.md"
    (block,) = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
    grpo = TrainConfig.from_dict(yaml.safe_load(block)).grpo
    assert (grpo.schedule, grpo.sde.kind, grpo.kl_units, grpo.random_window) == (
        "wan", "cps", "flow_grpo", RandomWindow(2, (0, 10)))  # fmt: skip


@pytest.mark.slow
def test_trainer_with_cps_wan_schedule_and_random_window_is_on_policy():
    """The recipes through ``GRPOTrainer`` (the path a config takes): iteration 3's random window, CPS steps
    on Wan's levels, the KL in Flow-GRPO's units; exactly on-policy, and deterministic steps untrained. (No
    layout-specific code is added: the windows and steps are computed alike on every rank.)"""
    from grpo_checks import moved_window_gradients, tiny_config

    from dit_sp import spawn

    config = tiny_config(steps=4, **{"grpo.sde": {"kind": "cps", "a": 0.8}, "grpo.schedule": "wan",
                                     "grpo.kl_coef": 0.01, "grpo.kl_units": "flow_grpo",
                                     "grpo.random_window": {"size": 2}})  # fmt: skip
    window = sde_window_at(config.grpo, 3, config.seed)
    result = spawn(moved_window_gradients, 1, args=(config, 3), timeout=300)[0]
    trained = [t for t in range(*window) if t != 3]  # step 3 (to s' = 0) has no noise
    assert result["window"] == window and result["trained"] == len(trained) and result["ratio"] == (1.0, 1.0)
    assert (result["log_probs"][trained] != 0).all() and (result["log_probs"][[3]] == 0).all()
    assert len(result["grads"]) > 10 and all(torch.isfinite(g).all() for g in result["grads"].values())
