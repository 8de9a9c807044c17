"""The CLIs' own float flags (outside the typed configs) refuse NaN and infinities in one line, and eval_toy
reads its prompt file as UTF-8 (one line saying where, otherwise)."""

from __future__ import annotations

import pytest
from cli_run import run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "module, argv, message",
    [
        ("pipelines.eval_toy", ["--guidance", "nan"], "argument --guidance: expected a finite number, got 'nan'"),
        ("pipelines.plan", ["--gpus", "8", "--gpu-memory", "inf"], "argument --gpu-memory: expected a finite number"),
        ("pipelines.plan", ["--gpus", "8", "--gpu-memory", "0"], "--gpu-memory must be > 0 GiB, got 0.0"),
    ],
)
def test_a_non_finite_float_flag_is_one_line(tmp_path, module, argv, message):
    result = run_cli(module, argv, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("error: ") == 1 and message in result.stderr, result.stderr


def test_eval_toy_names_a_prompt_file_that_is_not_utf8(tmp_path):
    (tmp_path / "p.txt").write_bytes(b"a red circle\nblue \xff square\n")
    result = run_cli("pipelines.eval_toy", ["--prompts", str(tmp_path / "p.txt")], cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "p.txt:2" in result.stderr and "UTF-8" in result.stderr, result.stderr
