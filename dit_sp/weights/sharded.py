"""Weight-sharded inference: a model larger than one device's memory samples on several, each parameter held as a
flat ``1/N`` shard and gathered module by module as it runs."""

from __future__ import annotations

from typing import Any

import torch

from dit_sp.weights.loading import SafetensorsCheckpoint, checkpoint_key, report_mismatch


class ShardedWeights:
    """Weight-sharded inference: each large parameter lives as a ``1/N`` flat shard on every process of
    ``group`` and is gathered into a full tensor just before the module that owns it runs, then freed.

    FSDP2 does this per block, with a separate all-gather buffer and a copy-out, so about three blocks are
    unsharded at a time; gathering per module straight into the parameter's storage holds only the weights
    of the module running, which is what matters when a model barely fits. The processes of a sample run
    the same modules in the same order (sequence and CFG parallelism ensure it), so the collectives match.
    Parameters below ``min_numel`` elements (norms, biases) and those of the modules in ``whole`` (code may read
    their shapes before they run: position tables) stay whole. Inference only (no autograd).
    """

    def __init__(self, model: torch.nn.Module, group: Any, device: torch.device,
                 checkpoint: SafetensorsCheckpoint | None = None, min_numel: int = 1024,
                 whole: Any = ()):  # fmt: skip
        import torch.distributed as dist

        self.group, self.device = group, torch.device(device)
        self.world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.shards: dict[torch.nn.Parameter, tuple[torch.Tensor, torch.Size]] = {}
        self._hooks = []
        missing, used = [], set()
        for prefix, module in model.named_modules():
            owned = []
            for name, param in module.named_parameters(recurse=False):
                key = checkpoint_key(f"{prefix}.{name}" if prefix else name)
                if param.is_meta and (checkpoint is None or key not in checkpoint):
                    missing.append(key)
                    continue
                used.add(key)
                numel, size = param.numel(), -(-param.numel() // self.world)
                if numel < min_numel or module in whole:  # whole: read it, or keep it
                    if param.is_meta:
                        value = checkpoint.read_flat(key, 0, numel).view(param.shape).to(self.device, param.dtype)
                        setattr(module, name, torch.nn.Parameter(value, requires_grad=False))
                    continue
                local = torch.zeros(size, dtype=param.dtype, device=self.device)  # padded to size * world
                start, stop = min(rank * size, numel), min((rank + 1) * size, numel)
                if param.is_meta:
                    local[: stop - start] = checkpoint.read_flat(key, start, stop - start).to(param.dtype)
                else:
                    local[: stop - start] = param.detach().reshape(-1)[start:stop]
                sharded = torch.nn.Parameter(_released(param.dtype, self.device), requires_grad=False)
                setattr(module, name, sharded)  # a new Parameter: a meta one cannot take real data
                self.shards[sharded] = (local, param.shape)
                owned.append(sharded)
            if owned:
                self._hooks.append(module.register_forward_pre_hook(self._gatherer(owned)))
                self._hooks.append(module.register_forward_hook(self._releaser(owned)))
        unexpected = (checkpoint.keys() - used) if checkpoint is not None else set()
        if missing or unexpected:
            report_mismatch(checkpoint.directory if checkpoint else "(no checkpoint)", model, missing, unexpected)

    def gather(self, param: torch.nn.Parameter) -> torch.Tensor:
        """The full value of a sharded parameter (collective over the group)."""
        from dit_sp._compat import all_gather_single

        local, shape = self.shards[param]
        full = torch.empty(local.numel() * self.world, dtype=local.dtype, device=self.device)
        all_gather_single(full, local, self.group)
        return full[: shape.numel()].view(shape)

    def _gatherer(self, params: list[torch.nn.Parameter]):
        def hook(module: torch.nn.Module, args: Any) -> None:
            for param in params:
                param.data = self.gather(param)

        return hook

    def _releaser(self, params: list[torch.nn.Parameter]):
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            for param in params:
                param.data = _released(param.dtype, self.device)

        return hook

    def unshard(self) -> None:
        """Every parameter whole again and the hooks gone (collective)."""
        for hook in self._hooks:
            hook.remove()
        for param in self.shards:
            param.data = self.gather(param)
        self.shards.clear()


def _released(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """What a sharded parameter holds between uses: no elements, its dtype and device (code may read those)."""
    return torch.empty(0, dtype=dtype, device=device)
