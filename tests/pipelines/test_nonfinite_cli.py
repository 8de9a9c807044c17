"""Numbers at the CLIs: a NaN or infinite float, or an out-of-range seed, given as a flag, in a YAML file or by
``--set``, stops the run before anything loads, with exit status 2 and one error line naming the key.

Before this was checked, ``generate --guidance nan`` ran with guidance silently off, ``--guidance inf`` wrote a
black (NaN) video, ``lr: .nan`` and ``clip_range: .nan`` failed in training with tracebacks, and a seed of
2**64 was a traceback from ``torch.Generator.manual_seed``."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_run import run_cli

pytestmark = pytest.mark.slow  # one CLI process per case (forked from a server with the imports done)
TRAIN = ["--config", "grpo_tiny_wan", "--max-steps", "1"]

# (id, CLI module, argv, files to write first {name: text}, the error line as a regex)
CASES = [
    ("gen-guidance-nan", "generate", ["--guidance", "nan"], {},
     r"settings\.guidance: expected a finite number, got 'nan' \(str\)$"),
    ("gen-guidance-inf", "generate", ["--guidance", "inf"], {},
     r"settings\.guidance: expected a finite number, got 'inf'"),
    ("gen-seed-huge", "generate", ["--seed", str(2**64)], {},
     r"settings: seed must be in \[0, 9223372036854775807\] \(0 to 2\*\*63 - 1\), got 18446744073709551616$"),
    ("gen-yaml-inf", "generate", ["--config", "{tmp}/g.yaml"], {"g.yaml": "embedded_guidance: -.inf\n"},
     r"g\.yaml\.embedded_guidance: expected a finite number or null, got -inf \(float\)$"),
    ("train-yaml-lr-nan", "train_grpo", ["--config", "{tmp}/t.yaml", "--max-steps", "1"],
     {"t.yaml": "model: tiny-wan\noptim: {lr: .nan}\n"},
     r"t\.yaml\.optim\.lr: expected a finite number, got nan \(float\)$"),
    ("train-set-clip-nan", "train_grpo", [*TRAIN, "--set", "grpo.clip_range=.nan"], {},
     r"grpo_tiny_wan\.grpo\.clip_range: expected a finite number, got nan \(float\)$"),
    ("train-set-steps-neg", "train_grpo", [*TRAIN, "--set", "grpo.steps=-1"], {}, r"grpo: steps must be >= 1, got -1$"),
    ("train-seed-huge", "train_grpo", [*TRAIN, "--seed", str(2**63)], {},
     r"seed must be in \[0, 9223372036854775807\] \(0 to 2\*\*63 - 1\), got 9223372036854775808$"),
    ("train-reward-nan", "train_grpo", [*TRAIN, "--set", "reward={brightness: .nan}"], {},
     r"reward 'brightness': weight must be a finite number, got nan$"),
]  # fmt: skip


def _run_case(case: tuple, tmp: Path) -> subprocess.CompletedProcess:
    _, cli, argv, files, _ = case
    for name, text in files.items():
        (tmp / name).write_text(text)
    return run_cli(f"pipelines.{cli}", [arg.replace("{tmp}", str(tmp)) for arg in argv], cwd=tmp)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case's CLI run, two at a time (the cases are independent; this machine has 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        tmps = {case[0]: tmp_path_factory.mktemp(case[0]) for case in CASES}
        futures = {case[0]: pool.submit(_run_case, case, tmps[case[0]]) for case in CASES}
        return {name: (future.result(), tmps[name]) for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_number_is_one_error_line_and_exit_2(outcomes, case):
    result, tmp = outcomes[case[0]]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, result.stderr[-2000:]
    message = re.sub(r" \(see .* --help\)$", "", errors[0])  # the CLIs point to --help after the error
    assert re.search(case[4], message), result.stderr[-2000:]
    assert not (tmp / "outputs").exists(), "a refused run must not write outputs"
