"""How the devices are split: data parallel x ring x ulysses."""

from __future__ import annotations

from dataclasses import dataclass, fields

from dit_sp.errors import ConfigError


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of the ``(dp, cfg, ring, ulysses)`` device mesh.

    ``ring * ulysses`` processes share one sample (sequence parallelism, "SP"); with ``cfg=2`` two such
    groups compute the conditional and unconditional branch of classifier-free guidance side by side;
    ``dp`` copies of all that work on different samples. The product must equal the world size.
    """

    dp: int = 1
    ring: int = 1
    ulysses: int = 1
    cfg: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ParallelConfig.{f.name} must be a positive integer, got {value!r}")
        if self.cfg not in (1, 2):
            raise ConfigError(f"ParallelConfig.cfg must be 1 or 2 (the two guidance branches), got {self.cfg}")

    @property
    def sp(self) -> int:
        """Sequence-parallel degree: processes that share one sample."""
        return self.ring * self.ulysses

    @property
    def world_size(self) -> int:
        return self.dp * self.cfg * self.sp

    def check_world_size(self, world_size: int) -> None:
        """Raise a clear error when the degrees do not multiply to ``world_size``."""
        if self.world_size != world_size:
            raise ConfigError(
                f"{self} needs dp*cfg*ring*ulysses = {self.world_size} processes, but the world size is "
                f"{world_size}. "
                f"Choose degrees whose product is {world_size}, or launch {self.world_size} processes."
            )

    @classmethod
    def for_world(cls, world_size: int, *, ring: int = 1, ulysses: int = 1, cfg: int = 1) -> ParallelConfig:
        """The config that uses ``cfg x ring x ulysses`` per sample and data parallelism for the rest."""
        per_sample = cfg * ring * ulysses
        if per_sample < 1 or world_size % per_sample:
            raise ConfigError(
                f"cfg*ring*ulysses = {per_sample} does not divide the world size {world_size}; "
                "pick degrees whose product divides the number of processes."
            )
        return cls(dp=world_size // per_sample, ring=ring, ulysses=ulysses, cfg=cfg)
