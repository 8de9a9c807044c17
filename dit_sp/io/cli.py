"""What the command-line entry points share: how they launch (``launch``: here under torchrun or for one
process, else on local workers), ``KEY=VALUE`` flags (``parse_key_values``), and how they end: a user error
(``ConfigError``, in this process or raised by a worker) is one line on stderr and exit status 2; a launcher
stopped by a signal says so and exits with 128 + the signal; an internal error keeps its traceback (a
worker's comes with the first rank that failed). Their flags are parsed by ``ArgumentParser``, whose errors are
one line too."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import yaml

from dit_sp.errors import ConfigError
from dit_sp.parallel.launch import LauncherStopped, WorkerError, by_name, spawn


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with a one-line error: ``error: MESSAGE (see python -m pipelines.X --help)``, exit 2.

    argparse prints the whole usage block before its error, which for a CLI with thirty flags buries the
    one line that says what is wrong; ``--help`` still prints the usage in full. The CLIs pass
    ``prog=dit_sp.io.usage.prog(MODULE)``, the command the user typed."""

    def error(self, message: str) -> NoReturn:
        _exit(f"error: {message} (see {self.prog} --help)", 2)


def finite_float(text: str) -> float:
    """An argparse ``type`` for a float flag outside the typed configs: NaN and infinities are refused, as
    ``dit_sp.io.schema`` refuses them in every config."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def launch(fn: Callable[..., Any] | str, world_size: int, args: tuple = ()) -> list[Any]:
    """``fn(*args)`` in this process when it is one rank of torchrun's (``RANK`` set) or ``world_size`` is 1,
    else on ``world_size`` local worker processes (``spawn``, no timeout): the results, one per process run.
    ``fn`` may be named ``"module:function"``: then only the process that runs it imports its module (a
    launcher of local workers never imports torch)."""
    if isinstance(fn, str):
        fn = by_name(fn)
    if "RANK" in os.environ or world_size == 1:
        return [fn(*args)]
    return spawn(fn, world_size, args=args, timeout=None)


def parse_key_values(items: Iterable[str], flag: str, example: str) -> dict[str, Any]:
    """``KEY=VALUE`` flag values as ``{KEY: VALUE}``, each value read as YAML (``4``, ``true``, ``[1, 2]``);
    ``ConfigError`` for an item without ``=`` or a key, e.g. ``--set x: expected KEY=VALUE, e.g. --set EXAMPLE``."""
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item}: expected KEY=VALUE, e.g. {flag} {example}")
        values[key.strip()] = yaml.safe_load(value)
    return values


def _exit(message: str, status: int) -> NoReturn:
    print(message, file=sys.stderr, flush=True)
    sys.exit(status)


def run_main(main: Callable[[], Any]) -> None:
    """Run a CLI's ``main`` with the exit behaviour above."""
    try:
        main()
    except ConfigError as e:
        _exit(f"error: {e}", 2)
    except WorkerError as e:
        if isinstance(e.cause, ConfigError):
            _exit(f"error: {e.cause}", 2)
        _exit(f"error: {e}", 1)
    except LauncherStopped as e:
        _exit(str(e), 128 + e.signum)
    except KeyboardInterrupt:
        _exit("interrupted: every worker was stopped", 130)
