"""The test tree mirrors the packages (tests/rl/ for dit_sp.rl, tests/pipelines/ for the CLIs, ...); the shared
checks that spawned workers import by name (usp_checks, grpo_checks, ...) live in tests/support/."""

import sys
from pathlib import Path

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

# The longest modules first. `--dist loadscope` hands whole modules to the test workers in collection order, so
# one of these collected last would keep one worker busy for minutes while the other has nothing left to do.
LONGEST_FIRST = (
    "tests/test_readme.py",
    "tests/weights/test_memory.py",
    "tests/rl/test_trainer.py",
    "tests/pipelines/test_faults.py",
    "tests/test_howto.py",
    "tests/cache/test_cache.py",
    "tests/memory/test_planner.py",
    "tests/pipelines/test_generate_edit_variants.py",
    "tests/pipelines/test_generate_animate_latte.py",
    "tests/pipelines/test_generate_wan_hunyuan_variants.py",
    "tests/pipelines/test_generate_families.py",
)


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parent.parent
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).resolve().relative_to(root).as_posix(), len(rank)))
