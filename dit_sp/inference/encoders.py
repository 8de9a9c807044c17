"""A pipeline's text encoders during generation: their outputs kept for prompts that come again, and their
weights freed once no new prompt is left to encode.

A text encoder runs once per prompt, before the denoising loop, yet it stays in memory through every step:
UMT5-XXL (Wan) holds 5.7 B parameters, HunyuanVideo's Llama 8 B. Two things follow:

- **a cache of embeddings**: every text encoder's forward is memoised on its inputs (token ids, masks and
  keyword settings), so a prompt that comes again (a batch's shared negative prompt, a server's repeated
  requests) reads its embeddings instead of running the encoder. Bounded in bytes; least recently used first
  out. Exact: a hit returns a copy of the very tensors the encoder produced;
- **freeing**: ``free()`` releases the encoders' weights (their storage shrinks to nothing; shapes, dtypes and
  devices stay, so the pipeline still reads ``text_encoder.dtype``), once the caller knows every prompt it will
  run is encoded: ``generate`` frees them inside the first denoising step of its last new prompt, so they do
  not sit beside the transformer's activations. After that a cached prompt still works; a new one fails in one
  line saying why.

The processes of a sample that share sharded encoders (``dit_sp.weights.encoder``) see the same prompts in
the same order, so they hit and miss together and their collectives stay matched.
"""

from __future__ import annotations

import hashlib
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from dit_sp.errors import ConfigError
from dit_sp.zoo import TEXT_ENCODERS, TRANSFORMERS


def _key(value: Any) -> Any:
    """A hashable fingerprint of an encoder argument: a tensor by its shape, dtype and bytes."""
    if isinstance(value, torch.Tensor):
        data = value.detach().to("cpu").contiguous()
        digest = hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        return ("tensor", tuple(data.shape), str(data.dtype), digest)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(_key, value))
    if isinstance(value, dict):
        return ("dict", *sorted((k, _key(v)) for k, v in value.items()))
    return repr(value)


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` (a tensor, a transformers ``ModelOutput``, a tuple, list or dict of them) with ``fn`` applied to
    each tensor."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):  # transformers' ModelOutput is an OrderedDict of its set fields
        return type(value)(**{k: _map_tensors(v, fn) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        mapped = [_map_tensors(v, fn) for v in value]
        return type(value)(mapped) if isinstance(value, list) or type(value) is tuple else type(value)(*mapped)
    return value


def _nbytes(value: Any) -> int:
    sizes: list[int] = []
    _map_tensors(value, lambda t: sizes.append(t.numel() * t.element_size()) or t)
    return sum(sizes)


def _release(tensor: torch.Tensor) -> None:
    """Free ``tensor``'s memory while keeping its metadata: shrink its storage (every view of it goes too)."""
    try:
        tensor.untyped_storage().resize_(0)
    except RuntimeError:  # a storage that cannot shrink (a mapped file): drop this reference to it instead
        tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


class TextEncoders:
    """The text encoders of ``pipe`` (``text_encoder``, ``text_encoder_2``), their forwards memoised.

    ``max_bytes``: what the cached embeddings may hold at most (0: no cache). ``stats``: ``{"encoded":
    forwards run, "reused": forwards answered from the cache, "freed": whether the weights are released}``."""

    def __init__(self, pipe: Any, max_bytes: int):
        if max_bytes < 0:
            raise ConfigError(f"the embedding cache's size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.encoders = {name: module for name in TEXT_ENCODERS
                         if isinstance(module := getattr(pipe, name, None), torch.nn.Module)}  # fmt: skip
        self.transformers = [m for name in TRANSFORMERS if isinstance(m := getattr(pipe, name, None), torch.nn.Module)]
        self._cache: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._held = 0
        self._dropped = 0  # outputs not kept (too large, or pushed out): their prompts would need the encoders again
        self.stats = {"encoded": 0, "reused": 0, "freed": False}
        for name, module in self.encoders.items():
            module.forward = types.MethodType(self._memoised(name, module.forward), module)

    def _memoised(self, name: str, forward: Callable[..., Any]) -> Callable[..., Any]:
        def memoised_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            key = (name, _key(args), _key(kwargs))
            if key in self._cache:
                self._cache.move_to_end(key)
                self.stats["reused"] += 1
                return _map_tensors(self._cache[key][0], torch.Tensor.clone)
            if self.stats["freed"]:
                raise ConfigError(f"the {name} was freed once every prompt was encoded (free_text_encoders), and a "
                                  "prompt it has not seen came later; keep the encoders (--no-free-text-encoders) "
                                  "to encode prompts after the first denoising step")  # fmt: skip
            output = forward(*args, **kwargs)
            self.stats["encoded"] += 1
            self._remember(key, output)
            return output

        return memoised_forward

    def _remember(self, key: Any, output: Any) -> None:
        size = _nbytes(output)
        if size > self.max_bytes:
            self._dropped += 1
            return
        self._cache[key] = (_map_tensors(output, lambda t: t.detach().clone()), size)
        self._held += size
        while self._held > self.max_bytes:
            _, (_, dropped) = self._cache.popitem(last=False)
            self._held -= dropped
            self._dropped += 1

    def report(self) -> dict[str, Any]:
        """``stats`` with the cache's bytes and the encoders' bytes still held."""
        return {**self.stats, "cached_bytes": self._held, "held_bytes": self.held_bytes()}

    def held_bytes(self) -> int:
        """Bytes of the encoders' weights still in memory (0 once freed)."""
        tensors = [t for m in self.encoders.values() for t in (*m.parameters(), *m.buffers())]
        sharded = [getattr(m, "sharded", None) for m in self.encoders.values()]
        for shards in filter(None, sharded):
            tensors += [*shards.tables, *(local for local, _ in shards.weights.shards.values())]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def free(self) -> None:
        """Release the encoders' weights (sharded ones: this process's shards too). Cached prompts still
        encode; a new prompt fails in one line."""
        for module in self.encoders.values():
            for tensor in (*module.parameters(), *module.buffers()):
                _release(tensor)
            shards = getattr(module, "sharded", None)
            if shards is not None:
                for tensor in (*shards.tables, *(local for local, _ in shards.weights.shards.values())):
                    _release(tensor)
        self.stats["freed"] = True

    def free_in_first_step(self, later_prompts_cached: bool = False) -> None:
        """Free the encoders when a transformer next runs: the prompts of the call in progress are encoded by
        then, and the denoising steps' activations have not been allocated yet. ``later_prompts_cached``: later
        calls repeat earlier prompts, so free only if the cache has kept every output so far (else keep them)."""
        handles: list[Any] = []

        def free_once(module: torch.nn.Module, args: Any) -> None:
            for handle in handles:
                handle.remove()
            if not (later_prompts_cached and self._dropped):
                self.free()

        handles += [t.register_forward_pre_hook(free_once) for t in self.transformers]
