"""The test tree mirrors the packages (tests/rl/ for dit_sp.rl, tests/pipelines/ for the CLIs, ...); the shared
checks that spawned workers import by name (usp_checks, grpo_checks, ...) live in tests/support/."""

import sys
from pathlib import Path

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)
