"""Hub ids as ``--model``: ``ORG/NAME`` is the snapshot in the local Hugging Face cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``), found without the network, for generate and train_grpo alike; a missing one is one line that
names the cache and the download command of the installed huggingface_hub (before: "model directory
ORG/NAME does not exist", no hint).

The cache directory is read when huggingface_hub is imported, so each case is a fresh ``python -m`` process with
its own environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dit_sp.errors import MissingFileError
from dit_sp.zoo import build_tiny, checkpoint_dir
from dit_sp.zoo.hub import download_command, is_hub_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SMALL = ["--frames", "5", "--height", "32", "--width", "32", "--steps", "1", "--max-sequence-length", "8"]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A hub cache as ``hf download tiny-org/tiny-wan`` leaves it: ``models--tiny-org--tiny-wan/snapshots/<commit>``
    (the tiny Wan pipeline, saved) and ``refs/main`` naming that commit."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--tiny-org--tiny-wan"
    build_tiny("tiny-wan").save_pretrained(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def _run(module: str, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -m pipelines.MODULE ARGV`` with the Hugging Face variables replaced by ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | env
    return subprocess.run([sys.executable, "-m", f"pipelines.{module}", *argv], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_hub_ids_and_paths_are_told_apart():
    assert is_hub_id("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") and is_hub_id("tiny-org/tiny-wan")
    for name in ("tiny-wan", "/ckpt/wan", "./wan", "a/b/c", "../x", "org/../x", "org--x/y", "org/"):
        assert not is_hub_id(name), name
    # huggingface_hub 1.x ships the `hf` CLI only (older ones: huggingface-cli)
    assert download_command("ORG/NAME") in ("hf download ORG/NAME", "huggingface-cli download ORG/NAME")


@pytest.mark.slow
def test_generate_reads_a_hub_id_from_the_cache(hub_cache, tmp_path):
    result = _run("generate", ["--model", "tiny-org/tiny-wan", *SMALL, "--out", str(tmp_path / "v.mp4")], tmp_path,
                  HF_HUB_CACHE=str(hub_cache), HF_HOME=str(tmp_path / "home"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "v.mp4").is_file()


def test_a_missing_hub_id_is_a_missing_file_error():
    """The Python API: ``dit_sp.zoo.checkpoint_dir`` (what generate, train_grpo and ``load_pipeline`` resolve
    ``--model`` with) raises ``MissingFileError`` (a ``ConfigError``) naming the download command."""
    with pytest.raises(MissingFileError, match=rf"fetch it with `{download_command('tiny-org/none')}`"):
        checkpoint_dir("tiny-org/none")


@pytest.mark.slow
def test_a_missing_hub_id_names_the_download_command(tmp_path):
    """Without ``HF_HUB_CACHE``, the cache is ``HF_HOME/hub``."""
    cache = tmp_path / "home" / "hub"
    result = _run("generate", ["--model", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], tmp_path, HF_HOME=str(cache.parent))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = re.sub(r" \(see .* --help\)$", "", result.stderr.splitlines()[-1])  # generate points to --help
    assert last.endswith(
        f"error: model Wan-AI/Wan2.1-T2V-1.3B-Diffusers: no such local directory, and the Hugging Face model "
        f"Wan-AI/Wan2.1-T2V-1.3B-Diffusers is not in the local cache {cache} (HF_HUB_CACHE); fetch it with "
        f"`{download_command('Wan-AI/Wan2.1-T2V-1.3B-Diffusers')}`, or give a local directory"
    ), result.stderr


@pytest.mark.slow
def test_train_grpo_takes_hub_ids_too(hub_cache, tmp_path):
    """The same resolver: a cached id loads and exports (``--max-steps 0``: load, then export, which copies the
    cache's linked files as files); a missing one is the same one line, before anything loads."""
    argv = ["--config", "grpo_tiny_wan", "--max-steps", "0", "--set", "sample.max_sequence_length=8",
            "--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=1", "--eval-every", "0"]  # fmt: skip
    result = _run("train_grpo", [*argv, "--model", "tiny-org/tiny-wan", "--output-dir", str(tmp_path / "run")],
                  tmp_path, HF_HUB_CACHE=str(hub_cache))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    final = tmp_path / "run" / "final"
    assert (final / "model_index.json").is_file() and not (final / "transformer" / "config.json").is_symlink()
    result = _run("train_grpo", [*argv, "--model", "tiny-org/none", "--output-dir", str(tmp_path / "run2")],
                  tmp_path, HF_HUB_CACHE=str(hub_cache))  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().endswith(
        f"not in the local cache {hub_cache} (HF_HUB_CACHE); fetch it with `{download_command('tiny-org/none')}`, "
        "or give a local directory"
    )
