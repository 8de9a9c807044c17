"""Serve a reward over HTTP, for a trainer whose reward model lives elsewhere (its own GPUs or node).

    python -m pipelines.reward_server --reward clip_score --option path=/ckpt/clip-vit --port 8000
    DIT_SP_REWARD_API_KEY=$(cat key) python -m pipelines.reward_server --reward pickscore --host 10.0.0.5

``--reward`` is what a training config's ``reward`` takes (a name, ``{name: weight}`` or a list), and
``--option KEY=VALUE`` sets a constructor option of a single named reward. The trainer then uses
``reward: {name: remote, url: http://HOST:PORT}`` (``dit_sp.rl.rewards.remote.RemoteReward``). Endpoints:
``POST /score`` and ``GET /health``. Prints ``serving REWARD on http://HOST:PORT`` once it listens.

It listens on loopback (127.0.0.1) unless ``--host`` says otherwise. Beyond loopback, anyone who reaches the
port can make it score: bind to another address only on a private network, with a shared key (``--api-key``
or ``$DIT_SP_REWARD_API_KEY``; the trainer's ``api_key`` or the same variable), and behind a TLS-terminating
proxy where the network is not trusted (the key and videos travel in plain HTTP otherwise). Requests are
bounded: a body over ``--max-request-mb`` is refused (413) from its headers, a client slower than
``--read-timeout`` is dropped (408), ``--max-pending`` requests are held at once (503 beyond), a batch not
scored within ``--score-timeout`` gets 504, and a malformed request gets 400; every error is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys

import yaml

from dit_sp.errors import ConfigError
from dit_sp.io.cli import ArgumentParser, parse_key_values, run_main
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.rl.rewards import build_reward
from dit_sp.server.limits import DEFAULT_MAX_REQUEST_MB, MiB, ServerLimits, api_key_from, is_loopback, require_aiohttp

LIMITS = ServerLimits()


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog("pipelines.reward_server"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--reward", required=True, help="a reward name, {name: weight, ...} or a list (YAML)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the named reward, e.g. path=/ckpt/clip (YAML, repeatable)")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free one, printed)")
    parser.add_argument("--max-request-mb", type=float, default=DEFAULT_MAX_REQUEST_MB, metavar="MB",
                        help="largest request body in MiB, refused with 413 before it is read (default "
                             f"{DEFAULT_MAX_REQUEST_MB}: a request is about batch x frames x H x W x 3 bytes in "
                             "uint8, 4x that in float32; 5 x 81 x 480 x 832 x 3 = 463 MiB). The server holds up "
                             "to (max-pending + 4) x this in memory")  # fmt: skip
    parser.add_argument("--read-timeout", type=float, default=LIMITS.read_timeout, metavar="S",
                        help="seconds a client has to send a request's headers and body, else it is dropped "
                             f"(408; default {LIMITS.read_timeout:g})")  # fmt: skip
    parser.add_argument("--score-timeout", type=float, default=LIMITS.score_timeout, metavar="S",
                        help="seconds a request may wait for the scorer and be scored, else 504 (default "
                             f"{LIMITS.score_timeout:g})")  # fmt: skip
    parser.add_argument("--max-pending", type=int, default=LIMITS.max_pending, metavar="N",
                        help="requests held at once (being read, queued or scored; one is scored at a time); "
                             f"more are answered 503 with Retry-After (default {LIMITS.max_pending})")  # fmt: skip
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every request, /health too (401 otherwise); "
                             "default: $DIT_SP_REWARD_API_KEY, which other users cannot read in the process "
                             "list, unlike this flag")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not (math.isfinite(args.max_request_mb) and args.max_request_mb > 0):
        raise ConfigError(f"--max-request-mb must be a finite number of MiB > 0, got {args.max_request_mb}")
    limits = ServerLimits(max_request_bytes=round(args.max_request_mb * MiB), read_timeout=args.read_timeout,
                          score_timeout=args.score_timeout, max_pending=args.max_pending,
                          api_key=api_key_from(args.api_key))  # fmt: skip
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    require_aiohttp()
    spec = yaml.safe_load(args.reward)
    if args.option:
        if not isinstance(spec, str):
            raise ConfigError("--option sets an option of one named reward; with a mapping or list, put the options "
                              "in --reward's entries")  # fmt: skip
        spec = [{"name": spec, **parse_key_values(args.option, "--option", "path=/ckpt/clip")}]
    asyncio.run(_serve(build_reward(spec), limits, args.host, args.port, args.reward))


async def _serve(reward, limits: ServerLimits, host: str, port: int, name: str) -> None:
    from dit_sp.server.rewards import RewardServer

    server = RewardServer(reward, limits)
    bound = await server.start(host, port)
    if not is_loopback(host) and limits.api_key is None:
        print(f"warning: serving on {host} without an API key: anyone who can reach this port can use the "
              "scorer; set --api-key (or $DIT_SP_REWARD_API_KEY) and keep it on a private network or behind a "
              "TLS proxy", file=sys.stderr, flush=True)  # fmt: skip
    print(f"serving {name} on http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()  # until interrupted
    finally:
        await server.stop()


if __name__ == "__main__":
    run_main(main)
