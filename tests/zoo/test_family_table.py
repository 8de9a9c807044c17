"""The README's family table is generated from the registry, and what the registry claims of each family holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dit_sp.cache import enable_cache
from dit_sp.cache.blocks import transformer_blocks
from dit_sp.errors import ConfigError
from dit_sp.families import FAMILIES
from dit_sp.zoo import build_tiny
from dit_sp.zoo.table import (
    END,
    START,
    diffusers_modular_pipelines,
    diffusers_pipelines,
    family_pipelines,
    family_table,
)

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_readme_holds_the_generated_table():
    shown = README[README.index(START) : README.index(END) + len(END)]
    assert shown == family_table(), f"the README's family table is stale; replace it with:\n{family_table()}"


def test_every_family_has_a_row_naming_its_transformers_and_trained_pipelines():
    rows = [line for line in family_table().splitlines()[3:] if line.startswith("| ")]  # not the notes
    assert len(rows) == len(FAMILIES)
    for family, row in zip(FAMILIES, rows, strict=True):
        assert row.startswith(f"| {family.name} |")
        assert all(f"`{name}`" in row for name in family.class_names)
        if family.policy is not None:  # GRPO's pipelines are real diffusers pipelines of the family's transformer
            pipelines = {p for cls in family.class_names for p in diffusers_pipelines().get(cls, ())}
            assert set(family.pipelines) <= pipelines, f"{family.name}: {set(family.pipelines) - pipelines}"


def test_pipelines_are_read_from_diffusers_annotations():
    pipelines = diffusers_pipelines()
    assert "WanPipeline" in pipelines["WanTransformer3DModel"]  # annotated ``WanTransformer3DModel | None``
    assert "CogVideoXPipeline" in pipelines["CogVideoXTransformer3DModel"]
    assert not any(name.startswith("Modular") for names in pipelines.values() for name in names)


MODULAR_FORMS = {
    "WanModularPipeline": "WanPipeline",
    "WanImage2VideoModularPipeline": "WanImageToVideoPipeline",
    "Wan22ModularPipeline": "WanPipeline",
    "Wan22Image2VideoModularPipeline": "WanImageToVideoPipeline",
    "Wan22VaceModularPipeline": "WanVACEPipeline",
    "LTXModularPipeline": "LTXPipeline",
    "LTX2ModularPipeline": "LTX2Pipeline",
    "HunyuanVideo15ModularPipeline": "HunyuanVideo15Pipeline",
    "HeliosModularPipeline": "HeliosPipeline",
    "HeliosPyramidModularPipeline": "HeliosPyramidPipeline",
    "Cosmos3OmniModularPipeline": "Cosmos3OmniPipeline",
}
"""Modular Diffusers pipelines that are another form of a classic pipeline of the same checkpoints (the same
components and sampler; ``generate`` runs those checkpoints as the classic class, from a ``model_index.json``)."""

MODULAR_NOT_YET = {
    "AnimaModularPipeline": "a text-to-image pipeline on Cosmos-Predict2's transformer with its own Qwen3 text "
    "conditioner (AnimaTextConditioner): no tiny model of it yet",
}
"""Modular-only pipelines of supported transformers that ``generate`` does not run yet, each with why."""


def test_every_modular_pipeline_of_a_supported_transformer_is_registered_or_accounted_for():
    """diffusers' Modular Diffusers pipelines, enumerated from diffusers itself (``diffusers_modular_pipelines``): each
    whose blocks expect a registered family's transformer is one of that family's ``modular_pipelines`` (``generate``
    runs its repositories, the table lists it), the modular form of a classic pipeline of that family
    (``MODULAR_FORMS``), or listed with why it is not run yet; a modular pipeline a new diffusers adds fails here."""
    found, unaccounted = {}, []
    for transformer, names in diffusers_modular_pipelines().items():
        family = next((f for f in FAMILIES if transformer in f.class_names), None)
        for name in names if family is not None else ():
            found[name] = family
            if name not in family.modular_pipelines and name not in MODULAR_FORMS and name not in MODULAR_NOT_YET:
                unaccounted.append(f"{name} ({family.name})")
    assert not unaccounted, f"modular pipelines of supported transformers neither registered nor accounted for: " \
                            f"{unaccounted}"  # fmt: skip
    registered = {name for f in FAMILIES for name in f.modular_pipelines}
    assert registered <= found.keys(), registered - found.keys()  # no stale entries
    assert {
        "EchoModularPipeline",
        "Cosmos3DistilledModularPipeline",
        "LTX25ModularPipeline",
        "HeliosPyramidDistilledModularPipeline",
    } <= registered
    for name, classic in MODULAR_FORMS.items():  # the classic form is a pipeline of the same family
        assert name not in registered and classic in family_pipelines(found[name]), (name, classic)
    assert not (registered | MODULAR_FORMS.keys()) & MODULAR_NOT_YET.keys()
    assert MODULAR_NOT_YET.keys() <= found.keys()  # none stale


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.tiny_models], ids=lambda f: f.name)
def test_the_step_cache_claim_holds_on_the_tiny_model(family):
    """The table's "step cache" column: a family that takes one has blocks the caches find; one that does not is
    refused in one line naming it, before any hook is installed."""
    model = build_tiny(next(m for m in family.tiny_models if not m.startswith("toy")), "transformer")
    if family.step_cache:  # enabling it registers the blocks diffusers has no metadata for (block_outputs)
        handle = enable_cache(model, "first_block:0.1")
        assert len(transformer_blocks(model)) >= 2
        handle.undo()
        assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in model.modules())
    else:
        reason = re.escape(family.step_cache_refused)
        with pytest.raises(ConfigError, match=rf"^step caching is refused for \w+ \({family.name} family\): {reason}; "
                                              "run without --cache$"):  # fmt: skip
            enable_cache(model, "first_block:0.1")
        assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())


def test_an_unregistered_transformer_is_told_what_is_supported_and_how_to_add_it():
    import torch

    from dit_sp.families import family_of

    with pytest.raises(TypeError, match=r"supported transformers: .*WanTransformer3DModel.*section 8: Model families"):
        family_of(torch.nn.Linear(2, 2))


def test_every_code_pipeline_has_its_tiny_models_run_whole_on_a_layout():
    """The table's `code` claim: every built-in tiny model of a pipeline shown in `code` has a layout run against one
    process in ``layout_runs.LAYOUT_RUNS`` (or ``SAME_PIPELINE_AS`` a model with one), naming a test function that
    exists in a test module that names the model (there or in a tests/support module it imports) and a layout. Read
    from the files only: nothing runs."""
    import ast

    from layout_runs import LAYOUT_RUNS, SAME_PIPELINE_AS

    from dit_sp.zoo.table import _pipeline_class

    root = Path(__file__).resolve().parents[2]
    pipelines = {model: _pipeline_class(model) for family in FAMILIES for model in family.tiny_models}
    shown = {model for model, pipeline in pipelines.items() if pipeline is not None}
    listed = set(LAYOUT_RUNS) | set(SAME_PIPELINE_AS)
    assert not shown - listed, f"tiny models of `code` pipelines without a layout run: {sorted(shown - listed)}"
    assert not listed - shown, f"layout runs of models that are not built-in ones: {sorted(listed - shown)}"
    for model, other in SAME_PIPELINE_AS.items():
        assert other in LAYOUT_RUNS and pipelines[model] == pipelines[other], (model, other)
    for model, (path, function) in LAYOUT_RUNS.items():
        where, source = f"tests/{path}::{function}", (root / "tests" / path).read_text()
        tree = ast.parse(source)
        tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert function.startswith("test_") and function in tests, f"{model}: {where} names no test function"
        modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        modules |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        support = [root / "tests" / "support" / f"{name}.py" for name in modules]
        text = "\n".join([source, *(p.read_text() for p in support if p.exists())])
        assert f'"{model}"' in text, f"{model}: {path} (and the tests/support modules it imports) never names it"
        assert re.search(r"\"ulysses\"|\"ring\"|\"cfg_parallel\"|ulysses=|--ulysses", text), f"{model}: no layout"
