"""Regional compile (``compile_blocks``) traces every registered family's blocks and computes what eager does: the
family table's "compile" column. The ``eager`` backend checks what Dynamo captures without Inductor's C++ build
(the Inductor path under USP is tested on tiny-wan in tests/cache): on one process, and under sequence parallelism
on Ulysses 2 and (``RING_FAMILIES``) on a ring of 2, where the graph breaks Dynamo counts must be the registry's
(``ModelFamily.compile_note``: none where it is empty)."""

from __future__ import annotations

import pytest
import torch
from compile_sp_checks import compiled_under_sp, flat, tiny_models

from dit_sp import spawn
from dit_sp.families import FAMILIES
from dit_sp.sp.compile import compile_blocks

pytestmark = pytest.mark.slow  # traces every family's blocks

MODELS = tiny_models()
LAYOUTS = {"ulysses2": {"ulysses": 2}, "ring2": {"ring": 2}}
RING_FAMILIES = ("wan", "hunyuan_video", "ltx2", "kandinsky6", "sana_video", "minimax_h3", "cosmos3", "helios",
                 *(f.name for f in FAMILIES if f.ring_refused))  # fmt: skip
"""The families also compiled on the ring: attention is one op Dynamo does not trace into (``dit_sp::usp_attention``),
so Ulysses or ring inside it is the same graph around it; these are the ones with ring-specific code outside it (a
frame halo, packed or joint streams, keys gathered for another stream, eager-wrapped attention, history latents), the
gradient check's, and those that refuse a ring (refused as eagerly)."""
GRADS_OF = ("hunyuan_video",)
"""Families whose input gradients through compiled blocks are checked too (joint text in front, padded per sample):
the attention op has no backward, so Dynamo runs it eagerly there (``grad_breaks``), and the gradients are exact."""


def test_every_splittable_family_has_a_tiny_transformer_to_compile():
    splittable = {f.name for f in FAMILIES if not f.refused.keys() >= set(f.class_names)}
    assert splittable <= set(MODELS), f"no tiny transformer to check compile on: {sorted(splittable - set(MODELS))}"


@pytest.mark.parametrize("family", sorted(MODELS))
def test_compiled_blocks_compute_what_eager_does(family):
    make, make_inputs = MODELS[family]
    model, kwargs = make(), make_inputs()
    with torch.no_grad():
        reference = flat(model(**kwargs, return_dict=False))
        undo = compile_blocks(model, backend="eager")
        compiled = flat(model(**kwargs, return_dict=False))
        undo()
    assert torch.equal(compiled, reference) or (compiled - reference).abs().max() <= 1e-6


@pytest.fixture(scope="module")
def under_sp() -> list[dict]:
    """Both ranks' records (``compiled_under_sp``): one spawn for every family and both layouts."""
    return spawn(
        compiled_under_sp, 2, args=(sorted(MODELS), LAYOUTS, GRADS_OF, "eager", {"ring2": RING_FAMILIES}), timeout=600
    )


def test_compiled_blocks_under_sp_compute_what_the_same_layout_does_eagerly(under_sp):
    ring_refused = {f.name for f in FAMILIES if f.ring_refused}
    checked = 0
    for rank, records in enumerate(under_sp):
        for family, layouts in records.items():
            for layout, record in layouts.items():
                where = f"{family} on {layout} (rank {rank})"
                if "refused" in record:  # only Ulysses splits it: refused as eagerly (tests/families)
                    assert layout == "ring2" and family in ring_refused, f"{where}: {record['refused']}"
                    continue
                assert "error" not in record, f"{where}: {record.get('error')}"
                assert record["out"] <= 1e-5, where
                if family in GRADS_OF:
                    assert record["grad"] <= 1e-5, where
                checked += 1
    assert checked == 2 * (len(MODELS) + len(RING_FAMILIES) - len(ring_refused))


def test_graph_breaks_under_sp_are_the_ones_the_registry_names(under_sp):
    """A family without a ``compile_note`` compiles its blocks under SP without a graph break on either layout; one
    with a note breaks on at least one (a note that no longer holds fails too)."""
    notes = {f.name: f.compile_note for f in FAMILIES}
    for family in MODELS:
        breaks = {layout: record["graph_breaks"] for layout, record in under_sp[0][family].items()
                  if "graph_breaks" in record}  # fmt: skip
        if notes[family]:
            assert any(breaks.values()), f"{family}'s compile_note ({notes[family]!r}) names breaks, none measured"
        else:
            assert not any(breaks.values()), f"{family}: graph breaks under SP, fix them or name them: {breaks}"
