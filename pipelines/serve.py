"""Serve a video model over HTTP with OpenAI's Videos API, on sequence-parallel workers.

    python -m pipelines.serve --model tiny-wan --ulysses 2 --port 8000
    python -m pipelines.serve --model /ckpt/Wan2.1-T2V-14B --ulysses 4 --dp 2 --api-key "$KEY"

The model loads once onto ``world_size`` local workers, laid out as ``generate`` lays them out (``--ulysses``,
``--ring``, ``--cfg-parallel``, ``--dp``: each data-parallel group runs one job at a time). The official
``openai`` client works against it (``base_url="http://HOST:PORT/v1"``): ``client.videos.create(prompt=...,
size="WxH", seconds=..., extra_body={"seed": 1, "num_inference_steps": 30})``, ``retrieve``, ``list``,
``delete`` (cancels a queued or running job), ``download_content`` and ``create_and_poll``. A job's video is
``generate``'s with the same settings and seed. ``--set KEY=VALUE`` changes a served default (a ``generate``
setting: ``steps``, ``frames``, ``guidance``, ...). Prints ``serving MODEL on http://HOST:PORT`` once the
workers have loaded it; the page at ``/`` submits prompts and plays the results.

Finished jobs (metadata and files) persist in ``--job-dir`` and are served again after a restart. SIGTERM or
SIGINT stops intake, gives running jobs ``--shutdown-grace`` seconds, cancels the rest and stops every worker.
A worker that dies fails its job with an error naming it and the workers restart (``--max-restarts``; then the
server exits with status 1). It listens on loopback unless ``--host`` says otherwise; with ``--api-key`` (or
``$DIT_SP_SERVE_API_KEY``) every request needs ``Authorization: Bearer KEY``.

Under torchrun (several nodes: ``torchrun --nnodes 2 --nproc-per-node 8 ... -m pipelines.serve --ulysses 8 ...``)
every rank is a worker, laid out as ``generate`` lays them out there (dp: the processes left over), and rank 0
serves HTTP besides; the ranks reach each other through torchrun's store. SIGTERM to rank 0's torchrun stops
them all; a rank that fails ends the server (exit status 1): torchrun's ``--max-restarts`` restarts the world.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import signal
import sys
from pathlib import Path

from dit_sp.errors import ConfigError
from dit_sp.inference.config import GenerateConfig
from dit_sp.io.cli import ArgumentParser, finite_float, parse_key_values, run_main
from dit_sp.io.runlock import run_lock
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.server.limits import MiB, ServerLimits, is_loopback, require_aiohttp
from dit_sp.server.scheduler import ScheduleLimits

API_KEY_ENV = "DIT_SP_SERVE_API_KEY"
LIMITS, SCHEDULE = ServerLimits(), ScheduleLimits()


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog("pipelines.serve"), description=__doc__, formatter_class=HelpFormatter)
    add = parser.add_argument
    add("--model", default=None, help="a built-in model name or a local diffusers directory (default: generate's)")
    add("--config", default=None, help="YAML file of generate settings, or a bundled config name")
    add("--set", action="append", default=[], metavar="KEY=VALUE",
        help="a served default, as generate's setting (e.g. steps=30, frames=81; repeatable)")  # fmt: skip
    add("--ulysses", type=int, default=None, help="Ulysses degree of a sample (default: 1)")
    add("--ring", type=int, default=None, help="ring-attention degree of a sample (default: 1)")
    add(
        "--cfg-parallel",
        action="store_true",
        default=None,
        help="the two guidance branches on two halves (default: off)",
    )
    add("--dp", type=int, default=None, help="data-parallel groups, each running one job at a time (default: 1)")
    add("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    add("--port", type=int, default=8000, help="TCP port (0: any free one, printed)")
    add("--api-key", default=None, metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' (401 otherwise); default: ${API_KEY_ENV}")  # fmt: skip
    add("--lora-dir", default=None, metavar="DIR",
        help="LoRA adapters a request may name (lora: NAME): the directories of DIR that hold diffusers' "
             "pytorch_lora_weights.safetensors (default: none)")  # fmt: skip
    add("--job-dir", default="outputs/serve", help="where jobs and their videos persist (one server per directory)")
    add("--max-queued", type=int, default=64, help="jobs waiting at once; more are answered 429")
    add("--max-request-mb", type=finite_float, default=64.0, metavar="MB", help="largest request body (413 beyond)")
    add("--read-timeout", type=finite_float, default=LIMITS.read_timeout, metavar="S",
        help="seconds a client has to send its request (408 beyond)")  # fmt: skip
    add("--job-timeout", type=finite_float, default=SCHEDULE.job_timeout, metavar="S",
        help="seconds a job may run; then it fails and the workers restart")  # fmt: skip
    add("--start-timeout", type=finite_float, default=SCHEDULE.start_timeout, metavar="S",
        help="seconds the workers have to load the model")  # fmt: skip
    add("--shutdown-grace", type=finite_float, default=SCHEDULE.shutdown_grace, metavar="S",
        help="at SIGTERM, seconds running jobs get to finish before they are cancelled")  # fmt: skip
    add("--max-restarts", type=int, default=SCHEDULE.max_restarts, metavar="N",
        help="worker restarts after failures before the server exits with status 1")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    overrides = parse_key_values(args.set, "--set", "steps=30")
    for key in ("model", "ulysses", "ring", "cfg_parallel", "dp"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    bad = sorted(set(overrides) & {"prompts", "out", "save_latents", "image", "last_image"})
    if bad:
        raise ConfigError(f"--set {bad[0]}: requests give their own; a served default is any other generate setting")
    config = GenerateConfig.load(args.config, overrides)
    if "RANK" in os.environ:  # under torchrun: its world is the workers, laid out as generate lays them out
        config = _torchrun_layout(config)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    timings = {"--job-timeout": args.job_timeout, "--start-timeout": args.start_timeout,
               "--shutdown-grace": args.shutdown_grace, "--max-request-mb": args.max_request_mb}  # fmt: skip
    for flag, value in timings.items():
        if not value > 0:
            raise ConfigError(f"{flag} must be > 0, got {value:g}")
    if args.max_queued < 1 or args.max_restarts < 0:
        raise ConfigError("--max-queued must be >= 1 and --max-restarts >= 0")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    limits = ServerLimits(max_request_bytes=round(args.max_request_mb * MiB), read_timeout=args.read_timeout,
                          api_key=api_key)  # fmt: skip
    schedule = ScheduleLimits(job_timeout=args.job_timeout, start_timeout=args.start_timeout,
                              shutdown_grace=args.shutdown_grace, max_restarts=args.max_restarts)  # fmt: skip
    if args.lora_dir is not None:
        if not Path(args.lora_dir).is_dir():
            raise ConfigError(f"--lora-dir {args.lora_dir}: no such directory")
        if config.shard_weights or config.compile:
            raise ConfigError("--lora-dir switches adapters between jobs, which --shard-weights and --compile do not "
                              "allow: drop one")  # fmt: skip
    require_aiohttp()
    from dit_sp.zoo import check_checkpoint, check_shape_from_files

    check_checkpoint(config.model)  # the model's files and the served defaults' sizes, before workers start
    if config.refine:  # (--set refine=true or a --config file) the workers load the stage-2 refiner too
        from dit_sp.zoo.refiner import check_refiner, check_refiner_layout

        check_refiner(config.model)
        check_refiner_layout(config.model, config.ulysses * (2 if config.cfg_parallel else 1), "the workers' layout")
    check_shape_from_files(config.model, dataclasses.asdict(config))
    if os.environ.get("RANK", "0") != "0":  # a worker of torchrun's world: rank 0 serves and ends it
        from dit_sp.server.cluster import run_rank

        lora_dir = str(Path(args.lora_dir).resolve()) if args.lora_dir else None
        status = run_rank(config, lora_dir)
        sys.stdout.flush()
        os._exit(status)  # as below: skip the native teardown of torch's distributed objects
    with run_lock(args.job_dir):
        fatal = asyncio.run(_serve(config, limits, schedule, args))
    if fatal:
        print(f"error: {fatal}", file=sys.stderr, flush=True)
    gc.collect()  # the pools' queues: their semaphores are released by their finalizers, which os._exit skips
    sys.stdout.flush()
    # The workers, their threads and the listener are stopped and joined by now; what is left is the native
    # teardown of torch's distributed objects at interpreter exit, which takes seconds and does nothing for us.
    os._exit(1 if fatal else 0)


def _torchrun_layout(config: GenerateConfig) -> GenerateConfig:
    """``config`` with ``dp`` what torchrun's world leaves to it (as ``generate`` takes it under torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sample = config.ring * config.ulysses * (2 if config.cfg_parallel else 1)
    if world % sample:
        raise ConfigError(f"torchrun's {world} processes do not divide into samples of cfg*ring*ulysses={sample}")
    if config.dp is not None and config.dp != world // sample:
        raise ConfigError(f"--dp {config.dp}, but torchrun's {world} processes / (cfg*ring*ulysses={sample}) give dp "
                          f"{world // sample}: drop --dp")  # fmt: skip
    return dataclasses.replace(config, dp=world // sample)


async def _serve(config: GenerateConfig, limits: ServerLimits, schedule: ScheduleLimits, args) -> str | None:
    from dit_sp.server.jobs import JobStore
    from dit_sp.server.scheduler import Scheduler
    from dit_sp.server.videos import VideoServer

    served = os.path.basename(os.path.normpath(config.model))
    store = JobStore(args.job_dir, args.max_queued)
    lora_dir = str(Path(args.lora_dir).resolve()) if args.lora_dir else None
    if "RANK" in os.environ:
        from dit_sp.server.cluster import ClusterPool

        scheduler = Scheduler(store, config, schedule, pool_factory=ClusterPool, lora_dir=lora_dir)
    else:
        scheduler = Scheduler(store, config, schedule, lora_dir=lora_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(scheduler.start())
    await asyncio.wait([starting, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped while loading
        starting.cancel()
        await scheduler.shutdown()
        return None
    starting.result()
    server = VideoServer(store, scheduler, config, served, limits, Path(lora_dir) if lora_dir else None)
    try:
        bound = await server.start(args.host, args.port)
    except ConfigError:
        await scheduler.shutdown()
        raise
    if not is_loopback(args.host) and limits.api_key is None:
        print(f"warning: serving on {args.host} without an API key: anyone who can reach this port can generate; "
              f"set --api-key (or ${API_KEY_ENV})", file=sys.stderr, flush=True)  # fmt: skip
    print(f"serving {served} on http://{args.host}:{bound} ({config.world_size} workers, dp {config.dp or 1})",
          flush=True)  # fmt: skip
    await asyncio.wait([asyncio.create_task(stop.wait()), asyncio.create_task(scheduler.stopped.wait())],
                       return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    print("stopping: no new jobs; running jobs get --shutdown-grace "
          f"{schedule.shutdown_grace:g} s", file=sys.stderr, flush=True)  # fmt: skip
    await scheduler.shutdown()
    await server.stop()
    return scheduler.fatal


if __name__ == "__main__":
    run_main(main)
