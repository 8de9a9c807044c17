"""Start-up time of the CLIs: from the command to the first denoising step (the first transformer call of any
process), on 1 and 2 processes, beside ``python -c "import torch"`` and each CLI's ``--help``.

    python benchmarks/bench_startup.py                       # this checkout
    python benchmarks/bench_startup.py --repo /path/to/other/checkout --repeats 3

Every command runs in a fresh interpreter, as a user types it. A ``sitecustomize`` module on the path of the
command (and so of its fork server and workers) wraps ``WanTransformer3DModel.forward`` when diffusers loads it
and records the time of each process's first call; nothing in dit_sp is changed for the measurement. The
models are the built-in ``toy-wan`` (generate) and ``grpo_tiny_wan`` (train_grpo): their steps take
milliseconds, so what is measured is start-up: imports, worker launch, loading, set-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOOK = """
import os, sys, time
_mark = os.environ.get("BENCH_STARTUP_MARK")
if _mark:
    import importlib.abc, importlib.machinery

    class _FirstCall(importlib.abc.MetaPathFinder):
        NAME = "diffusers.models.transformers.transformer_wan"

        def find_spec(self, name, path, target=None):
            if name != self.NAME:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                cls = module.WanTransformer3DModel
                forward = cls.forward

                def first(self, *args, **kwargs):
                    path = os.path.join(_mark, f"first.{os.getpid()}")
                    if not os.path.exists(path):
                        with open(path, "w") as f:
                            f.write(repr(time.time()))
                    return forward(self, *args, **kwargs)

                cls.forward = first

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _FirstCall())
"""

COMMANDS = {
    "generate": ["-m", "pipelines.generate", "--steps", "2", "--frames", "5", "--out", "{tmp}/v.mp4"],
    "train_grpo": ["-m", "pipelines.train_grpo", "--config", "grpo_tiny_wan", "--max-steps", "1",
                   "--checkpoint-every", "0", "--output-dir", "{tmp}/run", "--overwrite"],
}  # fmt: skip
HELP = ["generate", "train_grpo", "plan", "reward_server", "eval_toy", "train_toy"]


def run(argv: list[str], repo: Path, hook_dir: Path, timeout: float = 900) -> tuple[float, float | None]:
    """Seconds to the first transformer call (None if there was none) and to the end of the command."""
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        marks = Path(tmp) / "marks"
        marks.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook_dir), str(repo)]),
               "BENCH_STARTUP_MARK": str(marks)}  # fmt: skip
        command = [sys.executable, *(a.format(tmp=tmp) for a in argv)]
        start = time.time()
        result = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        end = time.time()
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
        firsts = [float(p.read_text()) for p in marks.glob("first.*")]
        return (min(firsts) - start if firsts else None), end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose CLIs are timed (default: this one)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2, help="runs of each command; the median is shown")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--no-help", dest="help", action="store_false", help="skip the --help and import rows")
    args = parser.parse_args()
    repo = args.repo.resolve()
    with tempfile.TemporaryDirectory(prefix="bench_startup_hook_") as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(HOOK)
        hook = Path(hook_dir)

        def median(argv: list[str]) -> tuple[float | None, float]:
            runs = [run(argv, repo, hook) for _ in range(args.repeats)]
            firsts = [f for f, _ in runs if f is not None]
            return (statistics.median(firsts) if firsts else None), statistics.median(t for _, t in runs)

        print(f"checkout: {repo}; median of {args.repeats} runs; seconds\n")
        label = 'python -c "import torch"'
        print(f"{label:<44}{median(['-c', 'import torch'])[1]:>8.2f}")
        for name in HELP if args.help else ():
            label = f"python -m pipelines.{name} --help"
            print(f"{label:<44}{median(['-m', f'pipelines.{name}', '--help'])[1]:>8.2f}", flush=True)
        print(f"\n{'command':<24}{'processes':>10}{'to first step':>15}{'whole command':>15}")
        for name, argv in ((n, COMMANDS[n]) for n in args.commands):
            for n in args.processes:
                first, total = median(argv + (["--ulysses", str(n)] if n > 1 else []))
                shown = f"{first:>15.2f}" if first is not None else f"{'-':>15}"
                print(f"{name:<24}{n:>10}{shown}{total:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
