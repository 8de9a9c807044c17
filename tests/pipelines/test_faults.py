"""Nothing lost, no orphan, no traceback: the CLIs and the trainer under signals, reused directories,
damaged checkpoints, non-finite numbers, disagreeing ranks and a change of layout."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest
from cli_run import run_python
from fault_checks import generate_with_rank_prompt, nan_loss_on_one_rank, train_with_rank_settings
from grpo_checks import tiny_config

from dit_sp import GenerateConfig, spawn

pytestmark = pytest.mark.slow  # runs the CLIs and spawns workers
SMALL = ["--set", "sample.frames=5", "--set", "grpo.steps=2", "--set", "grpo.group_size=2",
         "--set", "grpo.prompts_per_step=2", "--set", "optim.lr=0.001"]  # fmt: skip


def train_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_tiny_wan", "--output-dir", str(out),
            "--eval-every", "0", *SMALL, *extra]  # fmt: skip


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def descendants(pid: int) -> list[int]:
    """Live processes below ``pid`` (from /proc): the workers, the fork server they fork from, helpers."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += sorted(frontier)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _as_in_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a shell ignores SIGINT in jobs it starts in the background (CI's
    runner may be one), and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def start_training(tmp_path: Path):
    """Starts a 2-worker run, returned once both workers have finished a step: (launcher, worker pids,
    TMPDIR). Whatever the test leaves running is killed after it, so a failure cannot slow the tests after
    it down with a run of 1000 steps."""
    started: list[tuple[subprocess.Popen, list[int]]] = []

    def start(*extra: str) -> tuple[subprocess.Popen, list[int], Path]:
        tmpdir = tmp_path / "tmp"
        tmpdir.mkdir(exist_ok=True)
        out = tmp_path / "run"
        proc = subprocess.Popen(train_cmd(out, "--ulysses", "2", "--max-steps", "1000", *extra),
                                env=os.environ | {"TMPDIR": str(tmpdir)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, preexec_fn=_as_in_a_terminal)  # fmt: skip
        started.append((proc, []))

        def first_step() -> bool:
            assert proc.poll() is None, f"the run ended (exit {proc.returncode}): {proc.stderr.read()[-3000:]}"
            return (out / "metrics.jsonl").exists() and bool((out / "metrics.jsonl").read_text().strip())

        wait_for(first_step, 300, "the first step")
        workers = descendants(proc.pid)
        started[-1][1].extend(workers)
        assert len(workers) >= 3, workers  # two workers and the fork server (and multiprocessing's tracker)
        return proc, workers, tmpdir

    yield start
    for proc, workers in started:
        for pid in [*descendants(proc.pid), *workers, proc.pid]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_worker_and_cleans_up(start_training, sig):
    proc, workers, tmpdir = start_training()
    os.kill(proc.pid, sig)  # the launcher only, as a scheduler or a closed terminal does
    proc.wait(timeout=20)
    assert proc.returncode == 128 + sig, proc.stderr.read()[-2000:]
    wait_for(lambda: not any(alive(pid) for pid in workers), 30, "the workers to exit")  # slow under load
    assert not list(tmpdir.glob("dit_sp_spawn_*")), "the launcher's temporary directory was left behind"
    assert "Traceback" not in proc.stderr.read()


def test_workers_exit_when_their_launcher_is_killed(start_training):
    proc, workers, _ = start_training()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in workers), 15, "orphaned workers to exit by themselves")


def file_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_runs_never_clobber_runs(tmp_path):
    out = tmp_path / "run"
    run_python(train_cmd(out, "--max-steps", "2", "--checkpoint-every", "1"), check=True, timeout=600)
    before = file_hashes(out)
    again = run_python(train_cmd(out, "--max-steps", "2"), timeout=120)
    assert again.returncode == 2 and "already holds a run" in again.stderr and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    assert file_hashes(out) == before, "a refused run must not touch the first run's files"
    empty = tmp_path / "empty"
    resume = run_python(train_cmd(empty, "--resume"), timeout=120)
    assert resume.returncode == 2 and "holds no complete checkpoint" in resume.stderr
    replaced = run_python(train_cmd(out, "--max-steps", "1", "--overwrite"), timeout=600)
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert [r["step"] for r in rows(out)] == [0]
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_00000001"]


@pytest.mark.parametrize(
    ("out", "message"),
    [("/proc/x.mp4", "cannot write to /proc"), ("x.webm", "unknown video format '.webm'")],
)
def test_outputs_that_cannot_be_written_are_errors(tmp_path, out, message):
    result = run_python(
        [sys.executable, "-m", "pipelines.generate", "--model", "tiny-wan", "--steps", "1", "--out", out],
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and message in result.stderr and "wrote" not in result.stdout, result.stderr


def test_outputs_are_replaced_whole(tmp_path):
    from dit_sp.io.video import save_video

    frames = __import__("numpy").random.rand(3, 8, 8, 3)
    target = tmp_path / "frames"
    target.mkdir()
    for i in range(5):  # an older, longer video in the same directory
        (target / f"frame_{i:04d}.png").write_bytes(b"old")
    save_video(frames, target)
    assert sorted(p.name for p in target.iterdir()) == [f"frame_{i:04d}.png" for i in range(3)]
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds other files than frames"):
        save_video(frames, target)
    assert [p.name for p in tmp_path.iterdir()] == ["frames"], "no temporary files are left behind"


def test_a_reward_that_fails_everywhere_trains_nothing_and_is_logged(tmp_path):
    out = tmp_path / "run"
    result = run_python(
        train_cmd(out, "--max-steps", "2", "--set", "reward=tests.support.rewards_for_tests:nan_reward"),
        timeout=600,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    logged = rows(out)
    assert all(r["reward_failed"] == 4 and r["masked"] == 4 and r["reward_mean"] is None for r in logged)
    assert all(r["loss"] == 0.0 and r["grad_norm"] == 0.0 for r in logged)
    # no sample scored: the update is skipped (Adam's momentum would still move the weights), and counted
    assert [r["skipped_steps"] for r in logged] == [1, 2]


def test_a_nan_loss_on_one_rank_skips_the_update_on_every_rank():
    config = tiny_config(ulysses=2, max_skipped_steps=2, checkpoint_every=0)
    results = spawn(nan_loss_on_one_rank, 2, args=(config, 1), timeout=600)
    for result in results:
        assert result["finite"] and result["unchanged"], "non-finite numbers reached the weights"
        assert "2 updates in a row" in result["error"] and "max_skipped_steps" in result["error"]
        assert [r.get("skipped_steps") for r in result["rows"]] == [0, 1]  # the step that raised is not returned
    assert all(r["rows"][1]["grad_norm"] == results[0]["rows"][1]["grad_norm"] for r in results)


def test_a_damaged_latest_checkpoint_and_a_torn_metrics_line_are_survived(tmp_path):
    damaged = tmp_path / "damaged"
    run_python(train_cmd(damaged, "--max-steps", "3", "--checkpoint-every", "1"), check=True, timeout=600)
    expected = rows(damaged)  # what the uninterrupted run logged: the resumed step must log the same
    assert [p.name for p in sorted((damaged / "checkpoints").iterdir())] == ["step_00000002", "step_00000003"]
    latest = damaged / "checkpoints" / "step_00000003"
    shard = next(latest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])  # truncated, as by a full disk
    logged = (damaged / "metrics.jsonl").read_text().splitlines(keepends=True)
    # step 2's line torn by a crash while writing it: the line the resumed run logs must be its own
    (damaged / "metrics.jsonl").write_text("".join(logged[:2]) + '{"step": 2, "loss": 0.1')
    (damaged / "checkpoints" / "step_00000004.tmp").mkdir()  # a crash during a later save
    result = run_python(train_cmd(damaged, "--max-steps", "3", "--checkpoint-every", "1", "--resume"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step_00000003 cannot be loaded" in result.stderr  # the warning says which one was skipped
    resumed = rows(damaged)
    assert [r["step"] for r in resumed] == list(range(3))
    for a, b in zip(resumed, expected):
        assert a["loss"] == b["loss"] and a["reward_mean"] == b["reward_mean"], (a, b)
    assert not list((damaged / "checkpoints").glob("*.tmp"))


def test_ranks_that_disagree_are_refused(tmp_path):
    config = tiny_config(ulysses=2, output_dir=str(tmp_path / "run"))
    messages = spawn(train_with_rank_settings, 2, args=(config, {"seed": 1}), timeout=300)
    assert all("ranks [1] have other settings or prompts than rank 0" in m for m in messages), messages
    settings = GenerateConfig.load(overrides={"model": "tiny-wan", "ulysses": 2, "out": str(tmp_path / "v.mp4")})
    messages = spawn(generate_with_rank_prompt, 2, args=(settings,), timeout=300)
    assert all("ranks [1] have other settings than rank 0" in m for m in messages), messages
    assert not (tmp_path / "v.mp4").exists()


def test_resume_on_another_layout_continues_the_same_run(tmp_path):
    """Checkpointed on dp 2, resumed on Ulysses 2 (DCP reshards): the resumed steps log what an uninterrupted
    dp-2 run logs."""
    moved = tmp_path / "moved"
    run_python(train_cmd(moved, "--dp", "2", "--max-steps", "2", "--checkpoint-every", "1"), check=True, timeout=600)
    expected = rows(moved)  # the uninterrupted dp-2 run's steps 0 and 1
    # as if stopped during its second step: no step 2 checkpoint, no line for it; resumed from step 1
    shutil.rmtree(moved / "checkpoints" / "step_00000002")
    (moved / "metrics.jsonl").write_text((moved / "metrics.jsonl").read_text().splitlines(keepends=True)[0])
    result = run_python(train_cmd(moved, "--ulysses", "2", "--max-steps", "2", "--resume"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = rows(moved)
    assert [r["step"] for r in resumed] == [0, 1]
    for a, b in zip(resumed[1:], expected[1:]):
        for key in ("loss", "reward_mean", "grad_norm", "ratio_mean"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(b[key])), (key, a, b)


EXITS_CLEANLY = """
import atexit, os, sys, torch.distributed as dist
from dit_sp import ParallelConfig, init_parallel
report = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.txt")
atexit.register(lambda: open(report, "w").write(str(dist.is_initialized())))  # runs after dit_sp's
parallel = init_parallel(ParallelConfig(ulysses=2))
dist.all_reduce(__import__("torch").ones(1), group=parallel.sp_group)
"""


def test_a_torchrun_script_that_returns_leaves_no_process_group_to_finalization(tmp_path):
    """Left alive into interpreter finalization, gloo's threads can abort a rank that finished its work
    (SIGABRT, "terminate called without an active exception"): init_parallel's group is destroyed at exit."""
    script = tmp_path / "job.py"
    script.write_text(EXITS_CLEANLY)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # One file per rank: two ranks printing to one inherited pipe at exit interleave their lines.
    left_at_exit = [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(2)]
    assert left_at_exit == ["False", "False"], left_at_exit
