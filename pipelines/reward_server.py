"""Serve a reward over HTTP, for a trainer whose reward model lives elsewhere (its own GPUs or node).

    python -m pipelines.reward_server --reward clip_score --option path=/ckpt/clip-vit --port 8000
    python -m pipelines.reward_server --reward "{brightness: 1.0, saturation: 0.5}" --host 0.0.0.0

``--reward`` is what a training config's ``reward`` takes (a name, ``{name: weight}`` or a list), and
``--option KEY=VALUE`` sets a constructor option of a single named reward. The trainer then uses
``reward: {name: remote, url: http://HOST:PORT}`` (``dit_sp.rl.rewards.remote.RemoteReward``). Endpoints:
``POST /score`` and ``GET /health``. Prints ``serving REWARD on http://HOST:PORT`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio

import yaml

from dit_sp.errors import ConfigError
from dit_sp.io.cli import parse_key_values, run_main
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.rl.rewards import build_reward
from dit_sp.server.rewards import make_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=prog("pipelines.reward_server"), description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("--reward", required=True, help="a reward name, {name: weight, ...} or a list (YAML)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the named reward, e.g. --option path=/ckpt/clip (a YAML value; repeatable; "
                        "default: none)")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free one, printed)")
    args = parser.parse_args(argv)
    spec = yaml.safe_load(args.reward)
    if args.option:
        if not isinstance(spec, str):
            raise ConfigError("--option sets an option of one named reward; with a mapping or list, put the options "
                              "in --reward's entries")  # fmt: skip
        spec = [{"name": spec, **parse_key_values(args.option, "--option", "path=/ckpt/clip")}]
    reward = build_reward(spec)
    asyncio.run(_serve(make_app(reward), args.host, args.port, args.reward))


async def _serve(app, host: str, port: int, name: str) -> None:
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"serving {name} on http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()  # until interrupted
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    run_main(main)
