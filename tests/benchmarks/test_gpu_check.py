"""The GPU check script's logic, run on the CPU kernels so it cannot rot between GPU loans."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_gpu_check_runs_on_cpu():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    result = subprocess.run(
        [sys.executable, str(script), "--device", "cpu", "--quick"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 failed" in result.stdout.splitlines()[-1]
