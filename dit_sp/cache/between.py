"""What a family adds to the hidden states between its blocks, under a step cache (``ModelFamily.cache_between_blocks``:
Wan Animate's face adapters, ConsisID's identity perceiver cross-attention).

Such a module runs after a block, outside it, and the model adds its output to the hidden states
(``hidden_states = hidden_states + module(..., hidden_states, ...)``). The residual a step cache keeps is taken from
the first block to the last (first-block cache: from the first block's output; TeaCache: from its input), so it holds
every addition made after the first block and before the last block returns. On a skipped step the blocks between
pass their inputs through; these modules must then add nothing, or their effect would count twice: each returns zeros
shaped as its ``hidden_states`` argument. A module that runs after the last block (outside the residual) and any on a
computed step run as they are. Which side of the span a call is on is read as the model runs (the span opens when
the first block returns and closes when the last one does), so the families declare only the modules' names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from diffusers.hooks.hooks import ModelHook

from dit_sp.cache.blocks import register_hook, remove_hook, transformer_blocks
from dit_sp.errors import ConfigError

_SPAN_HOOK, _BETWEEN_HOOK = "dit_sp_cache_span", "dit_sp_cache_between"


class _Span:
    """Whether the model's call in progress is between its first block's return and its last block's."""

    def __init__(self) -> None:
        self.open = False


class _Edge(ModelHook):
    """On the model (closes: a new call), the first block (opens when it returns) and the last (closes)."""

    def __init__(self, span: _Span, before: bool | None, after: bool | None):
        super().__init__()
        self.span, self.before, self.after = span, before, after

    def pre_forward(self, module, *args, **kwargs):
        if self.before is not None:
            self.span.open = self.before
        return args, kwargs

    def post_forward(self, module, output):
        if self.after is not None:
            self.span.open = self.after
        return output


class _Between(ModelHook):
    """A between-block module: zeros of its ``hidden_states`` ``(B, S_local, C)`` inside the span of a skipped step."""

    def __init__(self, span: _Span, computing: Callable[[], bool]):
        super().__init__()
        self.span, self.computing = span, computing

    def initialize_hook(self, module):
        self.signature = inspect.signature(type(module).forward)
        return module

    def new_forward(self, module, *args, **kwargs):
        if self.span.open and not self.computing():
            return torch.zeros_like(self.signature.bind(module, *args, **kwargs).arguments["hidden_states"])
        return self.fn_ref.original_forward(*args, **kwargs)


def between_modules(model: torch.nn.Module, names: Sequence[str]) -> list[torch.nn.Module]:
    """The modules ``names`` declares (attributes of ``model``: a module, or a ``ModuleList`` of them), each checked
    to take ``hidden_states``."""
    modules = []
    for name in names:
        found = getattr(model, name, None)
        if not isinstance(found, torch.nn.Module):
            raise ConfigError(f"step caching: {type(model).__name__} has no module {name!r} that its family declares "
                              "as added between its blocks (cache_between_blocks)")  # fmt: skip
        for module in found if isinstance(found, torch.nn.ModuleList) else [found]:
            if "hidden_states" not in inspect.signature(type(module).forward).parameters:
                raise ConfigError(f"step caching: {type(model).__name__}.{name} ({type(module).__name__}) takes no "
                                  "'hidden_states' argument; its family's cache_between_blocks is wrong")  # fmt: skip
            modules.append(module)
    return modules


def apply(model: torch.nn.Module, names: Sequence[str], computing: Callable[[], bool]) -> Callable[[], None]:
    """Hooks that make the modules ``names`` declares add nothing between the first and the last block of a step the
    cache skips (``computing()``: whether the call in progress runs its blocks, read after the first block decided).
    Returns the undo."""
    modules = between_modules(model, names)
    if not modules:
        return lambda: None
    blocks, span = transformer_blocks(model), _Span()
    edges = [(model, _Edge(span, False, None)), (blocks[0], _Edge(span, None, True)),
             (blocks[-1], _Edge(span, None, False))]  # fmt: skip
    for module, hook in edges:
        register_hook(module, hook, _SPAN_HOOK)
    for module in modules:
        register_hook(module, _Between(span, computing), _BETWEEN_HOOK)

    def undo() -> None:
        for module, _ in edges:
            remove_hook(module, _SPAN_HOOK)
        for module in modules:
            remove_hook(module, _BETWEEN_HOOK)

    return undo
