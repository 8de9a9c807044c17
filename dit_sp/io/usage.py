"""How the command-line entry points describe themselves: the command a user typed (``prog``: ``python -m
pipelines.generate``, or ``dit-sp generate`` under the console script) and every flag's default beside its help
(``HelpFormatter``), so that ``--help`` answers "what happens if I leave this out" without reading the code."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

SCRIPT = "dit-sp"
"""The console script (``pipelines.cli``); it names the subcommand it runs in ``sys.argv[0]``."""


def prog(module: str) -> str:
    """The usage name of the CLI in ``module``: ``dit-sp generate`` when the console script runs it, else
    ``python -m pipelines.generate`` (argparse's own choice, the file name ``generate.py``, cannot be run)."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name.startswith(f"{SCRIPT} ") else f"python -m {module}"


def shown(value: Any) -> str:
    """A default as ``--help`` shows it: ``on``/``off`` for a switch, ``none`` for an unset value."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return '""'
    return "none" if value is None else str(value)


def with_default(text: str, value: Any) -> str:
    """``text (default: VALUE)``, unless ``text`` already says its default (``(default 80)``, ``default: off``)."""
    return text if "default" in text else f"{text} (default: {shown(value)})"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written (its examples keep their lines), and each optional flag's default after
    its help (``with_default``); a required flag says so instead. argparse's ``ArgumentDefaultsHelpFormatter``
    prints ``None`` and ``False``, which a reader has to translate."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        # names stay whole (toy-wan, tiny-minimax-h3): argparse's wrapping would break them at a hyphen
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "%(default)" in text:
            return action.help
        if action.required:
            return f"{text} (required)"
        return with_default(text, shown(action.default).replace("%", "%%"))  # the help is a %-format
