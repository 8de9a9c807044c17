"""Trust boundaries of the CLIs: a checkpoint never runs code, one run per output directory, and a resume
takes the run's settings unless a change is asked for (and then records it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from checkpoint_checks import PLANTS
from cli_run import run_python
from lock_checks import start_holder

from dit_sp.io.runlock import holder

pytestmark = pytest.mark.slow  # runs the CLIs
SMALL = ["--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=2", "--set", "grpo.steps=2"]
REFUSALS = {"neither": [], "resume": ["--resume"], "overwrite": ["--overwrite"]}


def train(out: Path, *extra: str) -> list[str]:
    """The bundled toy recipe, smaller steps: a run of 2 steps, checkpointed at its end."""
    return [sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_toy", "--max-steps", "2",
            "--output-dir", str(out), *SMALL, *extra]  # fmt: skip


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The error line a refused CLI ends with (exit 2, no traceback)."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), result.stderr[-3000:]
    return last


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A real run (``--config grpo_toy --max-steps 2``), and three more runs into its directory started while
    it ran (no flag, ``--resume``, ``--overwrite``): ``(directory, first run's pid, its exit status, the
    refused runs' results)``."""
    out = tmp_path_factory.mktemp("trust") / "run"
    first = subprocess.Popen(train(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not holder(out) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    refused = {name: run_python(train(out, *flags), timeout=120) for name, flags in REFUSALS.items()}
    still_running = first.poll() is None
    _, stderr = first.communicate(timeout=900)
    assert first.returncode == 0, stderr[-3000:]
    assert still_running, "the first run ended before the others were tried: the test proves nothing"
    return out, first.pid, refused


@pytest.mark.parametrize("flags", sorted(REFUSALS))
def test_a_second_run_into_a_running_runs_directory_is_refused_naming_the_holder(toy_run, flags):
    out, pid, refused = toy_run
    line = one_line_error(refused[flags])
    assert f"{out} is in use by another run (pid {pid} on " in line and "pipelines/train_grpo.py" in line, line
    assert [r["step"] for r in rows(out)] == [0, 1], "the first run's metrics were touched"
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000002"]


@pytest.fixture
def run_copy(toy_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(toy_run[0], copy)
    return copy


@pytest.mark.parametrize("where", sorted(PLANTS))
def test_a_payload_planted_in_a_checkpoint_never_runs_on_resume(run_copy, tmp_path, where):
    marker = tmp_path / "payload_ran"
    PLANTS[where](run_copy / "checkpoints" / "step_00000002", marker)
    result = run_python(train(run_copy, "--resume", "--max-steps", "3"), timeout=300)
    assert not marker.exists(), "the planted payload ran"
    line = one_line_error(result)
    assert "refusing to load it, since loading could run code" in line and "posix.system" in line, line
    assert [r["step"] for r in rows(run_copy)] == [0, 1]


def test_a_resume_refuses_structural_and_unasked_changes_in_one_line(run_copy):
    before = (run_copy / "config.yaml").read_text()
    line = one_line_error(run_python(train(run_copy, "--resume", "--set", "lora.rank=4"), timeout=120))
    assert "lora.rank 8 -> 4 would change what the checkpoints of" in line, line
    line = one_line_error(run_python(train(run_copy, "--resume", "--set", "lora.rank=4", "--allow-change",
                                           "lora.rank"), timeout=120))  # fmt: skip
    assert "lora.rank 8 -> 4" in line, "a structural change is refused even when asked for"
    line = one_line_error(run_python(train(run_copy, "--resume", "--set", "optim.lr=0.001", "--set",
                                           "grpo.group_size=4"), timeout=120))  # fmt: skip
    assert "grpo.group_size 2 -> 4, optim.lr 0.0003 -> 0.001" in line, line
    assert "--allow-change grpo.group_size --allow-change optim.lr" in line, line
    assert (run_copy / "config.yaml").read_text() == before and not (run_copy / "config_changes.jsonl").exists()


def test_an_allowed_change_takes_effect_and_is_recorded_beside_the_original(toy_run, run_copy):
    result = run_python(train(run_copy, "--resume", "--max-steps", "3", "--set", "optim.lr=0.001",
                              "--allow-change", "optim.lr"), timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    changes = [json.loads(line) for line in (run_copy / "config_changes.jsonl").read_text().splitlines()]
    assert changes == [{"step": 2, "key": "optim.lr", "old": 0.0003, "new": 0.001}]
    record = (run_copy / "config.yaml").read_text()
    assert yaml.safe_load(record)["optim"]["lr"] == 0.0003, "config.yaml keeps the run's first settings"
    assert "# changed on resume, from step 2: optim.lr: 0.0003 -> 0.001" in record
    logged, first = rows(run_copy), rows(toy_run[0])
    assert logged[:2] == first and [r["lr"] for r in logged] == [0.0003, 0.0003, 0.001]
    # the run's settings are now the changed ones: going back is a change too
    line = one_line_error(run_python(train(run_copy, "--resume", "--max-steps", "4"), timeout=120))
    assert "optim.lr 0.001 -> 0.0003" in line, line


def test_a_generate_batch_into_a_locked_directory_is_refused(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red ball\n")
    proc = start_holder(tmp_path / "videos")
    try:
        result = run_python([sys.executable, "-m", "pipelines.generate", "--model", "tiny-wan", "--prompts",
                             str(prompts), "--out", str(tmp_path / "videos.mp4")], timeout=120)  # fmt: skip
    finally:
        proc.kill()
        proc.join()
    line = one_line_error(result)
    assert f"{tmp_path / 'videos'} is in use by another run (pid {proc.pid} on " in line, line
