"""docs/sde-recipes.md's long clips: the benchmark script runs (tiny sizes) and its layouts agree, and the
documented plan of Wan 2.1 1.3B at 81 frames of 480p is what the planner prints."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import blocks, commands, run_command

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "sde-recipes.md"


@pytest.mark.slow
def test_long_clip_benchmark_runs_and_its_layouts_agree(tmp_path):
    out = tmp_path / "rows.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "bench_long_clip.py"), "--frames", "5", "--height", "32",
            "--width", "32", "--warmup", "1", "--iters", "1", "--steps", "2", "--worlds", "1", "2",
            "--json", str(out)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO / "benchmarks")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["processes"], r["layout"]) for r in rows] == [(1, "-"), (2, "ulysses")]
    assert all(r["peak"] > r["growth"] >= 0 and r["first"] > 0 for r in rows)
    # the same samples, noise and seeds on every layout: the same rewards up to float rounding
    assert rows[1]["before"] == pytest.approx(rows[0]["before"], abs=1e-4)
    assert rows[1]["after"] == pytest.approx(rows[0]["after"], abs=1e-3)  # Adam may amplify rounding
    assert len(rows[0]["rewards"]) == 2 and rows[1]["rewards"] == pytest.approx(rows[0]["rewards"], abs=1e-3)
    assert "2 ulysses" in result.stdout and "training reward" in result.stdout


@pytest.mark.slow
def test_documented_wan_plan_is_the_planners():
    """The page's plan command (Ulysses 4) prints its table's row; the table's activations fall as 1/N."""
    text = PAGE.read_text()
    (command,) = commands(blocks(text, "bash")[0])
    out = run_command(command, REPO, timeout=300).stdout
    line = re.search(r"activations \(2 seq x 8190 tokens\)\s+([\d.]+) GiB", out)
    assert line and line.group(1) == "3.08" and "peak 6.0 GiB at training" in out, out
    rows = re.findall(r"^\| (\d) \(dp \d\) \| (\d+) \| ([\d.]+) GiB \| ([\d.]+) GiB \|", text, re.M)
    assert [r[0] for r in rows] == ["1", "2", "4"] and rows[2][1:] == ("8190", "3.08", "6.0")
    for degree, tokens, activations, _ in rows:
        assert int(tokens) == 32760 // int(degree)
        assert float(activations) == pytest.approx(float(rows[0][2]) / int(degree), rel=0.01)
