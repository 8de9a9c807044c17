"""Text encoders sharded over the processes of a sample: each holds about ``1/N`` of the weights.

A text encoder runs once per prompt, yet in full precision it can be the largest thing a process holds at
set-up: UMT5-XXL (Wan) is 5.7 B parameters, 1.05 B of them its 256384 x 4096 token embedding. Here every
weight is a ``1/N`` shard:

- **the token embedding** (``get_input_embeddings()``, and every module tied to it) is split by rows
  (vocabulary-parallel): each process looks up the ids in its own rows, zeros the others, and a sum over the
  group gives each token's row exactly (one process contributes it, the others zeros). The full table is
  never gathered (other embeddings, position tables and relative attention biases, are small and stay whole);
- **the other large weights** are flat ``1/N`` shards gathered per module as it runs and freed after it
  (``ShardedWeights``), so one layer's weights at a time are whole.

Both are exact: the gathered weights are the original values and the embedding sum adds zeros, so the
encoder's output equals one process's bit for bit in any dtype. Every process of ``group`` must encode the
same prompts in the same order (the collectives must match). Inference only.

    encoder = load_sharded_text_encoder("ckpt/text_encoder", group, device, torch.bfloat16)
    embeddings = encoder(input_ids).last_hidden_state  # every process of group, the same input_ids
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit_sp._compat import keep_in_fp32_modules
from dit_sp.errors import MissingFileError
from dit_sp.weights.loading import SafetensorsCheckpoint, parameters_on_meta
from dit_sp.weights.sharded import ShardedWeights

if TYPE_CHECKING:
    import torch

_CHUNK_ROWS = 4096
"""Embedding rows read (and converted) at a time: the transient of a read stays a few tens of MB."""


@dataclass
class ShardedEncoder:
    """What ``shard_text_encoder`` made of an encoder: its row-split embedding tables and the flat shards of
    its other weights."""

    tables: list[torch.Tensor]
    weights: ShardedWeights

    def local_bytes(self, encoder: torch.nn.Module) -> int:
        """Bytes of ``encoder``'s weights held by this process: its shards and rows, and what stays whole."""
        whole = [t for t in [*encoder.parameters(), *encoder.buffers()]]
        held = [*self.tables, *(local for local, _ in self.weights.shards.values()), *whole]
        return sum(t.numel() * t.element_size() for t in held)


def shard_text_encoder(
    encoder: torch.nn.Module,
    group: Any,
    device: torch.device | str,
    checkpoint: SafetensorsCheckpoint | None = None,
    min_numel: int = 1024,
) -> ShardedEncoder:
    """Shard ``encoder`` in place over the processes of ``group`` (see the module docstring); its meta
    parameters are read from ``checkpoint`` (each process its own rows or range), real ones are sliced.
    Collective."""
    import torch
    import torch.distributed as dist

    device = torch.device(device)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    names: dict[torch.nn.Parameter, list[str]] = {}
    for name, param in encoder.named_parameters(remove_duplicate=False):
        names.setdefault(param, []).append(name)
    tables: dict[torch.nn.Parameter, torch.Tensor] = {}
    tokens = encoder.get_input_embeddings().weight  # tied embeddings (T5's shared, encoder.embed_tokens) share it
    other_embeddings = set()
    for _, module in encoder.named_modules():
        if isinstance(module, torch.nn.Embedding) and module.weight is not tokens:
            other_embeddings.add(module)  # position tables, relative attention biases: small, read by shape
        if not isinstance(module, torch.nn.Embedding) or module.weight is not tokens:
            continue
        if module.max_norm is not None:
            raise NotImplementedError("a vocabulary-parallel embedding with max_norm would renormalise shards")
        weight = module.weight
        if weight not in tables:
            tables[weight] = _own_rows(weight, names[weight], world, rank, device, checkpoint)
        module.forward = types.MethodType(_vocab_parallel_forward(tables[weight], weight.shape[0], group), module)
    for weight in tables:  # what the embedding modules hold now: no elements (the table lives in their forward)
        released = torch.nn.Parameter(torch.empty(0, dtype=weight.dtype, device=device), requires_grad=False)
        for name in names[weight]:
            owner, _, attr = name.rpartition(".")
            setattr(encoder.get_submodule(owner), attr, released)
    weights = ShardedWeights(encoder, group, device, checkpoint, min_numel=min_numel, whole=other_embeddings)
    encoder.requires_grad_(False).eval()
    return ShardedEncoder(list(tables.values()), weights)


def load_sharded_text_encoder(directory: str | Path, group: Any, device: torch.device | str, dtype: torch.dtype,
                              cls: Any = None) -> torch.nn.Module:  # fmt: skip
    """A transformers text encoder saved in ``directory`` (``save_pretrained``: ``config.json`` and safetensors
    files), built on the meta device in ``dtype`` and filled with this process's shards only: each of the
    ``N`` processes of ``group`` reads and holds about ``1/N`` of the weights, never the whole. ``cls``: the
    model class (default: the ``architectures`` of its config). Its ``sharded`` attribute is the
    ``ShardedEncoder``. Collective."""
    import torch
    import transformers

    directory = Path(directory)
    try:
        config_dict = json.loads((directory / "config.json").read_text())
        cls = cls or getattr(transformers, config_dict["architectures"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise MissingFileError(f"{directory} is not a transformers model directory (config.json: {e})") from e
    config = cls.config_class.from_pretrained(directory)
    with parameters_on_meta(), torch.random.fork_rng(devices=[]):
        encoder = cls(config)
    fp32 = keep_in_fp32_modules(encoder) if dtype == torch.float16 else set()  # as from_pretrained does (T5's wo)
    for name, param in encoder.named_parameters():
        if param.is_floating_point() and not fp32 & set(name.split(".")):
            param.data = param.data.to(dtype)
    for buffer in encoder.buffers():  # rotary tables and the like stay as built; they move with the model
        buffer.data = buffer.data.to(device)
    checkpoint = SafetensorsCheckpoint(directory)
    checkpoint.rename(_saved_names(encoder, checkpoint.keys()))
    encoder.sharded = shard_text_encoder(encoder, group, device, checkpoint)
    return encoder


def _saved_names(encoder: torch.nn.Module, keys: set[str]) -> dict[str, str]:
    """``{saved key: the model's name}`` of the tensors that transformers renames when it loads ``encoder`` (its plain
    ``WeightRenaming`` rules; T5Gemma2's encoder saves ``embed_tokens.weight`` for ``text_model.embed_tokens.weight``):
    only keys that are no name of the model and become one that is not saved."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    renamings = [rule for rule in get_model_conversion_mapping(encoder) if type(rule) is WeightRenaming]
    model = {name for name, _ in encoder.named_parameters(remove_duplicate=False)}
    model |= {name for name, _ in encoder.named_buffers(remove_duplicate=False)}
    names = {}
    for key in keys - model:
        name = key
        for rule in renamings:
            name = rule.rename_source_key(name)[0]
        if name in model and name not in keys:
            names[key] = name
    return names


def _own_rows(weight: torch.nn.Parameter, names: list[str], world: int, rank: int, device: torch.device,
              checkpoint: SafetensorsCheckpoint | None) -> torch.Tensor:  # fmt: skip
    """This process's rows ``[rank * R, (rank + 1) * R)`` of an embedding table (``R = ceil(V / N)``; rows
    past the vocabulary are zeros), read from the checkpoint in chunks or sliced from the real table."""
    import torch

    from dit_sp.weights.loading import checkpoint_key

    vocab, width = weight.shape
    per = -(-vocab // world)
    start, stop = min(rank * per, vocab), min((rank + 1) * per, vocab)
    local = torch.zeros(per, width, dtype=weight.dtype, device=device)
    if not weight.is_meta:
        local[: stop - start] = weight.detach()[start:stop]
        return local
    key = next((checkpoint_key(n) for n in names if checkpoint is not None and checkpoint_key(n) in checkpoint), None)
    if key is None:
        raise MissingFileError(f"no weights of {names[0]} in {checkpoint.directory if checkpoint else '(none)'}")
    for row in range(start, stop, _CHUNK_ROWS):
        end = min(row + _CHUNK_ROWS, stop)
        local[row - start : end - start] = checkpoint.read(key, (slice(row, end),)).to(weight.dtype)
    return local


def _vocab_parallel_forward(local: torch.Tensor, vocab: int, group: Any):
    """An embedding lookup over rows held by the processes of ``group``: ``(...,) ids -> (..., D)``."""
    import torch
    import torch.distributed as dist

    start = dist.get_rank(group) * local.shape[0]

    def forward(module: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise IndexError(f"token ids must lie in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]")
        mine = (ids >= start) & (ids < start + local.shape[0])
        out = torch.nn.functional.embedding((ids - start) * mine, local)
        out = out.masked_fill(~mine.unsqueeze(-1), 0)
        if out.device.type == "cpu" and out.dtype in (torch.bfloat16, torch.float16):
            total = out.float()  # gloo sums half types slowly or not at all; the sum of one value and zeros is exact
            dist.all_reduce(total, group=group)
            return total.to(out.dtype)
        dist.all_reduce(out, group=group)
        return out

    return forward
