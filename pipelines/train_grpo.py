"""GRPO fine-tuning of a video DiT, sequence-parallel (USP) inside FSDP2, with exact resume.

    python -m pipelines.train_grpo --config configs/grpo_tiny_wan.yaml            # one process
    python -m pipelines.train_grpo --config configs/grpo_tiny_wan.yaml --ulysses 2  # 2 local workers
    torchrun --nnodes 4 --nproc-per-node 8 -m pipelines.train_grpo --config configs/grpo_wan2.1_1.3b.yaml \\
        --ulysses 4 --ring 2                                                        # dp = the rest

Every step appends one JSON line to OUTPUT_DIR/metrics.jsonl and TensorBoard scalars; the reward
curve is drawn to OUTPUT_DIR/reward_curve.png; checkpoints go to OUTPUT_DIR/checkpoints (resume with
--resume); the final weights are exported in diffusers format to OUTPUT_DIR/final.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml

from dit_sp import ParallelConfig, init_parallel, spawn
from dit_sp.parallel.launch import free_port
from dit_sp.parallelize import parallelize
from dit_sp.rl import SDEConfig, build_reward, group_advantages, sample_trajectory, shifted_sigmas
from dit_sp.rl.advantages import gather_across
from dit_sp.rl.grpo import GRPOConfig, make_batch, rewards_of, rollout, seed_for, train_on_rollout
from dit_sp.train import checkpoint, shard_model
from pipelines.models import load_pipeline
from pipelines.policies import DiffusersPolicy, policy_for
from pipelines.video import save_video


@dataclass
class TrainConfig:
    model: str = "tiny-wan"
    prompts: str = "assets/prompts_demo.txt"
    reward: Any = "brightness"
    output_dir: str = "outputs/grpo"
    max_steps: int = 20
    checkpoint_every: int = 10
    eval_every: int = 0
    """Every N steps: ODE samples of the first ``eval_prompts`` prompts (video + ``eval_reward`` metric)."""
    eval_prompts: int = 4
    resume: bool = False
    seed: int = 0
    dp: int | None = None
    ring: int = 1
    ulysses: int = 1
    hsdp: bool = False
    # sampling
    frames: int = 5
    height: int = 32
    width: int = 32
    steps: int = 6
    shift: float = 3.0
    guidance: float = 1.0
    embedded_guidance: float | None = None
    """HunyuanVideo's distilled guidance (default 6.0); other families have none."""
    negative_prompt: str = ""
    max_sequence_length: int = 16
    sde: str = "flow"
    eta: float = 0.3
    noise_level: float = 0.7
    # GRPO
    group_size: int = 4
    prompts_per_step: int = 2
    same_noise_per_group: bool = True
    train_fraction: float = 0.6
    sde_window: list[int] | None = None
    clip_range: float = 1e-3
    kl_coef: float = 0.0
    adv_std: str = "group"
    adv_clip: float = 5.0
    # optimisation
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    lora_rank: int = 0
    lora_alpha: float | None = None
    activation_checkpointing: bool = False
    mixed_precision: str | None = None
    """bfloat16 compute on CUDA; None keeps fp32 (CPU)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def grpo(self) -> GRPOConfig:
        return GRPOConfig(
            steps=self.steps, shift=self.shift, sde=SDEConfig(self.sde, eta=self.eta, a=self.noise_level),
            group_size=self.group_size, same_noise_per_group=self.same_noise_per_group,
            train_fraction=self.train_fraction, sde_window=tuple(self.sde_window) if self.sde_window else None,
            clip_range=self.clip_range, kl_coef=self.kl_coef, adv_std=self.adv_std, adv_clip=self.adv_clip,
            max_grad_norm=self.max_grad_norm,
        )  # fmt: skip


def load_config(path: Path | None, overrides: dict[str, Any]) -> TrainConfig:
    valid = {f.name for f in fields(TrainConfig)} - {"extra"}
    values: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        values = yaml.safe_load(path.read_text()) or {}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ValueError(f"unknown keys in {path}: {unknown}; valid keys: {sorted(valid)}")
    config = TrainConfig(**(values | overrides))
    config.grpo()  # validates
    return config


def read_prompts(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist (give a .txt with one prompt per line or a .jsonl)")
    if file.suffix == ".jsonl":
        prompts = [json.loads(line)["prompt"] for line in file.read_text().splitlines() if line.strip()]
    else:
        prompts = [line.strip() for line in file.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts


class MetricsLog:
    """metrics.jsonl (one line per step), TensorBoard and the reward-curve PNG; rank 0 only."""

    def __init__(self, out: Path, resume_step: int, enabled: bool):
        self.enabled, self.path, self.out = enabled, out / "metrics.jsonl", out
        self.rows: list[dict[str, Any]] = []
        if not enabled:
            return
        if self.path.exists():  # keep what the resumed run already logged, drop steps it will redo
            kept = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
            self.rows = [row for row in kept if row["step"] < resume_step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=resume_step)

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, row["step"])
        self.writer.flush()
        self.plot()

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if r["reward_mean"] is not None]
        steps = [r["step"] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [r["reward_mean"] for r in rows], label="reward mean")
        ax.fill_between(steps, [r["reward_mean"] - r["reward_std"] for r in rows],
                        [r["reward_mean"] + r["reward_std"] for r in rows], alpha=0.2)  # fmt: skip
        evals = [r for r in rows if r.get("eval_reward") is not None]
        if evals:
            ax.plot([r["step"] for r in evals], [r["eval_reward"] for r in evals], "o-", label="eval reward (ODE)")
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.legend()
        fig.tight_layout()
        fig.savefig(self.out / "reward_curve.png", dpi=100)
        plt.close(fig)


def _setup_lora(transformer: torch.nn.Module, cfg: TrainConfig) -> None:
    from peft import LoraConfig

    transformer.requires_grad_(False)
    transformer.add_adapter(
        LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha or cfg.lora_rank,
            init_lora_weights=True,
            target_modules=["to_q", "to_k", "to_v", "to_out.0"],
        )  # fmt: skip
    )


@dataclass
class Run:
    """Everything one rank of a training run holds."""

    cfg: TrainConfig
    parallel: Any
    prompts: list[str]
    reward: Any
    grpo: GRPOConfig
    pipe: Any
    transformer: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    policy: DiffusersPolicy


def setup(cfg: TrainConfig) -> Run:
    """Process group, model (USP inside FSDP2), optimizer and policy of one rank."""
    if not dist.is_initialized() and "RANK" not in os.environ:  # one process: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    world = int(os.environ["WORLD_SIZE"])
    parallel = init_parallel(ParallelConfig.for_world(world, ring=cfg.ring, ulysses=cfg.ulysses))
    if cfg.dp is not None and cfg.dp != parallel.dp:
        raise ValueError(f"dp={cfg.dp} but {world} processes / (ring*ulysses={parallel.sp}) give dp={parallel.dp}")
    prompts = read_prompts(cfg.prompts)
    reward = build_reward(cfg.reward)
    grpo = cfg.grpo()
    make_batch(prompts, 0, cfg.seed, cfg.prompts_per_step, grpo, parallel)  # validates the batch split early

    torch.manual_seed(cfg.seed)  # identical initial weights (LoRA included) on every rank
    pipe = load_pipeline(cfg.model, torch.float32).to(parallel.device)
    transformer = pipe.transformer
    # the policy checks the settings against the model before it is sharded
    policy = policy_for(pipe)(pipe, transformer, frames=cfg.frames, height=cfg.height, width=cfg.width,
                              guidance=cfg.guidance, negative_prompt=cfg.negative_prompt,
                              max_sequence_length=cfg.max_sequence_length, embedded_guidance=cfg.embedded_guidance,
                              device=parallel.device)  # fmt: skip
    reference = None
    if cfg.lora_rank:
        _setup_lora(transformer, cfg)
    elif cfg.kl_coef:
        import copy

        reference = copy.deepcopy(transformer).requires_grad_(False)
    parallelize(transformer, parallel, gather_grad="sum")
    if reference is not None:
        parallelize(reference, parallel)
        shard_model(reference, parallel, hsdp=cfg.hsdp)
    if cfg.activation_checkpointing:
        transformer.enable_gradient_checkpointing()
    compute_dtype = getattr(torch, cfg.mixed_precision) if cfg.mixed_precision else None
    shard_model(transformer, parallel, hsdp=cfg.hsdp, param_dtype=compute_dtype)
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    if reference is not None:
        policy.reference = reference
    elif cfg.lora_rank and cfg.kl_coef:
        policy.reference = _LoraDisabled(transformer)
    return Run(cfg, parallel, prompts, reward, grpo, pipe, transformer, optimizer, scheduler, policy)


def collect(run: Run, step: int) -> dict[str, Any]:
    """Roll out this step's samples, score them and compute their advantages."""
    batch = make_batch(run.prompts, step, run.cfg.seed, run.cfg.prompts_per_step, run.grpo, run.parallel)
    run.transformer.eval()
    traj, cond = rollout(run.policy, batch, run.grpo, run.parallel)
    rewards, parts, _ = rewards_of(run.policy, traj, batch, run.reward, run.parallel)
    advantages = group_advantages(rewards, batch.prompt_ids, group=run.parallel.dp_group, std=run.grpo.adv_std,
                                  clip=run.grpo.adv_clip)  # fmt: skip
    run.transformer.train()
    return {"batch": batch, "traj": traj, "cond": cond, "rewards": rewards, "parts": parts, "advantages": advantages}


def train(cfg: TrainConfig) -> dict[str, Any]:
    """One rank of a training run (all ranks run this)."""
    run = setup(cfg)
    parallel, transformer, optimizer, scheduler = run.parallel, run.transformer, run.optimizer, run.scheduler
    out = Path(cfg.output_dir)
    start = 0
    ckpt_dir = out / "checkpoints"
    if cfg.resume and (last := checkpoint.latest(ckpt_dir)) is not None:
        extra = checkpoint.load(last, transformer, optimizer)
        scheduler.load_state_dict(extra["scheduler"])
        start = extra["step"]
    leader = parallel.rank == 0
    if leader:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(asdict(cfg)))
    metrics = MetricsLog(out, start, leader)

    from tqdm import tqdm

    for step in tqdm(range(start, cfg.max_steps), initial=start, total=cfg.max_steps, disable=not leader,
                     desc="GRPO"):  # fmt: skip
        began = time.perf_counter()
        data = collect(run, step)
        stats = train_on_rollout(run.policy, transformer, optimizer, data["traj"], data["cond"], data["advantages"],
                                 run.grpo, seed_for(cfg.seed, step, 1))  # fmt: skip
        scheduler.step()
        row = _metrics_row(step, stats, data, parallel, scheduler, time.perf_counter() - began)
        done = step + 1
        if cfg.eval_every and done % cfg.eval_every == 0:
            row["eval_reward"] = evaluate(run, out / f"eval_step{done:06d}.mp4")
        metrics.log(row)
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            checkpoint.save(ckpt_dir, done, transformer, optimizer, {"step": done, "scheduler": scheduler.state_dict()})

    checkpoint.save(ckpt_dir, cfg.max_steps, transformer, optimizer,
                    {"step": cfg.max_steps, "scheduler": scheduler.state_dict()})  # fmt: skip
    final = export(transformer, cfg, out / "final", leader)
    return {"rows": metrics.rows if leader else [], "final": str(final)}


def _metrics_row(step: int, stats: dict, data: dict, parallel, scheduler, seconds: float) -> dict[str, Any]:
    """Rewards over every data-parallel rank, loss statistics, learning rate and time of one step."""

    def mean_std(values: torch.Tensor) -> tuple[float | None, float | None, int]:
        every = gather_across(values.to(parallel.device), parallel.dp_group).cpu()
        valid = every[~torch.isnan(every)]
        failed = int(torch.isnan(every).sum())
        if not len(valid):
            return None, None, failed
        return valid.mean().item(), valid.std(unbiased=False).item(), failed

    reward_mean, reward_std, failed = mean_std(data["rewards"])
    row = {"step": step, "loss": stats["loss"], "reward_mean": reward_mean, "reward_std": reward_std,
           "reward_failed": failed, **{k: v for k, v in stats.items() if k != "loss"},
           "lr": scheduler.get_last_lr()[0], "seconds": seconds}  # fmt: skip
    for name, values in data["parts"].items():
        row[f"reward/{name}"] = mean_std(values)[0]
    return row


class _LoraDisabled:
    """The LoRA model with its adapters off: the reference policy of a LoRA run."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def parameters(self):
        return self.model.parameters()

    def __call__(self, *args, **kwargs):
        self.model.disable_adapters()
        try:
            return self.model(*args, **kwargs)
        finally:
            self.model.enable_adapters()


@torch.no_grad()
def evaluate(run: Run, path: Path) -> float:
    """ODE samples of the first ``eval_prompts`` prompts from fixed noise: their mean reward (the same on
    every rank), and a video of them side by side written by the leader. Touches no training RNG."""
    cfg, policy, parallel = run.cfg, run.policy, run.parallel
    prompts = run.prompts[: cfg.eval_prompts]
    cond = policy.encode(prompts)
    noise = torch.randn((len(prompts), *policy.latent_shape()), generator=torch.Generator().manual_seed(cfg.seed))
    run.transformer.eval()
    traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise.to(parallel.device),
                             shifted_sigmas(run.grpo.steps, run.grpo.shift), SDEConfig("ode"))  # fmt: skip
    run.transformer.train()
    reward = torch.zeros(1, device=parallel.device)
    if parallel.rank == 0:
        videos = policy.decode(traj.final).cpu()  # (B, F, C, H, W)
        reward[0] = run.reward(videos, prompts).nanmean()
        save_video(torch.cat(list(videos), dim=-1).permute(0, 2, 3, 1).numpy(), path)
    if parallel.world_size > 1:
        dist.broadcast(reward, src=0)
    return reward.item()


def export(transformer: torch.nn.Module, cfg: TrainConfig, path: Path, leader: bool) -> Path:
    """The trained weights in diffusers format (a whole pipeline directory), loadable by generate."""
    state = checkpoint.full_state_dict(transformer)
    if leader:
        pipe = load_pipeline(cfg.model, torch.float32)
        target = pipe.transformer
        if cfg.lora_rank:
            _setup_lora(target, cfg)
        missing, unexpected = target.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lora" not in k]:
            raise RuntimeError(f"exported weights do not fit the model: missing {missing}, unexpected {unexpected}")
        if cfg.lora_rank:  # merge the adapters into the base weights, then drop the peft wrappers
            target.fuse_lora()
            target.unload_lora()
        pipe.save_pretrained(path)
    dist.barrier()
    return path


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="YAML training config")
    parser.add_argument("--output-dir", dest="output_dir")
    parser.add_argument("--max-steps", dest="max_steps", type=int)
    parser.add_argument("--checkpoint-every", dest="checkpoint_every", type=int)
    parser.add_argument("--eval-every", dest="eval_every", type=int)
    parser.add_argument("--resume", action="store_true", default=None, help="continue from the latest checkpoint")
    parser.add_argument("--ulysses", type=int)
    parser.add_argument("--ring", type=int)
    parser.add_argument("--dp", type=int, help="data-parallel degree (local launch: processes = dp*ring*ulysses)")
    parser.add_argument("--prompts", help="a .txt (one prompt per line) or .jsonl ({'prompt': ...}) file")
    parser.add_argument("--seed", type=int)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    path = args.pop("config", None)
    try:
        return load_config(path, args)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    if "RANK" in os.environ:
        results = [train(cfg)]
    else:
        world = (cfg.dp or 1) * cfg.ring * cfg.ulysses
        results = spawn(train, world, args=(cfg,), timeout=24 * 3600) if world > 1 else [train(cfg)]
    rows = results[0]["rows"]
    if rows:
        first, last = rows[0], rows[-1]
        print(f"steps {first['step']}..{last['step']}: reward {first['reward_mean']:.4f} -> {last['reward_mean']:.4f}")
        print(f"metrics: {Path(cfg.output_dir) / 'metrics.jsonl'}, final weights: {results[0]['final']}")


if __name__ == "__main__":
    main()
