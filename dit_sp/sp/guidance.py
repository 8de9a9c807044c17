"""CFG parallelism: the two classifier-free-guidance branches of one denoising step on the two cfg ranks."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from diffusers.models.modeling_outputs import Transformer2DModelOutput

from dit_sp.cache import cache_context_of, set_cache_context
from dit_sp.families import ModelFamily
from dit_sp.parallel.state import ParallelState
from dit_sp.sp.handle import first_output, output_like


class GuidancePair:
    """Runs the two guidance branches of one denoising step on the two cfg ranks at once.

    ``sequential`` pipelines call the transformer twice per step, conditional first, and read the first
    result only after the second call. So the first call is only recorded and returns a placeholder
    filled with NaN (a pipeline that reads it early computes NaN, never stale numbers); the second call
    runs the branch of this rank (cfg rank 0: the recorded conditional call, cfg rank 1: the
    unconditional one), the two results are exchanged, and the placeholder is filled in place.
    ``batched`` pipelines call once on ``[unconditional, conditional]``: each rank runs its half (of every
    output: LTX-2 gives video and audio). A call of an odd batch is no such pair: a pipeline's extra guidance pass
    (LTX-2's spatio-temporal and modality-isolation passes, the conditional half alone, batch 1) runs whole on both
    cfg ranks, as on one process (the same inputs on both give the same output; no exchange).
    A family whose calls return several outputs (Kandinsky 6: video and audio) names the shapes of the later ones
    (``ModelFamily.cfg_extra_outputs``): each gets its placeholder, and every output is exchanged.
    The recorded call runs in the step-cache context it was made in (``cond``), so each branch's cache
    keeps its own state, as in one process.
    """

    def __init__(self, parallel: ParallelState, family: ModelFamily):
        self.parallel, self.family = parallel, family
        self.pending: tuple | None = None
        self.unpaired: Callable[[], bool] = lambda: False
        """Whether a ``sequential`` call starting a pair is no pair's: a modular pipeline's guider makes one call at
        this step (Helios' distilled pyramid: its first chunk's amplified steps past the guider's step count); it
        runs whole on both cfg ranks, as on one process."""

    def reset(self) -> None:
        self.pending = None

    def _exchange(self, mine: torch.Tensor) -> list[torch.Tensor]:
        both = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(both, mine.contiguous(), group=self.parallel.cfg_group)
        return both

    def sequential(self, model: torch.nn.Module, forward, args: tuple, kwargs: dict) -> Any:
        if self.pending is None and self.unpaired():  # one call at this step: the same on both ranks
            return forward(*args, **kwargs)
        if self.pending is None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if getattr(self.family, "channels_last", False):  # (Kandinsky 5: latents (B, F, H, W, C))
                channels = model.config.get("out_visual_dim") or hidden.shape[-1]
                shape = (*hidden.shape[:-1], channels)
            else:
                channels = model.config.get("out_channels") or hidden.shape[1]
                shape = (hidden.shape[0], channels, *hidden.shape[2:])
            placeholder = hidden.new_full(shape, float("nan"))
            extra = self._extra_placeholders(model, forward, args, kwargs)
            self.pending = (forward, args, kwargs, (placeholder, *extra), cache_context_of(model))
            if extra:
                return (placeholder, *extra)
            return (placeholder,) if not kwargs.get("return_dict", True) else Transformer2DModelOutput(placeholder)
        cond_forward, cond_args, cond_kwargs, placeholders, cond_context = self.pending
        self.pending = None
        if self.parallel.cfg_rank == 0:
            context = cache_context_of(model)
            set_cache_context(model, cond_context)
            try:
                out = cond_forward(*cond_args, **cond_kwargs)
            finally:
                set_cache_context(model, context)
        else:
            out = forward(*args, **kwargs)
        outputs = list(out) if len(placeholders) > 1 else [first_output(out)]
        if len(outputs) != len(placeholders):
            raise RuntimeError(f"guidance branch returned {len(outputs)} outputs, expected {len(placeholders)}")
        unconditional = []
        for mine, placeholder in zip(outputs, placeholders):
            cond, uncond = self._exchange(mine)
            if cond.shape != placeholder.shape:
                raise RuntimeError(f"guidance branch output {tuple(cond.shape)} != expected {tuple(placeholder.shape)}")
            placeholder.copy_(cond)
            unconditional.append(uncond)
        return output_like(out, unconditional[0]) if len(placeholders) == 1 else tuple(unconditional)

    def _extra_placeholders(self, model: torch.nn.Module, forward, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        """NaN placeholders of the outputs after the first (``ModelFamily.cfg_extra_outputs``), for a tuple-returning
        call (``return_dict=False``, as the pipelines that have them call)."""
        if self.family is None or self.family.cfg_extra_outputs is None:  # no family: one output
            return []
        arguments = inspect.signature(forward).bind(*args, **kwargs).arguments
        shapes = self.family.cfg_extra_outputs(model, arguments)
        if shapes and kwargs.get("return_dict", True):
            raise NotImplementedError(
                f"cfg parallelism for {type(model).__name__} with several outputs takes calls with return_dict=False"
            )
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        return [hidden.new_full(shape, float("nan")) for shape in shapes]

    def batched(self, forward, args: tuple, kwargs: dict) -> Any:
        bound = inspect.signature(forward).bind(*args, **kwargs)
        hidden = bound.arguments.get("hidden_states")
        batch = hidden.shape[0] if isinstance(hidden, torch.Tensor) else 0
        if batch % 2:  # not a guidance pair (LTX-2's STG and modality passes: batch 1): whole on both cfg ranks
            return forward(*args, **kwargs)
        for name in self.family.cfg_batched_args:
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if value.shape[0] == 1 and batch > 1:
                    continue  # one entry broadcast over the guidance batch (LTX long's video_coords): both take it
                if value.shape[0] % 2:
                    raise ValueError(f"cfg parallelism needs an even guidance batch; {name} has {value.shape[0]}")
                bound.arguments[name] = value.chunk(2)[self.parallel.cfg_rank]
        out = forward(*bound.args, **bound.kwargs)
        if isinstance(out, (tuple, list)) and len(out) > 1:  # every output's halves (LTX-2: video and audio)
            return type(out)(torch.cat(self._exchange(o), 0) if isinstance(o, torch.Tensor) else o for o in out)
        if not isinstance(out, (tuple, list)) and len(out) > 1:  # a BaseOutput of several fields
            return type(out)(**{k: torch.cat(self._exchange(v), 0) for k, v in out.items()})
        return output_like(out, torch.cat(self._exchange(first_output(out)), 0))
