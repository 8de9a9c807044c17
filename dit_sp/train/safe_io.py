"""Reading a checkpoint never runs code from it (the trust model: docs/trust.md).

A pickle can call any importable function while it loads, so nothing here hands a checkpoint's bytes to a
full unpickler:

- ``write_state`` / ``read_state``: what dit-sp itself stores (step, LR schedule, RNG states, per-prompt
  statistics) as ``NAME.json`` (plain values) and ``NAME.safetensors`` (tensors and numpy arrays). Floats,
  ints, tuples and dict keys round-trip exactly, so a resumed run stays bit-exact.
- ``read_legacy_state``: a ``trainer_state.pt`` from before that format (a pickle), read by torch's
  ``weights_only`` unpickler with numpy arrays allowed (numpy's reconstructor only builds arrays); anything
  else in it is refused.
- ``SafeReader``: DCP's ``FileSystemReader`` whose ``.metadata`` (a pickle DCP writes) is read by an
  unpickler that resolves only DCP's own metadata types (``dcp_metadata_globals``).
- ``SafePlanner``: DCP's ``DefaultLoadPlanner`` whose non-tensor items (the optimizer's hyper-parameters,
  pickled inside the shards, which DCP itself would read with full pickle) are read with ``weights_only``.
  DCP already reads the tensors with ``weights_only``.

A refusal is an ``UnsafeCheckpointError``: a ``ConfigError`` (one line at the CLI), never taken for damage,
so a resume stops instead of falling back to an older checkpoint.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from dit_sp._compat.torch_api import dcp_metadata_globals, dcp_metadata_path
from dit_sp.errors import ConfigError

_TENSOR, _ARRAY, _TUPLE, _ITEMS = "__tensor__", "__ndarray__", "__tuple__", "__items__"
_MARKERS = {_TENSOR, _ARRAY, _TUPLE, _ITEMS}


class UnsafeCheckpointError(ConfigError):
    """A checkpoint file holds something that loading would have to run as code: refused, not loaded."""


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous().clone()  # clone: safetensors refuses shared storage
        return {_TENSOR: key}
    if isinstance(value, np.ndarray):
        key = str(len(tensors))
        wide = value.astype(np.int64) if value.dtype == np.uint32 else value  # torch's uint32 is half-supported
        tensors[key] = torch.from_numpy(np.ascontiguousarray(wide)).clone()
        return {_ARRAY: key, "dtype": value.dtype.str}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not value.keys() & _MARKERS:
            return {k: _encode(v, tensors) for k, v in value.items()}
        return {_ITEMS: [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}  # int keys stay int
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a checkpoint's state holds plain values and tensors only, not {type(value).__name__}")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if _TENSOR in value:
        return tensors[value[_TENSOR]]
    if _ARRAY in value:
        return tensors[value[_ARRAY]].numpy().astype(np.dtype(value["dtype"]))
    if _TUPLE in value:
        return tuple(_decode(v, tensors) for v in value[_TUPLE])
    if _ITEMS in value:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value[_ITEMS]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def state_files(directory: Path, name: str) -> tuple[Path, Path]:
    """The two files of state ``name`` in ``directory``: its JSON and its tensors."""
    return directory / f"{name}.json", directory / f"{name}.safetensors"


def write_state(directory: Path, name: str, value: Any) -> None:
    """``value`` (nested dicts, lists, tuples, numbers, strings, None, tensors, numpy arrays) as the files of
    ``state_files``; no pickle."""
    tensors: dict[str, torch.Tensor] = {}
    text = json.dumps(_encode(value, tensors))  # floats as repr: exact
    plain, arrays = state_files(directory, name)
    arrays.write_bytes(save_tensors(tensors))  # written by Python: a full disk is an OSError
    plain.write_text(text)


def read_state(directory: Path, name: str) -> Any:
    """What ``write_state`` wrote; ``ValueError`` (or ``KeyError``) if the files are damaged."""
    plain, arrays = state_files(directory, name)
    return _decode(json.loads(plain.read_text()), load_file(str(arrays)))


def _refusal(error: Exception) -> str:
    """What torch's ``weights_only`` unpickler refused, in a few words."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return f"it names {found.group(1)}" if found else "it is not plain data"


def read_legacy_state(path: Path) -> Any:
    """A pickled ``trainer_state.pt`` of an older dit-sp, read with ``weights_only`` (plain values, tensors
    and numpy arrays); ``UnsafeCheckpointError`` if it holds anything else."""
    reconstruct = np.zeros(1).__reduce__()[0]  # numpy's array reconstructor, wherever this numpy keeps it
    allowed = [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"{path} predates dit-sp's safe checkpoint format and holds more than plain data ({_refusal(e)}); "
            "refusing to load it, since loading could run code: resume from a newer checkpoint or start a new run"
        ) from None


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only ``dcp_metadata_globals()`` and no persistent ids."""

    def __init__(self, file: Any, where: str):
        super().__init__(file)
        self.where, self.allowed = where, dcp_metadata_globals()

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafeCheckpointError(
                f"{self.where} names {module}.{name}, which is none of DCP's metadata types; refusing to load "
                "it, since loading could run code: resume from another checkpoint or start a new run"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(f"{self.where} holds a persistent reference, which DCP metadata never holds")


class SafeReader(FileSystemReader):
    """DCP's file reader, its ``.metadata`` read with ``_MetadataUnpickler`` when it is made: before DCP's
    load starts, which would take a refusal for a missing file and fall back to per-rank metadata."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        where = dcp_metadata_path(self)
        with self.fs.create_stream(where, "rb") as stream:
            metadata = _MetadataUnpickler(stream, str(where)).load()
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{where} holds a {type(metadata).__name__}, not DCP metadata")
        self.metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self.metadata.storage_meta = getattr(self.metadata, "storage_meta", None) or StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id  # as DCP's own reader sets it
        return self.metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, its non-tensor items read with ``weights_only``. The value it hands on is
    re-serialized from what that read, so the full unpickler behind it sees only plain data."""

    def __init__(self, where: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.where = where

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            plain = torch.load(value, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"{self.where}: the item {read_item.dest_index.fqn} holds more than plain data ({_refusal(e)}); "
                "refusing to load it, since loading could run code: resume from another checkpoint or start a "
                "new run"
            ) from None
        clean = io.BytesIO()
        torch.save(plain, clean)
        clean.seek(0)
        super().load_bytes(read_item, clean)
