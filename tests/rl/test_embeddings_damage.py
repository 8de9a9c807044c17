"""A damaged prompt-embedding file never stops a run: one warning, then it is encoded again and replaced. A
file damaged mid-run, or a cache directory that takes no file, is one line naming the file or directory."""

from __future__ import annotations

import logging

import pytest
import torch

from dit_sp.errors import ConfigError
from dit_sp.rl.embeddings import PromptEmbeddings

PROMPTS = ["a red circle", "a blue square", "a green triangle"]


def encode(prompts):
    """A stand-in text encoder: each prompt's embedding is a function of its text alone."""
    rows = [torch.full((2, 3), float(len(p))) + torch.arange(3.0) for p in prompts]
    return torch.stack(rows), None


def test_damaged_files_are_encoded_again_with_one_warning(tmp_path, caplog):
    store = PromptEmbeddings(tmp_path, {"model": "m"})
    store.compute(PROMPTS, encode)
    whole = store.path(PROMPTS[0]).read_bytes()
    store.path(PROMPTS[0]).write_bytes(whole[: len(whole) // 2])  # cut short (a full disk, a killed copy)
    store.path(PROMPTS[1]).write_bytes(b"")  # emptied
    with caplog.at_level(logging.WARNING, logger="dit_sp.rl.embeddings"):
        missing = store.missing(PROMPTS)
    assert missing == PROMPTS[:2]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 damaged prompt embedding file(s)" in warnings[0].getMessage()
    store.compute(missing, encode)
    assert store.missing(PROMPTS) == []
    torch.testing.assert_close(store.read(PROMPTS, torch.device("cpu"))[0], encode(PROMPTS)[0])


def test_a_file_damaged_mid_run_is_one_line_and_encoded_on_the_next_run(tmp_path):
    store = PromptEmbeddings(tmp_path, {"model": "m"})
    store.compute(PROMPTS, encode)
    store.path(PROMPTS[2]).write_bytes(store.path(PROMPTS[0]).read_bytes())  # another prompt's file
    with pytest.raises(ConfigError, match=r"is damaged \(it holds no embedding of 'a green triangle'\); it was "
                                          r"removed, and the next run \(or --resume\) encodes it again$"):  # fmt: skip
        store.read(PROMPTS, torch.device("cpu"))
    assert store.missing(PROMPTS) == [PROMPTS[2]]


def test_a_cache_that_takes_no_file_names_it_and_leaves_no_temporary_file(tmp_path):
    with pytest.raises(ConfigError, match=r"embedding_cache /proc/dit_sp_cache: cannot be created"):
        PromptEmbeddings("/proc/dit_sp_cache", {"model": "m"}).compute(PROMPTS, encode)
    (tmp_path / "cache").mkdir()
    store = PromptEmbeddings(tmp_path / "cache", {"model": "m"})
    store.path(PROMPTS[0]).mkdir()  # the name is taken by a directory: the rename fails
    with pytest.raises(ConfigError, match=r"embedding_cache .*cache: cannot write [0-9a-f]+\.pt \(Is a directory\)"):
        store.compute(PROMPTS, encode)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [store.path(PROMPTS[0]).name]
