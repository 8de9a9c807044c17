"""LTX-Video, Mochi, LTX-2 (and later families of the same group): transformer inputs with an odd number of video
tokens (uneven over 2 ranks) and padded text, and the worker that checks them and their pipelines in one spawn."""

from __future__ import annotations

import math
from typing import Any

import torch

TRANSFORMER_MODELS = ("tiny-ltx", "tiny-ltx-i2v", "tiny-ltx-condition", "tiny-mochi")
"""The tiny transformers checked against one process (each name selects the inputs below)."""

VIDEO_TOKENS = {"tiny-ltx": 27, "tiny-ltx-i2v": 27, "tiny-ltx-condition": 27, "tiny-mochi": 9}
"""Video tokens of ``famA_inputs``: what the attention sees whole in one process, and in halves on 2 ranks."""


def _text_mask(batch: int, length: int) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length - 2 :] = 0  # per-sample prompt padding
    return mask


def famA_inputs(model: str, batch: int = 2) -> dict[str, Any] | None:
    """Forward arguments of the tiny transformer of ``model`` (``None`` for another group's model)."""
    if model not in VIDEO_TOKENS:
        return None
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    steps = torch.tensor([500.0, 20.0][:batch])
    if model.startswith("tiny-ltx"):  # 3 latent frames x 3 x 3 tokens, packed (B, S, C)
        inputs = {"hidden_states": rand(batch, 27, 8), "encoder_hidden_states": rand(batch, 7, 16),
                  "timestep": steps, "encoder_attention_mask": _text_mask(batch, 7)}  # fmt: skip
        if model == "tiny-ltx":
            return inputs | {"num_frames": 3, "height": 3, "width": 3, "rope_interpolation_scale": (0.32, 4.0, 4.0)}
        if model == "tiny-ltx-i2v":  # image-to-video: the first frame's 9 tokens are clean (timestep 0)
            per_token = steps[:, None] * (torch.arange(27) >= 9).float()
            return inputs | {"timestep": per_token, "num_frames": 3, "height": 3, "width": 3,
                             "rope_interpolation_scale": (0.32, 4.0, 4.0)}  # fmt: skip
        # the condition pipeline: video_coords (B, 3, S) and, without conditioning, one timestep (B, 1)
        grid = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(3.0), torch.arange(3.0), indexing="ij"))
        coords = (grid.flatten(1) * torch.tensor([[8 / 25], [32.0], [32.0]]))[None].repeat(batch, 1, 1)
        return inputs | {"timestep": steps[:, None], "video_coords": coords}
    if model == "tiny-mochi":  # 3 latent frames of 6 x 2 latents: 3 x 1 patches of 2, 9 tokens; text padded
        return {"hidden_states": rand(batch, 12, 3, 6, 2), "encoder_hidden_states": rand(batch, 7, 16),
                "timestep": steps, "encoder_attention_mask": _text_mask(batch, 7)}  # fmt: skip
    raise ValueError(model)


def record_local_tokens(seen: list[int]):
    """A global forward hook: the query length of every attention module whose processor dit-sp routed."""

    def hook(module, args, output):
        processor = getattr(module, "processor", None)
        if type(processor).__name__.startswith("SequenceParallel"):
            out = output[0] if isinstance(output, tuple) else output
            seen.append(out.shape[1])

    return torch.nn.modules.module.register_module_forward_hook(hook)


def check_famA(models: tuple[str, ...], jobs: list[Any]) -> dict[str, Any]:
    """In each of 2 workers: every tiny transformer on 1x2 and 2x1 against one process (``check_transformer``),
    with the query lengths its sequence-parallel attention saw, then each ``generate`` job (a ``GenerateConfig``)
    with the lengths of its run."""
    from model_checks import check_transformer

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    results: dict[str, Any] = {}
    for model in models:
        results[model] = check_transformer(model, [(1, 1, 2), (1, 2, 1)], relative=True)
        transformer = build_tiny(model, "transformer").float()
        seen: list[int] = []
        handle = record_local_tokens(seen)
        try:
            with torch.no_grad(), parallelize(transformer, init_parallel(ParallelConfig(ulysses=2))):
                transformer(**famA_inputs(model), return_dict=False)
        finally:
            handle.remove()
        results[model]["local_tokens"] = sorted(set(seen))
    from dit_sp import generate

    for i, settings in enumerate(jobs):
        seen = []
        handle = record_local_tokens(seen)
        try:
            report = generate(settings, True)
        finally:
            handle.remove()
        results[f"job{i}"] = report | {"local_tokens": sorted(set(seen))}
    return results


def half(tokens: int) -> int:
    return math.ceil(tokens / 2)
