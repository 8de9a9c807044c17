"""Transformers built without their weights in memory, then filled shard by shard from safetensors files.

A 14B transformer is 56 GB in fp32: loading it whole on every rank and sharding it afterwards needs that
much memory in every process. Here it is built with its parameters on the meta device (its buffers, small
and computed in ``__init__`` such as rotary tables, stay real), parallelized and sharded by FSDP2, and
then every rank reads only its own rows of each weight from the checkpoint files, in the model's dtype:
peak memory about ``full / N`` plus the one tensor being read.

    with parameters_on_meta():
        model = WanTransformer3DModel.from_config(config)
    shard_model(model, parallel)                  # FSDP2 on meta parameters
    load_shards(model, "ckpt/transformer", device)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dit_sp._compat import keep_in_fp32_modules, local_region
from dit_sp.errors import ConfigError, MissingFileError

WEIGHTS_NAME = "diffusion_pytorch_model"
"""The stem of diffusers' weight files (``.safetensors``, or shards listed in ``.safetensors.index.json``)."""


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device: no memory, no initialisation cost
    (``torch.empty`` is never touched, and the init runs on meta). Buffers stay real."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def has_meta_parameters(model: torch.nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}  # fmt: skip


class SafetensorsCheckpoint:
    """The tensors of one diffusers model directory, read lazily: ``read(name, region)`` reads just
    ``region`` (a tuple of slices) of one tensor from disk.

    The files are read with plain reads, not memory-mapped: pages of a mapped file count towards the
    process's resident memory for as long as it stays open, which would charge every rank with the parts
    of the checkpoint it merely looked at. An FSDP shard is a range of rows, so one read per tensor."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        files = weight_files(self.directory)
        if not files:
            raise MissingFileError(
                f"{self.directory} holds no .safetensors weights: sharded loading reads safetensors only "
                "(save with save_pretrained(DIR, safe_serialization=True), the default)"
            )
        self._where: dict[str, tuple[Path, int, dict]] = {}
        for path in files:
            header, data_start = safetensors_header(path)
            for key, info in header.items():
                self._where[key] = (path, data_start, info)

    def keys(self) -> set[str]:
        return set(self._where)

    def rename(self, names: dict[str, str]) -> None:
        """Read the tensors saved as each key of ``names`` under its value (a model's own name for it)."""
        self._where = {names.get(key, key): where for key, where in self._where.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def info(self, name: str) -> tuple[torch.dtype, list[int]]:
        """The dtype and shape of tensor ``name`` in the checkpoint."""
        _, _, info = self._where[name]
        return _DTYPES[info["dtype"]], info["shape"]

    def read_flat(self, name: str, start: int, count: int) -> torch.Tensor:
        """Elements ``[start, start + count)`` of tensor ``name`` flattened (row-major): one read."""
        path, data_start, info = self._where[name]
        dtype, numel = _DTYPES[info["dtype"]], math.prod(info["shape"])
        if start < 0 or count < 0 or start + count > numel:
            raise IndexError(f"{name}: elements [{start}, {start + count}) of {numel}")
        out = torch.empty(count, dtype=dtype)
        with open(path, "rb") as f:
            f.seek(data_start + info["data_offsets"][0] + start * out.element_size())
            f.readinto(memoryview(out.view(torch.uint8).numpy()))
        return out

    def read(self, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        """``region`` of tensor ``name``: its rows (dim 0) are one contiguous read, other dims sliced after."""
        _, shape = self.info(name)
        if not shape:
            return self.read_flat(name, 0, 1).reshape(())
        rows, row = region[0], math.prod(shape[1:])
        out = self.read_flat(name, rows.start * row, (rows.stop - rows.start) * row).view(-1, *shape[1:])
        return out[(slice(None), *region[1:])]


def weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a model directory: the shards its ``*.safetensors.index.json`` lists, else
    every ``*.safetensors`` there (none: ``[]``). ``ConfigError`` naming the index if it is not JSON with a
    ``weight_map``, ``MissingFileError`` naming a shard it lists that is not there."""
    directory = Path(directory)
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if not indexes:
        return sorted(directory.glob("*.safetensors"))
    index = directory / f"{WEIGHTS_NAME}.safetensors.index.json"
    index = index if index in indexes else indexes[0]
    try:
        names = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{index} is damaged: not a JSON shard index with a weight_map ({e}); save or download "
                          "the model again") from e  # fmt: skip
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise MissingFileError(f"{index} lists shards that are not in {directory}: {missing[:3]}; the download is "
                               "incomplete (fetch the missing files)")  # fmt: skip
    return [directory / name for name in names]


def safetensors_header(path: str | Path) -> tuple[dict[str, dict], int]:
    """The tensor table of a safetensors file (name: dtype, shape, data offsets) and the byte where its data
    starts, checked against the file's size without reading the data: ``ConfigError`` naming the file if it
    is not safetensors or is shorter than its table says (a download cut short, a disk that filled up).
    Cheap enough to run on every shard of a checkpoint before anything loads."""
    path = Path(path)

    def damaged(what: str) -> ConfigError:
        return ConfigError(f"{path} is damaged: {what}; save or download it again")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > size - 8:
                raise damaged(f"not a safetensors file, or truncated ({size} bytes, header of {length} claimed)")
            header = json.loads(f.read(length))
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise damaged(f"its header is not the JSON table of a safetensors file ({e})") from e
    if not isinstance(header, dict):
        raise damaged("its header is not the JSON table of a safetensors file")
    header.pop("__metadata__", None)
    data = size - 8 - length
    for key, info in header.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise damaged(f"tensor {key!r} has no valid data_offsets in its header")
        if not 0 <= offsets[0] <= offsets[1] <= data:
            raise damaged(f"truncated: tensor {key!r} ends at byte {8 + length + offsets[1]} of {size}")
    return header, 8 + length


def checkpoint_key(name: str) -> str:
    """The checkpoint name of a model tensor: peft's LoRA wrappers add ``base_layer`` to the base weights."""
    return name.replace(".base_layer.", ".")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, a plain tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


@torch.no_grad()
def load_shards(model: torch.nn.Module, directory: str | Path, device: torch.device | str = "cpu") -> None:
    """Materialise ``model``'s meta parameters on ``device`` from the safetensors files in ``directory``,
    each rank reading only the rows of its own FSDP2 shards (plain tensors are read whole). Tensors that
    are already real (buffers, freshly initialised LoRA adapters) keep their values. Names that do not
    match the checkpoint either way raise, listing them."""
    checkpoint = SafetensorsCheckpoint(directory)
    kept = {name: local_tensor(t).detach().clone() for name, t in _named_tensors(model) if not t.is_meta}
    model.to_empty(device=device)
    missing, used = [], set()
    for name, tensor in _named_tensors(model):
        local = local_tensor(tensor)
        if name in kept:
            local.copy_(kept[name])
            continue
        key = checkpoint_key(name)
        if key not in checkpoint:
            missing.append(name)
            continue
        used.add(key)
        local.copy_(checkpoint.read(key, local_region(tensor)))
    unexpected = checkpoint.keys() - used - {checkpoint_key(n) for n in kept}
    if missing or unexpected:
        report_mismatch(directory, model, missing, unexpected)


def report_mismatch(directory: Any, model: torch.nn.Module, missing: list[str], unexpected: set[str]) -> None:
    raise MissingFileError(
        f"the weights in {directory} do not fit {type(model).__name__}: missing {sorted(missing)[:8]}"
        f"{' ...' if len(missing) > 8 else ''}, unexpected {sorted(unexpected)[:8]}"
        f"{' ...' if len(unexpected) > 8 else ''} (is it the checkpoint of this model class and config?)"
    )


def empty_model(directory: str | Path, dtype: torch.dtype) -> Any:
    """The diffusers model saved in ``directory`` (its ``config.json``), with its parameters on the meta
    device in ``dtype`` (except the modules its class keeps in fp32, as ``from_pretrained`` does);
    ``load_shards(model, directory)`` fills it after sharding."""
    import diffusers

    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text())
        cls = getattr(diffusers, config["_class_name"])
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise MissingFileError(f"{directory} is not a diffusers model directory (config.json: {e})") from e
    with parameters_on_meta(), torch.random.fork_rng(devices=[]):  # inits like torch.randn(...) draw numbers
        model = cls.from_config(cls.load_config(directory))
    keep = keep_in_fp32_modules(model)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and not keep & set(name.split(".")):
            tensor.data = tensor.data.to(dtype)
    return model
