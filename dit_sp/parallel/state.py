"""Process groups of one ``(dp, ring, ulysses)`` layout, and their set-up from torchrun's environment."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from dit_sp._compat import device_mesh, flatten_mesh, group_options
from dit_sp.errors import ConfigError
from dit_sp.parallel.config import ParallelConfig
from dit_sp.parallel.device import default_backend, default_device
from dit_sp.parallel.launch import loopback_env

T = TypeVar("T")

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

MESH_DIM_NAMES = ("dp", "cfg", "ring", "ulysses")
DEFAULT_TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for its peers before it fails (the ``collective_timeout`` of the CLIs' configs):
long enough for the slowest rank to load a model or write a checkpoint while the others wait."""
MAX_TIMEOUT_S = 1e7


@dataclass(frozen=True, eq=False)
class ParallelState:
    """Everything a rank needs to know about one parallel layout.

    Rank layout: ``global = ((dp_rank * cfg + cfg_rank) * ring + ring_rank) * ulysses + ulysses_rank``
    (ulysses innermost, so Ulysses peers are neighbouring ranks, i.e. the same node on GPUs). The
    sequence shard a rank holds is ``sp_rank = ring_rank * ulysses + ulysses_rank``.

    Groups are ``None`` in a single process without ``torch.distributed``; every degree is then 1.
    Several states (layouts) can live in one process side by side: nothing here is global.
    """

    config: ParallelConfig
    device: torch.device
    mesh: DeviceMesh | None
    dp_group: dist.ProcessGroup | None
    cfg_group: dist.ProcessGroup | None
    ring_group: dist.ProcessGroup | None
    ulysses_group: dist.ProcessGroup | None
    sp_group: dist.ProcessGroup | None
    sample_group: dist.ProcessGroup | None
    """The cfg x ring x ulysses ranks that produce one sample together."""
    rank: int
    dp_rank: int
    cfg_rank: int
    ring_rank: int
    ulysses_rank: int
    timeout: timedelta = DEFAULT_TIMEOUT

    @property
    def dp(self) -> int:
        return self.config.dp

    @property
    def cfg(self) -> int:
        return self.config.cfg

    @property
    def ring(self) -> int:
        return self.config.ring

    @property
    def ulysses(self) -> int:
        return self.config.ulysses

    @property
    def sp(self) -> int:
        return self.config.sp

    @property
    def sp_rank(self) -> int:
        """Index of this rank's sequence shard within its sample."""
        return self.ring_rank * self.ulysses + self.ulysses_rank

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def ring_peer(self, offset: int) -> int:
        """Global rank of the ring peer ``offset`` steps ahead (negative: behind)."""
        import torch.distributed as dist

        assert self.ring_group is not None
        return dist.get_global_rank(self.ring_group, (self.ring_rank + offset) % self.ring)

    @property
    def is_sample_leader(self) -> bool:
        """The one rank of a sample (cfg and SP group) that decodes and writes its outputs."""
        return self.cfg_rank == 0 and self.sp_rank == 0

    def dp_seed(self, seed: int) -> int:
        """A seed shared by the cfg and sequence-parallel peers of one sample, distinct across dp ranks."""
        return seed + self.dp_rank

    def __repr__(self) -> str:
        return (
            f"ParallelState(rank={self.rank}, dp={self.dp_rank}/{self.dp}, cfg={self.cfg_rank}/{self.cfg}, "
            f"ring={self.ring_rank}/{self.ring}, "
            f"ulysses={self.ulysses_rank}/{self.ulysses}, device={self.device})"
        )


def single_process_state(device: torch.device | None = None) -> ParallelState:
    """The trivial layout of one process, usable without ``torch.distributed``."""
    return ParallelState(
        config=ParallelConfig(),
        device=device or default_device(),
        mesh=None,
        dp_group=None,
        cfg_group=None,
        ring_group=None,
        ulysses_group=None,
        sp_group=None,
        sample_group=None,
        rank=0,
        dp_rank=0,
        cfg_rank=0,
        ring_rank=0,
        ulysses_rank=0,
    )


def collective_timeout(seconds: float | timedelta) -> timedelta:
    """``seconds`` (a config's ``collective_timeout``) as the process groups' timeout; a ``ConfigError`` unless it
    is a finite number above 0 (and at most ``MAX_TIMEOUT_S``)."""
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise ConfigError(f"collective_timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f} "
                          f"(default {DEFAULT_TIMEOUT.total_seconds():.0f}), got {seconds!r}")  # fmt: skip
    return timedelta(seconds=seconds)


def _destroy_process_group() -> None:
    """At exit, tear down the process group that ``init_parallel`` started, unless the caller did: left to
    interpreter finalization, gloo's worker threads can abort the process (SIGABRT, "terminate called without
    an active exception") after all the work succeeded."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def init_parallel(
    config: ParallelConfig,
    *,
    backend: str | None = None,
    device: torch.device | str | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT,
) -> ParallelState:
    """Join (or start) the process group and build the ``(dp, cfg, ring, ulysses)`` mesh.

    The process group comes from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``), or is reused if already initialised. A single process with nothing launched gets
    a state without process groups. A world of one opens no store and binds gloo and NCCL to loopback, so
    it listens on no other interface. A process group started here is destroyed at exit if the caller has
    not done so. Every group created here uses ``timeout`` (seconds or a ``timedelta``), so a lost peer
    raises instead of hanging.
    """
    import torch
    import torch.distributed as dist

    timeout = collective_timeout(timeout)
    device = torch.device(device) if device is not None else default_device()
    backend = backend or default_backend(device)
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            if config.world_size == 1:
                return single_process_state(device)
            raise RuntimeError(
                f"{config} needs {config.world_size} processes, but this process was not started by a "
                "launcher (RANK/WORLD_SIZE are unset). Run it with `torchrun --nproc-per-node "
                f"{config.world_size} ...`, or use dit_sp.parallel.spawn to start local workers."
            )
        config.check_world_size(int(os.environ["WORLD_SIZE"]))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if int(os.environ["WORLD_SIZE"]) == 1:  # no peer to meet: an in-memory store, gloo/NCCL on loopback
            os.environ.update(loopback_env())
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, timeout=timeout)
        atexit.register(_destroy_process_group)
    config.check_world_size(dist.get_world_size())

    # Every group carries the timeout: DeviceMesh sub-groups otherwise wait 30 minutes.
    override = {name: group_options(backend, timeout) for name in MESH_DIM_NAMES}
    shape = (config.dp, config.cfg, config.ring, config.ulysses)
    mesh = device_mesh(device.type, shape, MESH_DIM_NAMES, override)
    # The SP group (ring x ulysses flattened) is what FSDP and the sequence gather/shard work on.
    sp_mesh = flatten_mesh(mesh["ring", "ulysses"], "sp", group_options(backend, timeout))
    sample_mesh = flatten_mesh(mesh["cfg", "ring", "ulysses"], "sample", group_options(backend, timeout))
    coords = mesh.get_coordinate()
    assert coords is not None
    return ParallelState(
        config=config,
        device=device,
        mesh=mesh,
        dp_group=mesh.get_group("dp"),
        cfg_group=mesh.get_group("cfg"),
        ring_group=mesh.get_group("ring"),
        ulysses_group=mesh.get_group("ulysses"),
        sp_group=sp_mesh.get_group(),
        sample_group=sample_mesh.get_group(),
        rank=dist.get_rank(),
        dp_rank=coords[0],
        cfg_rank=coords[1],
        ring_rank=coords[2],
        ulysses_rank=coords[3],
        timeout=timeout,
    )


def init_layout(*, ring: int = 1, ulysses: int = 1, cfg: int = 1, dp: int | None = None,
                timeout: float | timedelta = DEFAULT_TIMEOUT) -> ParallelState:  # fmt: skip
    """The layout on the running world (torchrun's, ``spawn``'s, or one process): what ring, Ulysses and CFG
    do not take becomes data parallelism; ``dp``, when given, must be what is left. ``timeout``: the
    collectives' (``collective_timeout``)."""
    import torch.distributed as dist

    timeout = collective_timeout(timeout)
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    parallel = init_parallel(ParallelConfig.for_world(world, ring=ring, ulysses=ulysses, cfg=cfg), timeout=timeout)
    if dp is not None and dp != parallel.dp:
        raise ConfigError(f"dp={dp}, but {world} processes / (cfg*ring*ulysses={parallel.cfg * parallel.sp}) "
                          f"give dp={parallel.dp}")  # fmt: skip
    return parallel


def check_ranks_agree(parallel: ParallelState, value: Any, what: str) -> None:
    """Every rank must hold the same ``value`` (e.g. settings and prompts: under torchrun each rank parses
    its own flags and files). Compared by a hash over all ranks; a ``ConfigError`` names those that differ."""
    import torch.distributed as dist

    if parallel.world_size == 1 or not dist.is_initialized():
        return
    digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
    digests: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    differ = [rank for rank, other in enumerate(digests) if other != digests[0]]
    if differ:
        raise ConfigError(f"ranks {differ} have other {what} than rank 0: every rank must get the same config "
                          "file, flags and files")  # fmt: skip


def read_on_every_rank(parallel: ParallelState, read: Callable[[], T], what: str) -> T:
    """``read()`` on every rank (under torchrun each rank reads its own files): a ``ConfigError`` on some ranks
    (a file missing on one machine) is raised on all of them, naming them, instead of leaving the others to wait
    in the next collective until it times out."""
    import torch.distributed as dist

    error: ConfigError | None = None
    try:
        value = read()
    except ConfigError as e:
        error = e
    if parallel.world_size > 1 and dist.is_initialized():
        messages: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(messages, None if error is None else str(error))
        failed = [rank for rank, message in enumerate(messages) if message is not None]
        if failed and error is None:
            raise ConfigError(f"ranks {failed} cannot read {what}: {messages[failed[0]]}")
    if error is not None:
        raise error
    return value
