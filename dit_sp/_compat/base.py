"""What the private-API wrappers share: the tested versions and the error they raise."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable

TESTED = {"torch": ">=2.13,<2.14", "diffusers": ">=0.42,<0.43"}
"""The versions every private API below was checked against."""


class CompatibilityError(RuntimeError):
    """A private API of torch or diffusers that dit-sp needs is missing or changed."""


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _error(package: str, what: str, detail: str = "") -> CompatibilityError:
    return CompatibilityError(
        f"dit-sp needs {what} ({package} {TESTED[package]} tested); your {package} {_version(package)} lacks it"
        f"{detail}: install a supported version (pip install '{package}{TESTED[package]}')"
    )


def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
