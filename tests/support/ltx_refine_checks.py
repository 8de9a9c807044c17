"""Worker side of the LTX-2 DFR temporal refine test: the page's Python block (a DFR pass, then a refine round, each
under ``parallelize``), run once per layout, recording the video tokens of every transformer call and of its video
self-attention on this rank."""

from __future__ import annotations

from typing import Any

import torch
from doc_blocks import run_snippet

TRANSFORMER = "LTX2VideoTransformer3DModel"


def _recorder(full: set[int], seen: set[tuple[int, int]]) -> Any:
    """A global forward hook: ``full`` gets the video length of each transformer call (its video output, gathered
    whole), ``seen`` each module's ``(id, hidden_states length)`` on this rank."""

    def record(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if type(module).__name__ == TRANSFORMER:
            full.add(output[0].shape[1])
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor) and hidden.ndim == 3:
            seen.add((id(module), hidden.shape[1]))

    return torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)


def refine_runs(runs: dict[str, str], cwd: str) -> dict[str, dict[str, Any]]:
    """Each ``{name: code}`` run in this worker (one spawn for all): the DFR pass's latents, keyframes and positions,
    the refine round's latents, keyframes and positions, its decoded frames, and the sorted video lengths each
    transformer call got (``"full"``) and this rank's self-attention ran on (``"local"``)."""
    results = {}
    for name, code in runs.items():
        full: set[int] = set()
        seen: set[tuple[int, int]] = set()
        handle = _recorder(full, seen)
        try:
            scope = run_snippet(code, cwd, ("first", "refined", "video", "refine"))
        finally:
            handle.remove()
        first, refined = scope["first"], scope["refined"]
        attn1 = {id(block.attn1) for block in scope["refine"].transformer.transformer_blocks}  # the DFR pass's too
        local = {length for module, length in seen if module in attn1}
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
