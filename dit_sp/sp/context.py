"""Per-model state of one sequence-parallel forward, shared by its hooks and attention processors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dit_sp.parallel.comm import GatherGrad, shard_len
from dit_sp.parallel.state import ParallelState


@dataclass(eq=False)
class SequenceContext:
    """What the split hooks learn in a forward and the attention processors need.

    One per parallelized model (never global), so several models and layouts can coexist.
    """

    parallel: ParallelState
    joint_position: Literal["front", "rear"] = "front"
    gather_grad: GatherGrad = "sum"
    kernel: str | None = None
    seq_len: int | None = None
    """Full (unpadded) number of video tokens of the current forward."""
    in_forward: bool = False
    """True between the model's forward pre-hook and forward hook. (Checkpointed blocks are recomputed
    in backward, outside it: torch re-runs them on their unsplit inputs, so their hooks split again.)"""
    _mask_cache: dict = field(default_factory=dict)

    @property
    def local_len(self) -> int:
        """Video tokens per rank (padded)."""
        if self.seq_len is None:
            raise RuntimeError("sequence-parallel attention ran before the model split its sequence")
        return shard_len(self.seq_len, self.parallel)

    def begin(self) -> None:
        self.seq_len = None
        self.in_forward = True
        self._mask_cache.clear()

    def end(self) -> None:
        self.in_forward = False

    def record_seq_len(self, length: int) -> None:
        if self.in_forward and self.seq_len is not None and self.seq_len != length:
            raise RuntimeError(
                f"sequences of {self.seq_len} and {length} tokens were split in one forward; the plan of "
                "this model is inconsistent"
            )
        self.seq_len = length
