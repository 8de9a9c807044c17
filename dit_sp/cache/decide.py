"""The one number a step cache decides from, made the same on every process that must decide together.

Under sequence parallelism each process holds a shard of the tokens, so a change measured on the local
shard differs from rank to rank, and ranks deciding on their own would skip on one rank while the others
compute (a deadlock at the next collective, or stale and fresh shards mixed). The sums behind the
relative change are therefore all-reduced over the deciding group first, in float64, over real tokens
only (the last shard's padding left out): every process gets the one-process value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DecisionGroup:
    """The processes that see one sample's tokens and must take the same branch, how many of this process's
    ``local`` tokens are real (the rest pads the last shard), and which dimension of the blocks' hidden states holds
    the tokens (1: ``(B, S_local, ...)``; 0: one packed sequence without a batch dimension, ``(S_local, C)``, as
    Cosmos 3's layers take theirs: ``ModelFamily.cache_token_dim``)."""

    group: dist.ProcessGroup | None = None
    real_tokens: Callable[[int], int] = lambda local: local
    token_dim: int = 1

    @property
    def size(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)


@dataclass
class StepRecord:
    """One transformer call under the cache."""

    context: str
    computed: bool
    blocks_run: int
    blocks: int
    change: float | None
    """The relative change the decision used (reduced over the group); None on a context's first call."""
    local_change: float | None
    """The same, from this process's shard alone: what a rank deciding on its own would have used."""


@dataclass
class CacheStats:
    """What a step cache did, call by call (every context: ``cond``, ``uncond``, ...)."""

    records: list[StepRecord] = field(default_factory=list)

    @property
    def blocks_run(self) -> int:
        return sum(r.blocks_run for r in self.records)

    @property
    def blocks(self) -> int:
        return sum(r.blocks for r in self.records)

    @property
    def saved_fraction(self) -> float:
        """Fraction of transformer block evaluations skipped."""
        return 1 - self.blocks_run / self.blocks if self.blocks else 0.0

    def decisions(self, context: str | None = None) -> list[bool]:
        """Per call (of ``context``, or all), whether the blocks ran."""
        return [r.computed for r in self.records if context is None or r.context == context]

    def clear(self) -> None:
        self.records.clear()


@torch.compiler.disable  # a host-side decision: never traced into a compiled block
def relative_change(current: torch.Tensor, previous: torch.Tensor, where: DecisionGroup,
                    per_token: bool) -> tuple[float, float]:  # fmt: skip
    """``(group, local)`` relative L1 change ``sum|current - previous| / sum|previous|``.

    ``current``/``previous``: the tokens along ``where.token_dim`` (``(B, S_local, ...)``, or ``(S_local, C)``) with
    ``per_token`` (only the real tokens count), or a tensor every process of the group holds whole (e.g. a timestep
    embedding).
    """
    if per_token:
        real = where.real_tokens(current.shape[where.token_dim])
        current, previous = (x.narrow(where.token_dim, 0, real) for x in (current, previous))
    sums = torch.stack([(current.double() - previous.double()).abs().sum(), previous.double().abs().sum()])
    local = (sums[0] / sums[1]).item()
    if where.size > 1:  # (a tensor held whole: both sums grow by the group size, the ratio stays exact)
        dist.all_reduce(sums, group=where.group)
    return (sums[0] / sums[1]).item(), local
