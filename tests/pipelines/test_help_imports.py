"""``--help`` answers without importing torch: every ``python -m pipelines.X --help`` and ``dit-sp COMMAND
--help`` runs in one fresh interpreter (no fork server, nothing preloaded), and after each the heavy libraries
must still be absent from ``sys.modules``. ``import dit_sp`` alone imports none of them either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_help import CLIS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "diffusers", "transformers", "numpy")

PROBE = """
import contextlib, io, json, runpy, sys
heavy = {heavy!r}
report = {{}}
import dit_sp
report["import dit_sp"] = [m for m in heavy if m in sys.modules]
for name, argv in {runs!r}:
    sys.argv = argv
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(name, run_name="__main__")
    except SystemExit as e:
        code = e.code
    else:
        code = None
    report[" ".join(argv)] = [m for m in heavy if m in sys.modules] + ([] if code in (0, None) else [f"exit {{code}}"])
    report[" ".join(argv)] += [] if "usage:" in out.getvalue() else ["no usage"]
print(json.dumps(report))
"""


def test_help_imports_no_torch(tmp_path):
    runs = [(f"pipelines.{module}", [f"pipelines/{module}.py", "--help"]) for module in CLIS]
    runs += [("pipelines.cli", ["dit-sp", command, "--help"]) for command in CLIS.values()]
    code = PROBE.format(heavy=HEAVY, runs=runs)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report) == 1 + 2 * len(CLIS), report
    assert all(found == [] for found in report.values()), {run: found for run, found in report.items() if found}
