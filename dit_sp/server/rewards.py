"""The reward server's aiohttp application (``python -m pipelines.reward_server``): any registered reward
(a ``WeightedReward``) scored over HTTP for the trainer's ``remote`` reward, in the wire format of
``dit_sp.rl.rewards.wire``."""

from __future__ import annotations

from typing import Any

from dit_sp.rl.rewards.registry import score
from dit_sp.rl.rewards.wire import decode_batch


def make_app(reward: Any) -> Any:
    """The aiohttp application serving ``reward`` (a ``WeightedReward``): ``POST /score``, ``GET /health``.
    Requests are scored one at a time, off the event loop (so ``/health`` answers meanwhile)."""
    import asyncio

    from aiohttp import web

    lock = asyncio.Lock()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "reward": [name for name, _, _ in reward.parts]})

    async def score_batch(request: web.Request) -> web.Response:
        try:
            videos, prompts, images = decode_batch(await request.read())
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        async with lock:
            rewards = await asyncio.get_running_loop().run_in_executor(None, score, reward, videos, prompts, images)
        return web.json_response({"rewards": [float(r) for r in rewards]})

    app = web.Application(client_max_size=1 << 34)  # videos are large
    app.add_routes([web.get("/health", health), web.post("/score", score_batch)])
    return app
