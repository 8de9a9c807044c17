"""The errors a user can fix: a CLI prints them as one line (no traceback) and exits with status 2.

Anything else is an internal error and keeps its traceback.
"""

from __future__ import annotations

import importlib.util


class ConfigError(ValueError):
    """A setting, flag, file or layout that is not valid; the message names it and says what would be."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A file or directory the settings name does not exist."""


class MissingPackageError(ConfigError, ImportError):
    """An optional package that a setting needs is not installed; the message gives the pip command."""


class RunStopped(ConfigError):
    """A run stopped on one of its documented conditions (e.g. ``max_skipped_steps`` updates in a row without
    a reward): not a bug, so it ends as one line saying why and what to change, like a bad setting."""


class LayoutRefused(ConfigError, NotImplementedError):
    """A layout a model's attention cannot split exactly (a ring for an attention only Ulysses splits): refused like
    every split dit-sp cannot make (``NotImplementedError``), and a user's setting (``ConfigError``), so a CLI says
    it in one line."""


def require_package(package: str, needed_for: str, extra: str) -> None:
    """``MissingPackageError`` unless ``package`` can be imported: "``needed_for`` needs PACKAGE: pip install
    'dit-sp[EXTRA]' (or pip install PACKAGE)". Looked up, not imported: the check is cheap, so callers run it
    before anything heavy starts."""
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken install, or a stub in sys.modules
        found = False
    if not found:
        raise MissingPackageError(f"{needed_for} needs the {package} package: pip install 'dit-sp[{extra}]' "
                                  f"(or pip install {package})")  # fmt: skip
