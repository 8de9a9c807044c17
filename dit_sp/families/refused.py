"""Video transformers dit-sp knows but does not split, each with the reason in one line: ``parallelize`` refuses
them by name and reason instead of calling them unsupported, or worse, splitting them wrongly.

- Sana-WM: its ``SanaWMBidirectionalGDNAttention`` (and the camera branch's ``SanaWMBidirectionalGDNCamAttention``)
  is a gated-delta-rule linear attention: a per-head state scan over all frames, forwards and then backwards, each
  frame's output depending on the recurrent state carried through every other frame. It is no torch SDPA call, so
  USP's processors cannot route it; splitting it would pass the scan's state from rank to rank, which dit-sp does not.
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
    _refused("sana_wm", "SanaWMTransformer3DModel",
             "its SanaWMBidirectionalGDNAttention is a bidirectional gated-delta-rule recurrence (a per-head state "
             "scan over all frames), not torch SDPA, which dit-sp routes; run it on one process per sample (dp)"),
)  # fmt: skip
"""The refused families, registered in ``FAMILIES`` so that they are named with their reason."""
