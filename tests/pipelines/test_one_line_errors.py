"""Every user error of the CLIs is one line (no traceback, no usage block), found before anything heavy runs:
prompt files that are not UTF-8, malformed model directories, an output directory that takes no file
(read-only or full), optional packages that are not installed, flag errors; a run that keeps getting no
reward stops in one line; a damaged prompt-embedding cache is encoded again and never stops a run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from cli_run import run_cli

from dit_sp.io.bundled import asset_path

pytestmark = pytest.mark.slow  # one CLI process per case (forked from a server with the imports done)
TRAIN = ["--config", "grpo_tiny_wan", "--max-steps", "1"]
SMALL = ["--set", "sample.frames=5", "--set", "grpo.steps=2", "--set", "grpo.group_size=2",
         "--set", "grpo.prompts_per_step=1", "--set", "checkpoint_every=0", "--set", "eval_every=0"]  # fmt: skip
REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def _model(tmp: Path, edit) -> None:
    """A copy of the shipped toy-wan at ``tmp/m``, damaged by ``edit(directory)``."""
    shutil.copytree(asset_path("toy-wan"), tmp / "m")
    edit(tmp / "m")


def _replace(file: Path, old: str, new: str) -> None:
    file.write_text(file.read_text().replace(old, new))


def _cut(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


SETUPS = {
    "latin1": lambda t: (t / "p.txt").write_bytes(b"a red circle\ncaf\xe9 au lait\n"),
    "utf16": lambda t: (t / "p.jsonl").write_bytes('{"prompt": "a red circle"}\n'.encode("utf-16")),
    "not-json": lambda t: _model(t, lambda m: (m / "model_index.json").write_text("{not json")),
    "pipeline": lambda t: _model(t, lambda m: _replace(m / "model_index.json", '"WanPipeline"', '"NopePipeline"')),
    "class": lambda t: _model(t, lambda m: _replace(m / "model_index.json", "WanTransformer3DModel", "NopeModel")),
    "no-config": lambda t: _model(t, lambda m: (m / "transformer/config.json").unlink()),
    "cut": lambda t: _model(t, lambda m: _cut(m / WEIGHTS)),
    "foreign": lambda t: _model(t, lambda m: (m / WEIGHTS).write_bytes(b"<html>404 Not Found</html>")),
    "no-vae": lambda t: _model(t, lambda m: shutil.rmtree(m / "vae")),
}

# (id, CLI module, argv, setup of {tmp}, the one line as a regex)
CASES = [
    ("train-prompts-latin1", "train_grpo", [*TRAIN, "--prompts", "{tmp}/p.txt"], "latin1",
     r"p.txt:2: byte 0xe9 at offset 16 is not UTF-8 text; save the file as UTF-8"),
    ("gen-prompts-utf16", "generate", ["--prompts", "{tmp}/p.jsonl"], "utf16",
     r"p.jsonl:1: byte 0xff at offset 0 is not UTF-8 text; save the file as UTF-8"),
    ("gen-index-not-json", "generate", ["--model", "{tmp}/m"], "not-json",
     r"m/model_index.json is not valid JSON \(Expecting property name .*\): it should hold the pipeline's index"),
    ("train-index-not-json", "train_grpo", [*TRAIN, "--model", "{tmp}/m"], "not-json",
     r"m/model_index.json is not valid JSON"),
    ("gen-index-pipeline", "generate", ["--model", "{tmp}/m"], "pipeline",
     r"m/model_index.json: _class_name 'NopePipeline' is not a pipeline class of this diffusers"),
    ("train-index-class", "train_grpo", [*TRAIN, "--model", "{tmp}/m"], "class",
     r"m/model_index.json: component 'transformer' is diffusers.NopeModel, which diffusers does not have"),
    ("gen-no-transformer-config", "generate", ["--model", "{tmp}/m"], "no-config",
     r"m/transformer/config.json is missing: it holds the transformer's configuration"),
    ("train-no-transformer-config", "train_grpo", [*TRAIN, "--model", "{tmp}/m"], "no-config",
     r"m/transformer/config.json is missing"),
    ("train-cut-weights", "train_grpo", [*TRAIN, "--model", "{tmp}/m"], "cut",
     r"m/transformer/diffusion_pytorch_model.safetensors is damaged: truncated: tensor '.+' ends at byte \d+ of \d+; "
     r"save or download it again"),
    ("gen-foreign-weights", "generate", ["--model", "{tmp}/m", "--shard-weights", "--ulysses", "2"], "foreign",
     r"m/transformer/diffusion_pytorch_model.safetensors is damaged: not a safetensors file, or truncated"),
    ("gen-no-vae", "generate", ["--model", "{tmp}/m"], "no-vae",
     r"m is an incomplete diffusers pipeline directory: vae/ is missing, which model_index.json lists "
     r"\(AutoencoderKLWan\)"),
    ("train-read-only-output", "train_grpo", [*TRAIN, "--output-dir", "/proc/dit_sp_run"], None,
     r"cannot write to the output directory /proc/dit_sp_run: "),  # the run lock finds out first
    ("train-read-only-cache", "train_grpo", [*TRAIN, "--output-dir", "{tmp}/run", "--set",
     "embedding_cache=/proc/dit_sp_cache"], None,
     r"embedding_cache /proc/dit_sp_cache/embedding.pt: cannot write to /proc"),
    ("gen-flag", "generate", ["--nope"], None,
     r"^error: unrecognized arguments: --nope \(see python -m pipelines.generate --help\)$"),
    ("train-flag-type", "train_grpo", ["--max-steps", "x"], None,
     r"^error: argument --max-steps: invalid int value: 'x' \(see python -m pipelines.train_grpo --help\)$"),
    ("train-set-key", "train_grpo", ["--set", "grpo.nope=1"], None,
     r"^error: config.grpo: unknown key 'nope'; valid keys: .* \(see python -m pipelines.train_grpo --help\)$"),
    ("plan-flag-type", "plan", ["--config", "grpo_tiny_wan", "--gpus", "two"], None,
     r"^error: argument --gpus: invalid int value: 'two' \(see python -m pipelines.plan --help\)$"),
    ("server-required", "reward_server", [], None,
     r"^error: the following arguments are required: --reward \(see python -m pipelines.reward_server --help\)$"),
    ("eval-flag", "eval_toy", ["--seeds", "1", "--bogus"], None,
     r"^error: unrecognized arguments: --bogus \(see python -m pipelines.eval_toy --help\)$"),
    ("toy-flag", "train_toy", ["--bogus"], None,
     r"^error: unrecognized arguments: --bogus \(see python -m pipelines.train_toy --help\)$"),
]  # fmt: skip


def _run_case(case: tuple, tmp: Path) -> tuple[subprocess.CompletedProcess, float]:
    _, cli, argv, setup, _ = case
    if setup is not None:
        SETUPS[setup](tmp)
    argv = [arg.replace("{tmp}", str(tmp)) for arg in argv]
    began = time.monotonic()
    return run_cli(f"pipelines.{cli}", argv, cwd=tmp), time.monotonic() - began


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple]:
    """Every case's CLI run, two at a time (the cases are independent; this machine has 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case[0]: pool.submit(_run_case, case, tmp_path_factory.mktemp(case[0])) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


def assert_one_line(result: subprocess.CompletedProcess, pattern: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_before_anything_loads(outcomes, case):
    result, elapsed = outcomes[case[0]]
    assert_one_line(result, case[4])
    assert elapsed < 60, f"took {elapsed:.0f} s: the error should come before anything heavy"


def test_help_still_prints_the_whole_usage(tmp_path):
    result = run_cli("pipelines.generate", ["--help"], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("usage: python -m pipelines.generate [-h]")
    assert "--ulysses" in result.stdout and "--cfg-parallel" in result.stdout


@pytest.mark.parametrize(
    ("package", "argv", "needed"),
    [
        ("peft", ["--config", "grpo_toy", "--max-steps", "1"], r"LoRA \(lora.rank > 0\) needs the peft package: "
         r"pip install 'dit-sp\[lora\]' \(or pip install peft\)$"),
        ("wandb", [*TRAIN, "--set", "wandb={project: p}"], r"W&B logging \(the wandb setting\) needs the wandb "
         r"package: pip install 'dit-sp\[tracking\]' \(or pip install wandb\)$"),
    ],
    ids=["peft", "wandb"],
)  # fmt: skip
def test_a_missing_optional_package_is_one_line_with_the_pip_command(tmp_path, package, argv, needed):
    argv = [*argv, "--output-dir", str(tmp_path / "run")]
    result = run_cli("pipelines.train_grpo", argv, cwd=tmp_path, without=(package,))
    assert_one_line(result, needed)
    assert not (tmp_path / "run").exists()


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 64 KiB tmpfs that is full (mounting needs root: skipped elsewhere)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                                           capture_output=True).returncode:  # fmt: skip
        pytest.skip("a full file system needs a small tmpfs mounted (root)")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError, match="No space left"):
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_one_line_before_anything_loads(full_disk, tmp_path):
    train = run_cli("pipelines.train_grpo", [*TRAIN, "--output-dir", str(full_disk / "run")], cwd=tmp_path)
    assert_one_line(train, rf"cannot write to the output directory {full_disk}/run: No space left")  # the run lock
    generate = run_cli("pipelines.generate", ["--out", str(full_disk / "v.mp4")], cwd=tmp_path)
    assert_one_line(generate, rf"--out {full_disk}/v.mp4: cannot write to {full_disk} \(No space left on device\)")
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"], "no probe file is left"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """A run whose reward is always NaN, with ``max_skipped_steps: 1``: it stops after its first step, having
    written its prompt embeddings to a cache of its own."""
    tmp = tmp_path_factory.mktemp("stopped")
    argv = [*TRAIN, *SMALL, "--output-dir", str(tmp / "run"), "--set", f"embedding_cache={tmp / 'cache'}",
            "--set", "max_skipped_steps=1", "--set", "reward=tests.support.rewards_for_tests:nan_reward"]  # fmt: skip
    return run_cli("pipelines.train_grpo", argv, cwd=REPO, timeout=600), tmp / "cache"


def test_a_run_without_rewards_stops_in_one_line(stopped_run):
    result, _ = stopped_run
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(r"^error: 1 updates in a row \(the last at step 0\) had a non-finite loss "
                                          r"or gradient norm, or no sample with a reward.*max_skipped_steps$",
                                          errors[0]), result.stderr[-3000:]  # fmt: skip


def test_a_damaged_embedding_cache_is_encoded_again_with_one_warning(stopped_run, tmp_path):
    _, cache = stopped_run
    files = sorted(cache.glob("*.pt"))
    assert files, "the stopped run wrote its prompt embeddings"
    for i, file in enumerate(files):  # cut short (a full disk), emptied, overwritten
        file.write_bytes([file.read_bytes()[:100], b"", b"garbage"][i % 3])
    argv = [*TRAIN, *SMALL, "--output-dir", str(tmp_path / "run"), "--set", f"embedding_cache={cache}"]
    result = run_cli("pipelines.train_grpo", argv, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "damaged prompt embedding" in line]
    assert len(warnings) == 1 and f"{len(files)} damaged prompt embedding file(s) in {cache}" in warnings[0]
    assert sorted(cache.glob("*.pt")) == files and not list(cache.glob("*.tmp*"))
    for file in files:
        assert isinstance(torch.load(file, weights_only=True)["prompt"], str), f"{file} was not encoded again"
