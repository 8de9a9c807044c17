"""The peak of live tensor bytes while code runs: every tensor storage an operator creates counts from its
creation until it is freed. A device-independent stand-in for a GPU allocator's peak (which adds only kernel
workspaces, such as cuDNN's or the CPU's column buffers, that are not tensors)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: ...`` then ``live.peak``: the most bytes of tensor storages alive at once,
    counting only those created inside the block (inputs and weights made before it are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self._alive:  # a view of a storage already counted
                continue
            self._alive.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, size)
        return out

    def _free(self, key: int, size: int) -> None:
        self.live -= size
        self._alive.discard(key)
