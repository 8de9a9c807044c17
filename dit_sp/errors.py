"""The errors a user can fix: a CLI prints them as one line (no traceback) and exits with status 2.

Anything else is an internal error and keeps its traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting, flag, file or layout that is not valid; the message names it and says what would be."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A file or directory the settings name does not exist."""
