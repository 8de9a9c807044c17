"""What a family does between its blocks, under a step cache: modules whose output the model adds to the hidden states
(``ModelFamily.cache_between_blocks``: Wan Animate's face adapters, ConsisID's identity perceiver cross-attention), and
a last block that lays the hidden states out otherwise than the first (``ModelFamily.cache_layout``: Latte).

The residual a step cache keeps is taken from the first block to the last (first-block cache: from the first block's
output; TeaCache: from its input), so it holds everything done after the first block and before the last one returns.

- Added modules: such a module runs after a block, outside it (``hidden_states = hidden_states + module(...,
  hidden_states, ...)``). On a skipped step the blocks between pass their inputs through; the modules must then add
  nothing, or their effect would count twice: each returns zeros shaped as its ``hidden_states`` argument. One that
  runs after the last block (outside the residual), and all on a computed step, run as they are.
- Layouts: the last block's output is put in the first block's layout (inside the policy's hooks) for the residual,
  and back for the model. On a skipped step the last block returns what the first block returned (its output plus
  the residual), in its own layout, whatever ran between: inline work of the model's forward (Latte's temporal
  position embedding, added after the first block) stays inside the residual, not added again.

Which side of the span a call is on is read as the model runs (it opens when the first block returns and closes when
the last one does), so the families declare only names and a layout function.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from diffusers.hooks.hooks import ModelHook

from dit_sp._compat import block_argument
from dit_sp.cache.blocks import block_metadata, register_hook, remove_hook, transformer_blocks
from dit_sp.errors import ConfigError

_SPAN_HOOK, _BETWEEN_HOOK, _LAYOUT_HOOK = "dit_sp_cache_span", "dit_sp_cache_between", "dit_sp_cache_layout"
Layout = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Policy = Callable[[], tuple[Callable[[], None], Callable[[], bool]]]


class _Span:
    """Whether the model's call in progress is between its first block's return and its last block's, and what the
    first block returned."""

    def __init__(self) -> None:
        self.open = False
        self.head: torch.Tensor | None = None


class _Model(ModelHook):
    """On the model: a call starts outside the span, and must have run its last block."""

    def __init__(self, span: _Span):
        super().__init__()
        self.span = span

    def pre_forward(self, module, *args, **kwargs):
        self.span.open, self.span.head = False, None
        return args, kwargs

    def post_forward(self, module, output):
        if self.span.open:
            self.span.open = False
            raise ConfigError(f"step caching: {type(module).__name__}'s last block did not run in this call (e.g. "
                              "Latte with enable_temporal_attentions=False), so no residual reaches it; run without "
                              "the cache")  # fmt: skip
        return output


class _Head(ModelHook):
    """On the first block (outside the policy's hook): opens the span, keeping what the block returned (``keep``:
    where a layout needs it)."""

    def __init__(self, span: _Span, keep: bool):
        super().__init__()
        self.span, self.keep = span, keep

    def post_forward(self, module, output):
        self.span.open, self.span.head = True, output if self.keep else None
        return output


class _ToHeadLayout(ModelHook):
    """On the last block, inside the policy's hook: its output in the first block's layout."""

    def __init__(self, span: _Span, layout: Layout):
        super().__init__()
        self.span, self.layout = span, layout

    def post_forward(self, module, output):
        return self.layout(output, self.span.head)


class _Tail(ModelHook):
    """On the last block (outside the policy's hook): closes the span; with a layout, the output in the block's own
    layout: on a skipped step, what the first block returned."""

    def __init__(self, span: _Span, layout: Layout | None, computing: Callable[[], bool]):
        super().__init__()
        self.span, self.layout, self.computing = span, layout, computing

    def initialize_hook(self, module):
        self.meta = block_metadata(module)
        return module

    def new_forward(self, module, *args, **kwargs):
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.layout is not None:
            hidden = block_argument(self.meta, "hidden_states", args, kwargs)
            output = self.layout(output if self.computing() else self.span.head, hidden)
        self.span.open = False
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


def apply(model: torch.nn.Module, names: Sequence[str], layout: Layout | None, policy: Policy) -> Callable[[], None]:
    """Install the step cache ``policy()`` (it returns its undo and whether the call in progress runs its blocks, read
    once the first block decided) with hooks that make the modules ``names`` declares add nothing between the first
    and the last block of a skipped step, and, with ``layout`` (``(x, like)``: ``x`` in ``like``'s layout), keep the
    residual in the first block's layout. Returns the undo of all of it."""
    modules = between_modules(model, names)
    if not modules and layout is None:
        return policy()[0]
    blocks, span = transformer_blocks(model), _Span()
    # undone last in, first out: diffusers' remove_hook leaves a hook wrapping the removed one (new_forward) calling it
    installed: list[Callable[[], None]] = []

    def undo() -> None:
        while installed:
            installed.pop()()

    def install(module: torch.nn.Module, hook: ModelHook, name: str) -> None:
        register_hook(module, hook, name)
        installed.append(lambda: remove_hook(module, name))

    try:
        if layout is not None:  # inside the policy's hook on the last block
            install(blocks[-1], _ToHeadLayout(span, layout), _LAYOUT_HOOK)
        undo_policy, computing = policy()
        installed.append(undo_policy)
        install(model, _Model(span), _SPAN_HOOK)
        install(blocks[0], _Head(span, layout is not None), _SPAN_HOOK)
        install(blocks[-1], _Tail(span, layout, computing), _SPAN_HOOK)
        for module in modules:
            install(module, _Between(span, computing), _BETWEEN_HOOK)
    except BaseException:
        undo()
        raise
    return undo
