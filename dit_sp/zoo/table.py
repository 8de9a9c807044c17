"""The README's family table, generated from the registry so that it cannot drift from what the code supports.

``python -m dit_sp.zoo.table`` prints it; ``tests/zoo/test_family_table.py`` checks that the README holds exactly
this text between its ``<!-- families:start -->`` and ``<!-- families:end -->`` markers. A pipeline with a
built-in tiny model (``dit_sp/zoo/specs``) is run on every layout by the tests and shown plainly; the other
diffusers pipelines of a supported transformer are read from diffusers itself and shown in italics: they take
the same parallelized transformer, but no test runs them whole yet.
"""

from __future__ import annotations

import inspect
import json
from functools import cache

from dit_sp.families import FAMILIES
from dit_sp.families.family import TRANSFORMERS, ModelFamily
from dit_sp.io.bundled import asset_path
from dit_sp.zoo import model_spec

START, END = "<!-- families:start -->", "<!-- families:end -->"
COLUMNS = ("family", "transformer", "diffusers pipelines", "SP", "CFG parallel", "parallel VAE", "step cache",
           "compile", "GRPO")  # fmt: skip


@cache
def diffusers_pipelines() -> dict[str, tuple[str, ...]]:
    """Every diffusers pipeline class by the transformer class its ``__init__`` takes (as annotated), sorted.

    Derived from the installed diffusers, so a pipeline that a new release adds for a supported transformer
    shows up in the table without anyone listing it."""
    import diffusers

    found: dict[str, set[str]] = {}
    for name in dir(diffusers):
        if not name.endswith("Pipeline") or name.startswith("Modular"):
            continue
        try:
            parameters = inspect.signature(getattr(diffusers, name).__init__).parameters
        except (ImportError, AttributeError, TypeError, ValueError):  # an optional backend is missing
            continue
        for component in TRANSFORMERS:
            if component in parameters:
                annotation = parameters[component].annotation
                for cls in getattr(annotation, "__args__", (annotation,)):  # ``X | None`` as well as ``X``
                    found.setdefault(getattr(cls, "__name__", str(cls)), set()).add(name)
    return {transformer: tuple(sorted(names)) for transformer, names in found.items()}


def _pipeline_class(model: str) -> str:
    """The diffusers pipeline class of a built-in model (a shipped one's from its ``model_index.json``)."""
    spec = model_spec(model)
    if "pipeline" in spec:
        return spec["pipeline"]
    return json.loads((asset_path(spec["path"]) / "model_index.json").read_text())["_class_name"]


def _pipelines(family: ModelFamily) -> str:
    """The family's pipelines: those with a built-in model plainly, the others of its transformer in italics."""
    tested = {_pipeline_class(name) for name in family.tiny_models}
    by_transformer = diffusers_pipelines()
    names = {p for cls in family.class_names for p in by_transformer.get(cls, ())} | tested
    names |= set(family.modular_pipelines)
    shown = [
        f"`{name}`" if name in tested else f"*{name}*" for name in sorted(names, key=lambda n: (n not in tested, n))
    ]
    return ", ".join(shown) or "(none in this diffusers)"


def _row(family: ModelFamily) -> list[str]:
    cache = ["first-block"] + (["TeaCache"] if family.teacache_probe is not None else [])
    vae = ", ".join(f"`{name}`" for name in family.vae.class_names) if family.vae is not None else "leader decode"
    grpo = ", ".join(f"`{name}`" for name in family.pipelines) if family.policy is not None else "no"
    return [
        family.name,
        ", ".join(f"`{name}`" for name in family.class_names),
        _pipelines(family),
        "ulysses x ring",
        f"yes ({family.cfg_mode})" if family.cfg_parallel else "no",
        vae,
        ", ".join(cache) if family.step_cache else "refused",
        "regional" if family.step_cache else "refused",  # compile wraps the same blocks the cache finds
        grpo,
    ]


def family_table() -> str:
    """The Markdown table of every registered family (one row each, in registry order), between the markers."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(family)) + " |" for family in FAMILIES]
    return "\n".join([START, *lines, END])


if __name__ == "__main__":
    print(family_table())
