"""Video transformers dit-sp knows but does not split, each with the reason in one line: ``parallelize`` refuses
them by name and reason instead of calling them unsupported, or worse, splitting them wrongly.

- Wan-Animate-2: it attends through a flex-attention block mask over a packed, 128-aligned buffer, with a key/value
  cache of reference frames carried from call to call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dit_sp.families.family import ModelFamily

if TYPE_CHECKING:
    import torch


def _refuse(why: str) -> Callable[[torch.nn.Module], None]:
    def check(model: torch.nn.Module) -> None:
        raise NotImplementedError(f"{type(model).__name__} cannot run sequence-parallel exactly: {why}")

    return check


def _refused(name: str, class_name: str, why: str) -> ModelFamily:
    return ModelFamily(name=name, class_names=(class_name,), plan=lambda model: {}, attention_modules=(),
                       check=_refuse(why), cfg_refused=why, refused={class_name: why},
                       step_cache=False)  # fmt: skip


REFUSED = (
    _refused("wan_animate_2", "WanAnimate2Transformer3DModel",
             "it attends through a flex-attention block mask over a packed 128-aligned buffer with a key/value cache "
             "carried between calls; run it on one process per sample (dp)"),
)  # fmt: skip
"""The refused families, registered in ``FAMILIES`` so that they are named with their reason."""
