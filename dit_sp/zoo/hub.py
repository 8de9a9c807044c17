"""Hugging Face hub ids (``ORG/NAME``) as models: the snapshot in the local hub cache, found without the
network, so that ``--model Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` works once it was downloaded, and says in one
line how to download it when it was not.

The cache is huggingface_hub's own (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``),
read at the revision ``refs/main`` points to, as ``hf download ORG/NAME`` leaves it. dit-sp never downloads:
a run on many nodes must not start many downloads, and a missing model is better known before any start."""

from __future__ import annotations

import re
from pathlib import Path

from dit_sp.errors import MissingFileError

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+")
"""What the hub accepts as a model id (``huggingface_hub``'s own check runs too, on lookup)."""


def is_hub_id(model: str | Path) -> bool:
    """Whether ``model`` has the form of a hub model id: ``ORG/NAME``, relative, no ``..`` or ``--``."""
    name = str(model)
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name and "--" not in name and not name.endswith(".")


def download_command(repo_id: str) -> str:
    """The command that fetches ``repo_id`` with the installed huggingface_hub: its ``hf`` CLI (1.x), or the
    older ``huggingface-cli``."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        scripts = {e.name for e in distribution("huggingface_hub").entry_points if e.group == "console_scripts"}
    except PackageNotFoundError:
        scripts = set()
    cli = "hf" if "hf" in scripts or "huggingface-cli" not in scripts else "huggingface-cli"
    return f"{cli} download {repo_id}"


def cache_dir() -> str:
    """The hub cache huggingface_hub reads (``HF_HUB_CACHE`` / ``HF_HOME`` as set when it was imported)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cached_snapshot(repo_id: str) -> Path:
    """The directory of ``repo_id``'s cached snapshot (``refs/main``), read offline; ``MissingFileError`` in
    one line naming the cache and the download command where it is not there (or is incomplete)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    command = download_command(repo_id)
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except HFValidationError as e:
        raise MissingFileError(f"model {repo_id}: no such local directory, and not a valid hub id ({e})") from e
    except LocalEntryNotFoundError as e:
        incomplete = type(e).__name__ == "IncompleteSnapshotError"
        what = "is only partly in" if incomplete else "is not in"
        raise MissingFileError(
            f"model {repo_id}: no such local directory, and the Hugging Face model {repo_id} {what} the local "
            f"cache {cache_dir()} (HF_HUB_CACHE); fetch it with `{command}`, or give a local directory"
        ) from e
