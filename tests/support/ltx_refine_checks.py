"""Worker side of the LTX-2 DFR temporal refine test: the page's Python block (a DFR pass, then a refine round, each
under ``parallelize``), run once per layout, recording the video tokens of every transformer call and of its video
self-attention on this rank."""

from __future__ import annotations

from typing import Any

import torch
from doc_blocks import run_snippet

TRANSFORMER = "LTX2VideoTransformer3DModel"


def _recorder(full: set[int], local: set[int]) -> Any:
    """A global forward pre-hook: ``full`` gets the video length each transformer call is given (before the split,
    which the transformer's own hooks do), ``local`` the video length its blocks' self-attention (``attn1``) runs on."""
    attn1: set[int] = set()

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if type(module).__name__ == TRANSFORMER:
            full.add((args[0] if args else kwargs["hidden_states"]).shape[1])
            attn1.update(id(block.attn1) for block in module.transformer_blocks)
        elif id(module) in attn1:
            local.add((args[0] if args else kwargs["hidden_states"]).shape[1])

    return torch.nn.modules.module.register_module_forward_pre_hook(record, with_kwargs=True)


def refine_runs(runs: dict[str, str], cwd: str) -> dict[str, dict[str, Any]]:
    """Each ``{name: code}`` run in this worker (one spawn for all): the DFR pass's latents, keyframes and positions,
    the refine round's latents, keyframes and positions, its decoded frames, and the sorted video lengths each
    transformer call got (``"full"``) and this rank's self-attention ran on (``"local"``)."""
    results = {}
    for name, code in runs.items():
        full: set[int] = set()
        local: set[int] = set()
        handle = _recorder(full, local)
        try:
            scope = run_snippet(code, cwd, ("first", "refined", "video"))
        finally:
            handle.remove()
        first, refined = scope["first"], scope["refined"]
        results[name] = {
            "dfr": first.frames,
            "dfr_keyframes": first.keyframes,
            "dfr_positions": list(first.keyframe_positions),
            "latents": refined.frames,
            "keyframes": refined.keyframes,
            "positions": list(refined.keyframe_positions),
            "frames": torch.as_tensor(scope["video"]),
            "full": sorted(full),
            "local": sorted(local),
        }
    return results
