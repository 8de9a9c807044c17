"""The ``dit-sp`` console script (pyproject.toml's ``[project.scripts]``): one command with the CLIs as its
subcommands, beside ``python -m pipelines.*``. ``dit-sp generate --ulysses 2`` runs ``pipelines.generate``'s
``main`` with ``--ulysses 2``, its usage line reading ``dit-sp generate``; a command's module is imported only
when it runs, and dit_sp too, so ``dit-sp --help`` (the commands, a line each) answers at once."""

from __future__ import annotations

import argparse
import importlib
import sys
from functools import partial

SCRIPT = "dit-sp"
"""= ``dit_sp.io.usage.SCRIPT``, not imported from there: importing dit_sp imports torch, and ``dit-sp --help``
should not wait for it."""
COMMANDS = {
    "generate": ("pipelines.generate", "generate videos, sequence-parallel on any layout"),
    "train": ("pipelines.train_grpo", "GRPO fine-tuning of a video DiT, with exact resume"),
    "serve": ("pipelines.serve", "serve a video model over HTTP (OpenAI's Videos API)"),
    "serve-reward": ("pipelines.reward_server", "serve a reward over HTTP for a trainer elsewhere"),
    "plan": ("pipelines.plan", "plan a GRPO run's memory per GPU before launching it"),
    "eval-toy": ("pipelines.eval_toy", "prompt faithfulness of a toy shape-world model"),
    "train-toy": ("pipelines.train_toy", "train the shipped toy text-to-video model"),
}
"""Subcommand: the module whose ``main(argv)`` it runs, and its line in ``dit-sp --help``."""

DESCRIPTION = f"""Sequence-parallel video diffusion transformers: sampling and GRPO training.

    {SCRIPT} generate --ulysses 2                 # = python -m pipelines.generate --ulysses 2
    {SCRIPT} train --config grpo_tiny_wan --ulysses 2
    {SCRIPT} COMMAND --help                       # a command's flags and their defaults

Each command is also a module: dit-sp train-toy = python -m pipelines.train_toy, and so on.
"""


def main(argv: list[str] | None = None) -> None:
    """Run ``dit-sp COMMAND [FLAGS...]``: the command's module with the flags."""
    argv = sys.argv[1:] if argv is None else list(argv)
    width = max(map(len, COMMANDS)) + 2
    table = "\n".join(f"  {name:{width}}{text}" for name, (_, text) in COMMANDS.items())
    parser = argparse.ArgumentParser(prog=SCRIPT, description=DESCRIPTION, epilog=f"commands:\n{table}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", help="one of the commands below")
    for name in COMMANDS:
        commands.add_parser(name, add_help=False)
    if not argv:
        parser.print_help(sys.stderr)
        sys.exit(2)
    command = parser.parse_args(argv[:1]).command  # the command's own flags are for its own parser
    from dit_sp.io.cli import run_main

    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"{SCRIPT} {command}", *argv[1:]]  # what its usage line shows (dit_sp.io.usage.prog)
    run_main(partial(module.main, argv[1:]))


if __name__ == "__main__":
    main()
