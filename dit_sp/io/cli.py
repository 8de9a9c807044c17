"""How the command-line entry points end: a user error (``ConfigError``, in this process or raised by a
worker) is one line on stderr and exit status 2; a launcher stopped by a signal says so and exits with
128 + the signal; an internal error keeps its traceback (a worker's comes with the first rank that failed)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

from dit_sp.errors import ConfigError
from dit_sp.parallel.launch import LauncherStopped, WorkerError


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
