"""A stand-in for a diffusers attention module, for running its stock processor's per-head part on one Ulysses head
group's whole sequence (inside ``dit_sp.attention.attend_whole_sequence``): AnyFlow FAR's, Wan-Animate-2's and
Sana-WM's refiner's processors, whose KV caches, rotary tables and flex block masks are applied per head, as the stock
code applies them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp.families.family import Undo

if TYPE_CHECKING:
    import torch


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class HeadGroupAttention:
    """What a stock processor reads of its attention module, for q, k, v ``(B, S, h, D)`` already projected and
    normalised (on the token shards, before the all-to-all): ``to_q``/``to_k``/``to_v`` hand them back flattened
    ``(B, S, h * D)`` whatever they are given, the norms and the output projection are the identity, ``heads`` is
    ``h``."""

    fused_projections = False
    is_cross_attention = False
    norm_q = norm_k = staticmethod(_identity)
    to_out = (_identity, _identity)

    def __init__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        self.heads = query.shape[2]
        self.to_q, self.to_k, self.to_v = (lambda _, x=x: x.flatten(2) for x in (query, key, value))


def replace_stock_processors(model: str, attentions: dict[str, Any], stock: type, make: Callable[[Any], Any]) -> Undo:
    """Each attention module's processor (``attentions``: by module path) replaced by ``make(its processor)``, once
    every one is checked to be diffusers' ``stock`` class exactly: dit-sp's processor restates the stock one's per-head
    part, so another (a user's, a subclass, an upstream change) would be silently replaced; it is refused in one line
    naming ``model`` and the module, and nothing is installed. Returns the handle that puts the stock ones back."""
    for path, attention in attentions.items():
        found = type(attention.processor)
        if found is not stock:
            raise NotImplementedError(
                f"{model}: {path} runs {found.__module__}.{found.__qualname__}, not diffusers' {stock.__name__}, the "
                f"processor whose per-head part dit-sp splits (and would replace): set the stock one back with "
                f"set_processor({stock.__name__}()), or run this model on one process"
            )
    stocks = {path: attention.processor for path, attention in attentions.items()}
    for path, attention in attentions.items():
        attention.processor = make(stocks[path])
    return Undo(lambda: [setattr(attentions[path], "processor", processor) for path, processor in stocks.items()])
