"""The how-to recipes (docs/howto/*.md) are a contract like the README: every fenced block of every page runs
here, with the tiny models, local paths, small sizes and 1-2 steps substituted where a page names a real
checkpoint, a cluster or a long run. Every substitution must find its text on the page, and every block is
claimed by the test of its page (``CLAIMS``), so a recipe cannot change or appear without a test."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from doc_blocks import blocks, commands, languages, run_command, run_snippet, substitute

from dit_sp import spawn

REPO = Path(__file__).resolve().parents[1]
HOWTO = REPO / "docs" / "howto"
SMALL = "--frames 5 --height 32 --width 32 --steps 2 --max-sequence-length 16"
SMALL_GRPO = "--set grpo.group_size=2 --set grpo.prompts_per_step=2 --set grpo.steps=2 --eval-every 0"
TINY_SAMPLE = "--set sample.frames=5 --set sample.height=32 --set sample.width=32 --set sample.max_sequence_length=16"

CLAIMS = {
    "own-model.md": ["bash", "bash", "bash"],
    "own-reward.md": ["python", "bash", "yaml", "bash"],
    "layout.md": ["bash", "bash", "bash"],
    "slurm.md": ["bash"],
    "wandb.md": ["yaml", "bash"],
    "resume.md": ["bash"],
    "lora.md": ["bash", "python", "bash"],
}
"""Page -> the languages of its blocks, in order: what the page's test below runs."""

HUB = importlib.util.find_spec("dit_sp.zoo.hub") is not None
"""Hub ids as ``--model`` (``dit_sp.zoo.hub``, branch first-use); the recipe's hub block runs once it is there."""
RECORDED_SETTINGS = importlib.util.find_spec("dit_sp.zoo.sample") is not None
"""An export records its sample settings and ``generate`` takes them (branch first-use); before, a test gives
the sizes itself."""


def page(name: str) -> str:
    return (HOWTO / name).read_text()


def page_commands(name: str) -> list[str]:
    return [command for block in blocks(page(name), "bash") for command in commands(block)]


def assert_claimed(name: str, cases: dict) -> None:
    assert sorted(page_commands(name)) == sorted(cases), f"a command of {name} has no test (or a test lost it)"


def run_cases(name: str, cases: dict[str, list[str]], cwd: Path) -> dict[str, list[subprocess.CompletedProcess]]:
    """Each command of page ``name``, in page order, as its case says (later ones may use earlier outputs)."""
    assert_claimed(name, cases)
    return {command: [run_command(run, cwd) for run in cases[command]] for command in page_commands(name)}


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_wan_dir(tmp_path_factory) -> Path:
    """A stock ``WanPipeline`` directory (the tiny Wan), standing in for the pages' real checkpoints."""
    from dit_sp.zoo import build_tiny

    path = tmp_path_factory.mktemp("ckpt") / "tiny-wan"
    build_tiny("tiny-wan").save_pretrained(path)
    return path


def test_every_block_of_every_page_has_a_test():
    pages = sorted(path.name for path in HOWTO.glob("*.md"))
    assert pages == sorted(CLAIMS), "a how-to page has no test (or a test lost its page)"
    for name in pages:
        assert languages(page(name)) == CLAIMS[name], f"{name}: its blocks changed; update its test and CLAIMS"


def test_the_readme_links_every_page():
    readme = (REPO / "README.md").read_text()
    for name in CLAIMS:
        assert f"(docs/howto/{name})" in readme, name


# ---------------------------------------------------------------------------------------------------------
# own-model.md


OWN = "python -m pipelines.generate --model /path/to/Wan2.1-T2V-1.3B-Diffusers --config wan2.1-t2v-1.3b"
HUB_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
HUB_RUN = f"python -m pipelines.generate --model {HUB_ID} --config wan2.1-t2v-1.3b"


@pytest.mark.slow
def test_own_checkpoint_recipe(tiny_wan_dir, tmp_path):
    (tmp_path / "my_prompts.txt").write_text("a red circle moving left\na blue square moving up\n")
    ckpt = str(tiny_wan_dir)
    cases = {
        OWN: [f"python -m pipelines.generate --model {ckpt} --config wan2.1-t2v-1.3b --ulysses 1 {SMALL} "
              f"--out {tmp_path}/a.mp4"],
        f"{OWN} --ulysses 2 --frames 33": [
            f"python -m pipelines.generate --model {ckpt} --config wan2.1-t2v-1.3b --ulysses 2 --frames 33 "
            f"--height 32 --width 32 --steps 2 --max-sequence-length 16 --out {tmp_path}/b.mp4"
        ],
        f"hf download {HUB_ID}": [],  # test_hub_id_recipe
        HUB_RUN: [],  # test_hub_id_recipe
        "python -m pipelines.train_grpo --config grpo_wan2.1_1.3b --model /path/to/Wan2.1-T2V-1.3B-Diffusers "
        "--prompts my_prompts.txt --set reward=brightness --ulysses 2": [
            f"python -m pipelines.train_grpo --config grpo_wan2.1_1.3b --model {ckpt} --prompts my_prompts.txt "
            f"--set reward=brightness --ulysses 2 --max-steps 1 {SMALL_GRPO} {TINY_SAMPLE} --output-dir {tmp_path}/t"
        ],
    }  # fmt: skip
    results = run_cases("own-model.md", cases, tmp_path)
    assert (tmp_path / "a.mp4").stat().st_size > 0 and (tmp_path / "b.mp4").stat().st_size > 0
    assert "wrote " in results[OWN][0].stdout
    assert len(metrics(tmp_path / "t")) == 1 and (tmp_path / "t" / "final" / "model_index.json").is_file()


def _hub_generate(cache: Path, cwd: Path, out: str) -> subprocess.CompletedProcess:
    """The page's hub command, in a fresh process (huggingface_hub reads its cache's place on import),
    offline, with the cache at ``cache``."""
    argv = [sys.executable, "-m", "pipelines.generate", *shlex.split(HUB_RUN)[3:], "--ulysses", "1",
            *SMALL.split(), "--out", out]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HUB_CACHE": str(cache), "HF_HOME": str(cwd / "hf-home"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(not HUB, reason="hub ids as --model arrive with dit_sp.zoo.hub (branch first-use)")
def test_hub_id_recipe(tmp_path):
    """Before ``hf download``: one line naming the page's download command. After it (a cache laid out as
    it leaves one: ``models--ORG--NAME/snapshots/HASH`` and ``refs/main``): the page's command runs offline."""
    download = next(command for command in page_commands("own-model.md") if command.startswith("hf download"))
    assert HUB_RUN in page_commands("own-model.md")
    cache = tmp_path / "hub"
    cache.mkdir()
    missing = _hub_generate(cache, tmp_path, str(tmp_path / "v.mp4"))
    assert missing.returncode == 2 and f"`{download}`" in missing.stderr, missing.stderr[-2000:]
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr

    from dit_sp.zoo import build_tiny

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    build_tiny("tiny-wan").save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    found = _hub_generate(cache, tmp_path, str(tmp_path / "v.mp4"))
    assert found.returncode == 0, found.stderr[-3000:]
    assert (tmp_path / "v.mp4").stat().st_size > 0


# ---------------------------------------------------------------------------------------------------------
# own-reward.md


def _videos(rgb: tuple[float, float, float]) -> torch.Tensor:
    return torch.tensor(rgb).view(1, 1, 3, 1, 1).expand(2, 3, 3, 4, 4).clone()  # (B, F, C, H, W)


@pytest.mark.slow
def test_own_reward_recipe(tmp_path):
    text = page("own-reward.md")
    module = blocks(text, "python")[0]
    assert module.startswith("# my_rewards.py\n")
    (tmp_path / "my_rewards.py").write_text(module)
    config = blocks(text, "yaml")[0]
    assert config.startswith("# my_run.yaml\n")
    (tmp_path / "my_run.yaml").write_text(config)

    # the layout and range the page states: (B, F, C, H, W) in [0, 1], RGB; one value per video
    spec = importlib.util.spec_from_file_location("my_rewards", tmp_path / "my_rewards.py")
    rewards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rewards)
    red, blue = _videos((1.0, 0.0, 0.0)), _videos((0.0, 0.0, 1.0))
    assert rewards.redness(red, ["a", "b"]).tolist() == [1.0, 1.0] and rewards.redness(blue, ["a", "b"])[0] < 0
    towards_blue = rewards.colour_match([0.0, 0.0, 1.0])
    assert towards_blue(blue, ["a", "b"]).tolist() == [0.0, 0.0] and towards_blue(red, ["a", "b"])[0] < 0

    cases = {
        "python -m pipelines.train_grpo --config grpo_tiny_wan --set reward=my_rewards:redness --ulysses 2": [
            "python -m pipelines.train_grpo --config grpo_tiny_wan --set reward=my_rewards:redness --ulysses 2 "
            f"--max-steps 1 {SMALL_GRPO}"
        ],
        "python -m pipelines.train_grpo --config my_run.yaml": [
            f"python -m pipelines.train_grpo --config my_run.yaml --max-steps 1 {SMALL_GRPO}"
        ],
    }
    run_cases("own-reward.md", cases, tmp_path)
    row = metrics(tmp_path / "outputs" / "grpo_tiny_wan")[0]
    assert row["reward/my_rewards:redness"] == row["reward_mean"]
    row = metrics(tmp_path / "outputs" / "my_reward")[0]
    parts = {"my_rewards:redness": 1.0, "my_rewards:colour_match": 0.5, "brightness": 0.1}
    assert row["reward_mean"] == pytest.approx(sum(w * row[f"reward/{n}"] for n, w in parts.items()), abs=1e-5)


# ---------------------------------------------------------------------------------------------------------
# layout.md


PLAN = ("python -m pipelines.plan --config grpo_wan2.1_1.3b --gpus 16 --gpu-memory 24 --embeddings-cached "
        "--set sample.frames=81 --set sample.height=480 --set sample.width=832")  # fmt: skip


@pytest.mark.slow
def test_layout_recipe(tmp_path):
    heads = "python -m pipelines.generate --model tiny-wan --ulysses 2"
    batch = "python -m pipelines.generate --ulysses 2 --dp 2 --prompts prompts_demo.txt --out outputs/demo/clip.mp4"
    forced = f"{PLAN} --set grpo.micro_batch=1 --ulysses 4 --ring 2"
    cases = {
        heads: [f"{heads} --steps 2 --out {tmp_path}/u2.mp4 --save-latents {tmp_path}/u2.pt"],
        batch: [f"{batch} --steps 2"],
        PLAN: [PLAN],
        forced: [forced],
    }
    results = run_cases("layout.md", cases, tmp_path)
    # 3 heads on Ulysses 2 (padded to 4) give the one-process latents
    run_command(f"python -m pipelines.generate --model tiny-wan --steps 2 --out {tmp_path}/one.mp4 "
                f"--save-latents {tmp_path}/one.pt", tmp_path)  # fmt: skip
    u2, one = (torch.load(tmp_path / f"{name}.pt", weights_only=True) for name in ("u2", "one"))
    u2, one = (x if isinstance(x, torch.Tensor) else next(iter(x.values())) for x in (u2, one))
    assert (u2 - one).abs().max() <= 1e-4
    manifest = (tmp_path / "outputs" / "demo" / "clip" / "manifest.jsonl").read_text().splitlines()
    assert len(manifest) == 8 and (tmp_path / "outputs" / "demo" / "clip" / "00007.mp4").is_file()
    assert "does NOT fit" in results[PLAN][0].stdout and "to lower the training peak" in results[PLAN][0].stdout
    report = results[forced][0].stdout
    assert "dp 2 x ring 2 x ulysses 4" in report and ": fits" in report


# ---------------------------------------------------------------------------------------------------------
# slurm.md: the sbatch script with sbatch, srun and scontrol replaced by local stand-ins

SHIMS = {
    # sbatch: SLURM's variables for a job of one local node, then the script in the foreground
    "sbatch": 'while [[ "$1" == -* ]]; do shift; done\nscript=$1; shift\n'
    "export SLURM_JOB_ID=4242 SLURM_NNODES=1 SLURM_JOB_NODELIST=localhost\n"
    'exec bash "$script" "$@"\n',
    # srun: one task (this node's), its options dropped
    "srun": 'while [[ "$1" == -* ]]; do shift; done\nexec "$@"\n',
    # scontrol show hostnames LIST: the one local node
    "scontrol": "echo localhost\n",
}

TINY_RUN = """model: toy-wan
prompts: prompts_demo.txt
reward: brightness
output_dir: outputs/slurm
max_steps: 1
eval_every: 0
sample: {frames: 5, height: 32, width: 32, guidance: 4.0, max_sequence_length: 16}
grpo: {steps: 2, group_size: 2, prompts_per_step: 2}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_slurm_recipe_runs_the_sbatch_script(tmp_path):
    """The page's sbatch line on one node of 2 CPU processes: sbatch -> the script -> srun -> torchrun (the
    real one) -> train_grpo, one GRPO step."""
    command = "sbatch --nodes=2 examples/slurm/train_grpo.sbatch --config my_run.yaml --ulysses 8"
    assert_claimed("slurm.md", {command: None})
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, body in SHIMS.items():
        (shims / name).write_text("#!/bin/bash\nset -euo pipefail\n" + body)
        (shims / name).chmod(0o755)
    (tmp_path / "my_run.yaml").write_text(TINY_RUN)
    run = substitute(command, [("examples/slurm/", f"{REPO}/examples/slurm/"), ("--ulysses 8", "--ulysses 2")],
                     "slurm.md")  # fmt: skip
    env = os.environ | {"PATH": f"{shims}:{Path(sys.executable).parent}:{os.environ['PATH']}",
                        "GPUS_PER_NODE": "2", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}  # fmt: skip
    result = subprocess.run(["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "step 0: reward" in result.stdout
    assert len(metrics(tmp_path / "outputs" / "slurm")) == 1
    assert (tmp_path / "outputs" / "slurm" / "final" / "model_index.json").is_file()


# ---------------------------------------------------------------------------------------------------------
# wandb.md


@pytest.mark.slow
def test_wandb_recipe_offline(tmp_path):
    pytest.importorskip("wandb")  # the tracking extra (installed with dev)
    import yaml

    from dit_sp import TrainConfig
    from dit_sp.rl.metrics import WandbConfig

    section = yaml.safe_load(blocks(page("wandb.md"), "yaml")[0])
    assert TrainConfig.from_dict(section).wandb == WandbConfig(project="dit-sp-demo", name="first-run", mode="offline")
    command = ("python -m pipelines.train_grpo --config grpo_tiny_wan --set wandb.project=dit-sp-demo "
               "--set wandb.name=first-run")  # fmt: skip
    run_cases("wandb.md", {command: [f"{command} --max-steps 1 {SMALL_GRPO}"]}, tmp_path)
    out = tmp_path / "outputs" / "grpo_tiny_wan"
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1  # what `wandb sync` uploads
    assert (out / "wandb_run_id").is_file()


# ---------------------------------------------------------------------------------------------------------
# resume.md


@pytest.mark.slow
def test_resume_recipe_on_another_layout(tmp_path):
    first = "python -m pipelines.train_grpo --config grpo_tiny_wan --output-dir outputs/run1 --checkpoint-every 5"
    resume = ("python -m pipelines.train_grpo --config grpo_tiny_wan --output-dir outputs/run1 --resume --ulysses 2 "
              "--max-steps 60")  # fmt: skip
    cases = {
        first: [substitute(first, [("--checkpoint-every 5", f"--checkpoint-every 1 --max-steps 1 {SMALL_GRPO}")],
                           "resume.md")],
        resume: [substitute(resume, [("--max-steps 60", f"--max-steps 2 {SMALL_GRPO}")], "resume.md")],
    }  # fmt: skip
    results = run_cases("resume.md", cases, tmp_path)
    assert "resumed from step 1 (layout ring 1 x ulysses 2 x dp 1)" in results[resume][0].stdout
    assert [row["step"] for row in metrics(tmp_path / "outputs" / "run1")] == [0, 1]


# ---------------------------------------------------------------------------------------------------------
# lora.md


@pytest.mark.slow
def test_lora_recipe_trains_exports_merged_and_loads_in_stock_diffusers(tmp_path):
    train = ("python -m pipelines.train_grpo --config grpo_tiny_wan --set lora.rank=8 --set lora.alpha=16 "
             "--output-dir outputs/lora_run")  # fmt: skip
    use = 'python -m pipelines.generate --model outputs/lora_run/final --prompt "a red circle moving left"'
    sizes = "" if RECORDED_SETTINGS else " --frames 9 --height 32 --width 32"
    mix = "python -m pipelines.generate --model toy-wan --lora outputs/lora_run/final/lora:0.8 --ulysses 2"
    cases = {
        train: [f"{train} --max-steps 1 {SMALL_GRPO}"],
        use: [f"{use} --steps 2{sizes} --out {tmp_path}/lora.mp4"],  # the export's own sizes once recorded
        mix: [f"{mix} --steps 2 --out {tmp_path}/mix.mp4"],
    }
    run_cases("lora.md", cases, tmp_path)
    assert (tmp_path / "lora.mp4").stat().st_size > 0 and (tmp_path / "mix.mp4").stat().st_size > 0
    assert (tmp_path / "outputs" / "lora_run" / "final" / "lora" / "pytorch_lora_weights.safetensors").is_file()

    from safetensors import safe_open

    final = tmp_path / "outputs" / "lora_run" / "final"
    for weights in (final / "transformer").glob("*.safetensors"):
        with safe_open(weights, "pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            assert not [key for key in names if "lora" in key], "the export should hold merged weights only"
    code = substitute(blocks(page("lora.md"), "python")[0], [("num_inference_steps=20", "num_inference_steps=2")],
                      "lora.md")  # fmt: skip
    video = spawn(run_snippet, 1, args=(code, str(tmp_path), ("video",)), timeout=300)[0]["video"]
    assert video.shape == (9, 32, 32, 3) and video.std() > 0.01


def test_relative_links_of_the_readme_and_docs_lead_to_files():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for path in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(REPO)}: the link {target} leads nowhere"
