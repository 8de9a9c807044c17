"""How the devices are split: data parallel x ring x ulysses."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of the ``(dp, ring, ulysses)`` device mesh.

    ``ring * ulysses`` processes share one sample (sequence parallelism, "SP"); ``dp`` such groups
    work on different samples. Their product must equal the world size.
    """

    dp: int = 1
    ring: int = 1
    ulysses: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelConfig.{f.name} must be a positive integer, got {value!r}")

    @property
    def sp(self) -> int:
        """Sequence-parallel degree: processes that share one sample."""
        return self.ring * self.ulysses

    @property
    def world_size(self) -> int:
        return self.dp * self.sp

    def check_world_size(self, world_size: int) -> None:
        """Raise a clear error when the degrees do not multiply to ``world_size``."""
        if self.world_size != world_size:
            raise ValueError(
                f"ParallelConfig(dp={self.dp}, ring={self.ring}, ulysses={self.ulysses}) needs "
                f"dp*ring*ulysses = {self.world_size} processes, but the world size is {world_size}. "
                f"Choose degrees whose product is {world_size}, or launch {self.world_size} processes."
            )

    @classmethod
    def for_world(cls, world_size: int, *, ring: int = 1, ulysses: int = 1) -> ParallelConfig:
        """The config that uses ``ring x ulysses`` per sample and data parallelism for the rest."""
        sp = ring * ulysses
        if sp < 1 or world_size % sp:
            raise ValueError(
                f"ring*ulysses = {sp} does not divide the world size {world_size}; "
                "pick degrees whose product divides the number of processes."
            )
        return cls(dp=world_size // sp, ring=ring, ulysses=ulysses)
