"""TeaCache-style step cache: decide before the first block from the change of its modulated input.

Per call, the family's probe (``ModelFamily.teacache_probe``: the first block's timestep-modulated input,
or the timestep embedding where TeaCache uses that, as for Wan) is compared with the last call's; the
relative L1 change, reduced over the deciding group, is rescaled by a polynomial and accumulated. While
the sum stays under the threshold no block runs: the output is the input plus the residual that all the
blocks added at the last computed step. The first call runs, and so does the last step where the pipeline's
cache context gives the step (as TeaCache does). Built on diffusers' hook registry, so per-branch state follows
the pipeline's ``cache_context("cond" / "uncond")`` exactly as diffusers' own caches do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers.hooks.hooks import BaseState, ModelHook, StateManager

from dit_sp._compat import block_argument
from dit_sp.cache.blocks import block_metadata, register_hook, remove_hook, transformer_blocks
from dit_sp.cache.decide import CacheStats, DecisionGroup, StepRecord, relative_change
from dit_sp.cache.spec import CacheSpec

_HEAD_HOOK, _BLOCK_HOOK = "dit_sp_teacache_head", "dit_sp_teacache_block"
Probe = Callable[[torch.nn.Module, object, tuple, dict], tuple[torch.Tensor, bool]]


class _State(BaseState):
    def __init__(self) -> None:
        super().__init__()
        self.previous_probe: torch.Tensor | None = None
        self.accumulated = 0.0
        self.calls = 0
        self.should_compute = True
        self.head_inputs: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.residuals: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def reset(self) -> None:
        self.__init__()


def _polynomial(coefficients: tuple[float, ...], x: float) -> float:
    result = 0.0
    for c in coefficients:  # highest power first, as numpy.poly1d
        result = result * x + c
    return result


class _BlockHook(ModelHook):
    """Every block: passes its inputs through on a skipped step; the last block records the residual."""

    def __init__(self, state_manager: StateManager, is_tail: bool):
        super().__init__()
        self.state_manager, self.is_tail = state_manager, is_tail

    def initialize_hook(self, module):
        self.meta = block_metadata(module)
        return module

    def inputs(self, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = block_argument(self.meta, "hidden_states", args, kwargs)
        if self.meta.return_encoder_hidden_states_index is None:
            return hidden, None
        return hidden, block_argument(self.meta, "encoder_hidden_states", args, kwargs)

    def outputs(self, hidden: torch.Tensor, encoder: torch.Tensor | None):
        if self.meta.return_encoder_hidden_states_index is None:
            return hidden
        out = [None, None]
        out[self.meta.return_hidden_states_index] = hidden
        out[self.meta.return_encoder_hidden_states_index] = encoder
        return tuple(out)

    def split_output(self, output) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(output, tuple):
            return output, None
        encoder = self.meta.return_encoder_hidden_states_index
        return output[self.meta.return_hidden_states_index], (None if encoder is None else output[encoder])

    def new_forward(self, module, *args, **kwargs):
        state = self.state_manager.get_state()
        if not state.should_compute:
            return self.outputs(*self.inputs(args, kwargs))
        return self.run(state, args, kwargs)

    def run(self, state: _State, args: tuple, kwargs: dict):
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.is_tail:
            (hidden, encoder), (first_hidden, first_encoder) = self.split_output(output), state.head_inputs
            state.residuals = (hidden - first_hidden, None if encoder is None else encoder - first_encoder)
        return output

    def reset_state(self, module):
        self.state_manager.reset()
        return module


class _HeadHook(_BlockHook):
    """The first block: decides for the whole stack, before any block runs."""

    _is_stateful = True

    def __init__(self, state_manager: StateManager, spec: CacheSpec, probe: Probe, where: DecisionGroup,
                 stats: CacheStats, blocks: int):  # fmt: skip
        super().__init__(state_manager, is_tail=False)
        self.spec, self.probe, self.where, self.stats, self.blocks = spec, probe, where, stats, blocks

    def new_forward(self, module, *args, **kwargs):
        state = self.state_manager.get_state()
        state.calls += 1
        probe, per_token = self.probe(module, self.meta, args, kwargs)
        probe = probe.detach()
        change = local = None
        if state.previous_probe is not None:
            change, local = relative_change(probe, state.previous_probe, self.where, per_token)
            state.accumulated += _polynomial(self.spec.coefficients, change)
        context = self.state_manager.context  # the pipeline's step, where it says (Wan): the last always runs
        last = context.step_index is not None and context.step_index == (context.num_inference_steps or 0) - 1
        computed = (change is None or state.residuals is None or last or state.calls <= self.spec.warmup
                    or state.accumulated >= self.spec.threshold)  # fmt: skip
        if computed:
            state.accumulated = 0.0
        state.previous_probe, state.should_compute = probe, computed
        self.stats.records.append(StepRecord(self.state_manager.context.name, computed,
                                             self.blocks if computed else 0, self.blocks, change, local))  # fmt: skip
        hidden, encoder = self.inputs(args, kwargs)
        if computed:
            state.head_inputs = (hidden, encoder)
            return self.run(state, args, kwargs)
        residual, encoder_residual = state.residuals
        return self.outputs(hidden + residual, None if encoder is None else encoder + encoder_residual)


def apply(model: torch.nn.Module, spec: CacheSpec, probe: Probe, where: DecisionGroup,
          stats: CacheStats) -> tuple[Callable[[], None], Callable[[], bool]]:  # fmt: skip
    """Returns the undo, and whether the call in progress runs its blocks (once the first block decided)."""
    blocks = transformer_blocks(model)
    state_manager = StateManager(_State)
    register_hook(blocks[0], _HeadHook(state_manager, spec, probe, where, stats, len(blocks)), _HEAD_HOOK)
    for index, block in enumerate(blocks[1:], 1):
        register_hook(block, _BlockHook(state_manager, is_tail=index == len(blocks) - 1), _BLOCK_HOOK)

    def undo() -> None:
        remove_hook(blocks[0], _HEAD_HOOK)
        for block in blocks[1:]:
            remove_hook(block, _BLOCK_HOOK)

    return undo, lambda: state_manager.get_state().should_compute
