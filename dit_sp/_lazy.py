"""Names a package exports but imports only on first use (PEP 562), so that importing the package, and so every
CLI's ``--help``, imports no torch."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``where`` is read from its module when first asked
    for, then kept in the package's namespace, so later lookups are plain attribute reads."""

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted([*vars(sys.modules[package]), *where])

    return getattr_, dir_
