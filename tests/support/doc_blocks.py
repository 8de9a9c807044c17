"""The code blocks of a markdown page, and how the documentation tests run them (``tests/test_howto.py``): a
``python -m MODULE`` command as that runs it (forked with the imports done, ``cli_run.run_cli``), a python
block as a script in a worker (``run_snippet``, picklable by name for ``dit_sp.spawn``)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from cli_run import run_cli


def blocks(text: str, language: str) -> list[str]:
    """The fenced ```language blocks of a markdown text, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def languages(text: str) -> list[str]:
    """The language of every fenced block, in order (a block without one is ``""``)."""
    return re.findall(r"^```(\w*)\n(?:.*?)^```$", text, re.S | re.M)


def commands(block: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, trailing comments dropped."""
    joined = block.replace("\\\n", " ")
    lines = [re.sub(r"\s+#.*$", "", line) for line in joined.splitlines() if line.strip()]
    return [" ".join(line.split()) for line in lines]


def substitute(text: str, replacements: list[tuple[str, str]], where: str) -> str:
    """``text`` with each ``old`` replaced by ``new``; every ``old`` must be there (the page changed, else)."""
    for old, new in replacements:
        assert old in text, f"{where} no longer contains {old!r}: update its test"
        text = text.replace(old, new)
    return text


def run_command(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """A page's ``python -m MODULE ...`` command in ``cwd``; it must succeed."""
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-m"], f"not a python -m command: {command}"
    result = run_cli(argv[2], argv[3:], cwd=cwd, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def run_snippet(code: str, cwd: str, names: tuple[str, ...]) -> dict:
    """In a worker: run ``code`` as a script in ``cwd``; return the named variables it left."""
    os.chdir(cwd)
    scope: dict = {"__name__": "__main__"}
    exec(compile(code, "<howto>", "exec"), scope)
    return {name: scope[name] for name in names}
