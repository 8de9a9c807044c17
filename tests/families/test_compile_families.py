"""Regional compile (``compile_blocks``) traces every registered family's blocks and computes what eager does: the
family table's "compile" column. The ``eager`` backend checks what Dynamo captures without Inductor's C++ build
(the Inductor path under USP is tested on the original families in tests/cache)."""

from __future__ import annotations

import pytest
import torch
from kandinsky_cosmos_checks import TINY, build, inputs
from model_checks import model_inputs

from dit_sp.families import FAMILIES
from dit_sp.sp.compile import compile_blocks
from dit_sp.zoo import build_tiny

pytestmark = pytest.mark.slow  # traces every family's blocks


def _models() -> dict[str, tuple]:
    """family -> (build, inputs) of a tiny transformer: a built-in model, or one of the test-built ones."""
    found = {}
    for family in FAMILIES:
        for name in family.tiny_models:
            try:
                model_inputs(name)
            except (ValueError, KeyError):
                continue
            found.setdefault(
                family.name, (lambda n=name: build_tiny(n, "transformer").float(), lambda n=name: model_inputs(n))
            )
        test_built = [name for name in TINY if name.split("-")[0] == family.name]
        if test_built:
            found.setdefault(family.name, (lambda n=test_built[0]: build(n), lambda n=test_built[0]: inputs(n)))
    return found


MODELS = _models()


def test_every_splittable_family_has_a_tiny_transformer_to_compile():
    splittable = {f.name for f in FAMILIES if not f.refused.keys() >= set(f.class_names)}
    assert splittable <= set(MODELS), f"no tiny transformer to check compile on: {sorted(splittable - set(MODELS))}"


def _tensor(output):
    """A model's first output as one tensor (Cosmos 3 returns a list of per-item videos)."""
    return torch.cat([x.flatten() for x in output]) if isinstance(output, list) else output


@pytest.mark.parametrize("family", sorted(MODELS))
def test_compiled_blocks_compute_what_eager_does(family):
    make, make_inputs = MODELS[family]
    model, kwargs = make(), make_inputs()
    with torch.no_grad():
        reference = _tensor(model(**kwargs, return_dict=False)[0])
        undo = compile_blocks(model, backend="eager")
        compiled = _tensor(model(**kwargs, return_dict=False)[0])
        undo()
    assert torch.equal(compiled, reference) or (compiled - reference).abs().max() <= 1e-6
