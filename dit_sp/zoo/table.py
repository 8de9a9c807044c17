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

from dit_sp.families import FAMILIES, supported_vaes
from dit_sp.families.family import PARALLELIZED_TRANSFORMERS, TRANSFORMERS, ModelFamily
from dit_sp.io.bundled import asset_path
from dit_sp.vae.leader import AUDIO_DECODE_REASONS, LEADER_DECODE_REASONS, WHOLE_DECODE_REASONS
from dit_sp.zoo import model_spec

START, END = "<!-- families:start -->", "<!-- families:end -->"
COLUMNS = ("family", "transformer", "diffusers pipelines", "SP", "CFG parallel", "parallel VAE", "step cache",
           "compile", "GRPO")  # fmt: skip
AUDIO_COMPONENTS = ("audio_vae", "vocoder")
"""The pipeline components that decode a generated audio stream (LTX-2's, Kandinsky 6's, MiniMax-H3's)."""


@cache
def _components() -> dict[str, dict[str, tuple[str, ...]]]:
    """Every diffusers pipeline class with the classes its ``__init__`` annotates for its transformers, VAE and audio
    decoders."""
    import diffusers

    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for name in dir(diffusers):
        if not name.endswith("Pipeline") or name.startswith("Modular"):
            continue
        try:
            parameters = inspect.signature(getattr(diffusers, name).__init__).parameters
        except (ImportError, AttributeError, TypeError, ValueError):  # an optional backend is missing
            continue
        for component in (*TRANSFORMERS, "vae", *AUDIO_COMPONENTS):
            if component in parameters:
                annotation = parameters[component].annotation
                classes = getattr(annotation, "__args__", (annotation,))  # ``X | None`` as well as ``X``
                found.setdefault(name, {})[component] = tuple(getattr(c, "__name__", str(c)) for c in classes)
    return found


def diffusers_pipelines() -> dict[str, tuple[str, ...]]:
    """Every diffusers pipeline class by the transformer class its ``__init__`` takes (as annotated), sorted.

    Derived from the installed diffusers, so a pipeline that a new release adds for a supported transformer
    shows up in the table without anyone listing it."""
    by_transformer: dict[str, set[str]] = {}
    for pipeline, components in _components().items():
        for component in TRANSFORMERS:
            for cls in components.get(component, ()):
                by_transformer.setdefault(cls, set()).add(pipeline)
    return {transformer: tuple(sorted(names)) for transformer, names in by_transformer.items()}


@cache
def diffusers_modular_pipelines() -> dict[str, tuple[str, ...]]:
    """Every Modular Diffusers pipeline class of the installed diffusers (a ``*ModularPipeline`` with default blocks)
    by the transformer class its default blocks expect (``transformer``, ``transformer_2``, ``transformer_ref``),
    sorted: read from diffusers, so a modular pipeline that a new release adds for a supported transformer is found
    without anyone listing it (``tests/zoo/test_family_table.py`` requires each to be registered or accounted for)."""
    import diffusers

    by_transformer: dict[str, set[str]] = {}
    for name in dir(diffusers):
        if not name.endswith("ModularPipeline") or name == "ModularPipeline":
            continue
        try:
            blocks = getattr(diffusers, getattr(diffusers, name).default_blocks_name)()
        except (ImportError, AttributeError, TypeError, ValueError):  # an optional backend is missing
            continue
        for spec in blocks.expected_components:
            if spec.name in PARALLELIZED_TRANSFORMERS:
                by_transformer.setdefault(getattr(spec.type_hint, "__name__", str(spec.type_hint)), set()).add(name)
    return {transformer: tuple(sorted(names)) for transformer, names in by_transformer.items()}


def family_of_pipeline(name: str) -> ModelFamily | None:
    """The family of the diffusers pipeline class ``name``: the one whose transformer its ``__init__`` takes (as
    annotated) or whose Modular Diffusers pipelines include it; None for a pipeline of no registered family."""
    classes = {cls for cls, pipelines in diffusers_pipelines().items() if name in pipelines}
    return next((f for f in FAMILIES if classes & set(f.class_names) or name in f.modular_pipelines), None)


def family_vaes(family: ModelFamily) -> list[str]:
    """The VAE classes of the family's diffusers pipelines (as their ``__init__`` annotates them, or a modular
    pipeline's blocks expect them), sorted."""
    return _family_components(family, ("vae",))


def family_audio_decoders(family: ModelFamily) -> list[str]:
    """The audio decoder classes (``AUDIO_COMPONENTS``: audio VAE, vocoder) of the family's diffusers pipelines (as
    their ``__init__`` annotates them, or a modular pipeline's blocks expect them), sorted."""
    return _family_components(family, AUDIO_COMPONENTS)


def _family_components(family: ModelFamily, names: tuple[str, ...]) -> list[str]:
    pipelines = {p for cls in family.class_names for p in diffusers_pipelines().get(cls, ())}
    found = {c for p in pipelines for name in names for c in _components()[p].get(name, ()) if c != "NoneType"}
    return sorted(found | {c for p in family.modular_pipelines for c in _modular_components(p, names)})


@cache
def _modular_components(pipeline: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The classes of the components ``names`` that a Modular Diffusers pipeline's default blocks expect (MiniMax-H3's
    ``vae`` and ``audio_vae``)."""
    import diffusers

    blocks = getattr(diffusers, getattr(diffusers, pipeline).default_blocks_name)()
    return tuple(spec.type_hint.__name__ for spec in blocks.expected_components if spec.name in names)


TILES_SHARED = "tiles shared (a video decoded in one call: one process)"
"""A VAE whose plan splits no part by rows: its whole decoder calls (tiles; MiniMax-H3's clips too) go to the
processes of a sample, so a video that is one call (one tile, and one clip) decodes on one process."""


def _vaes(family: ModelFamily) -> str:
    """The VAEs of the family's pipelines: split over a sample's processes where a family has a plan for the
    class (``dit_sp.families.vae_plan_of``), else decoded by one process of the sample; ``TILES_SHARED`` for a
    VAE whose plan splits no part by rows; then its audio decoders, whole on every rank (``AUDIO_DECODE_REASONS``)."""
    plans = {name: f.vae for f in FAMILIES if f.vae is not None for name in f.vae.class_names}
    kind = {name: "split" if plan.parts else TILES_SHARED for name, plan in plans.items()}
    shown = [f"`{v}` {kind[v]}" if v in kind else f"`{v}` leader decode" for v in family_vaes(family)]
    shown += [f"`{d}` whole on every rank" for d in _family_components(family, DECODER_COMPONENTS)]
    audio = family_audio_decoders(family)
    if audio:
        shown.append(f"audio: {', '.join(f'`{a}`' for a in audio)} whole on every rank")
    return ", ".join(shown) or "none"


DECODER_COMPONENTS = ("diffusion_decoder",)
"""Video decoders of modular blocks that are not a ``vae`` (LTX-2.5's diffusion decoder): whole on every rank."""


def _whole_reasons() -> list[str]:
    """Under the table: why each video decoder of ``DECODER_COMPONENTS`` runs whole (``dit_sp.vae.leader``)."""
    shown = sorted({d for f in FAMILIES for d in _family_components(f, DECODER_COMPONENTS)})
    lines = ["", "Video decoders run whole on every rank of a sample, and why:", ""] if shown else []
    missing = "(no reason recorded: add one to dit_sp/vae/leader.py)"
    return lines + [f"- `{d}`: {WHOLE_DECODE_REASONS.get(d, missing)}." for d in shown]


def audio_decoders() -> list[str]:
    """The audio decoder classes the table shows (of a family that runs split), sorted."""
    runs = [f for f in FAMILIES if not f.refused.keys() >= set(f.class_names)]
    return sorted({a for family in runs for a in family_audio_decoders(family)})


def _audio_reasons() -> list[str]:
    """Under the table: why each audio decoder runs whole on every rank (``dit_sp.vae.leader``)."""
    shown = audio_decoders()
    lines = ["", "Audio decoders, whole on every rank of a sample, and why:", ""] if shown else []
    missing = "(no reason recorded: add one to dit_sp/vae/leader.py)"
    return lines + [f"- `{a}`: {AUDIO_DECODE_REASONS.get(a, missing)}." for a in shown]


def leader_decode_vaes() -> list[str]:
    """The VAE classes the table shows as "leader decode" (of a family that runs split), sorted."""
    split = set(supported_vaes())
    runs = [f for f in FAMILIES if not f.refused.keys() >= set(f.class_names)]
    return sorted({v for family in runs for v in family_vaes(family) if v not in split})


def _leader_reasons() -> list[str]:
    """Under the table: why each leader-decode VAE is not split (``dit_sp.vae.leader``); nothing where none is."""
    shown = leader_decode_vaes()
    lines = ["", "Leader decode, and why each of these VAEs is not split yet:", ""] if shown else []
    missing = "(no reason recorded: add one to dit_sp/vae/leader.py)"
    return lines + [f"- `{v}`: {LEADER_DECODE_REASONS.get(v, missing)}." for v in shown]


def _refused_reasons() -> list[str]:
    """Under the table: the pipelines refused (``ModelFamily.refused_pipelines``), and why."""
    refused = [(family.name, name, why) for family in FAMILIES for name, why in family.refused_pipelines.items()]
    lines = ["", "Pipelines refused, and why:", ""] if refused else []
    return lines + [f"- `{name}` ({family}): {why}." for family, name, why in refused]


def _pipeline_class(model: str) -> str | None:
    """The diffusers pipeline class of a built-in model (a shipped one's from its ``model_index.json``), or None
    for a built-in transformer without a pipeline."""
    spec = model_spec(model)
    if "path" in spec:
        return json.loads((asset_path(spec["path"]) / "model_index.json").read_text())["_class_name"]
    return spec.get("pipeline")


def family_pipelines(family: ModelFamily) -> list[str]:
    """Every pipeline class of the family, sorted: the diffusers pipelines of its transformers (as their ``__init__``
    annotates them), its built-in models', its Modular Diffusers pipelines and those it refuses (LTX-2.5's diffusion
    decode stage, which has no transformer) (what the table's column lists)."""
    tested = {_pipeline_class(name) for name in family.tiny_models} - {None}
    by_transformer = diffusers_pipelines()
    names = {p for cls in family.class_names for p in by_transformer.get(cls, ())} | tested
    return sorted(names | set(family.modular_pipelines) | set(family.refused_pipelines))


def _pipelines(family: ModelFamily) -> str:
    """The family's pipelines: those with a built-in model plainly, the others of its transformer in italics."""
    tested = {_pipeline_class(name) for name in family.tiny_models} - {None}
    names = family_pipelines(family)
    shown = [
        f"`{name}`" if name in tested else f"*{name}*" + (" (refused)" if name in family.refused_pipelines else "")
        for name in sorted(names, key=lambda n: (n not in tested, n))
    ]
    return ", ".join(shown) or "(none in this diffusers)"


def _sp(family: ModelFamily) -> str:
    supported = [name for name in family.class_names if name not in family.refused]
    refused = ", ".join(f"`{name}` refused" for name in family.refused)
    split = "ulysses (ring refused)" if family.ring_refused else "ulysses x ring"
    return ", ".join(filter(None, [split if supported else "", refused]))


def _row(family: ModelFamily) -> list[str]:
    if family.refused.keys() >= set(family.class_names):  # nothing of it runs split: every other column is moot
        return [family.name, _names(family.class_names), _pipelines(family), _sp(family), *["-"] * 5]
    cache = ["first-block"] + (["TeaCache"] if family.teacache_probe is not None else [])
    return [
        family.name,
        _names(family.class_names),
        _pipelines(family),
        _sp(family),
        "refused" if family.cfg_refused else f"yes ({family.cfg_mode})",
        _vaes(family),
        ", ".join(cache) if family.step_cache else "refused",
        _compile(family),
        _names(family.pipelines) if family.policy is not None else "no",
    ]


def _compile(family: ModelFamily) -> str:
    """Regional compile, with the graph breaks its blocks have under SP where it has any (measured by
    tests/families/test_compile_families.py, which checks ``compile_note`` both ways)."""
    return f"regional (graph breaks under SP: {family.compile_note})" if family.compile_note else "regional"


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def family_table() -> str:
    """The Markdown table of every registered family (one row each, in registry order), between the markers."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(family)) + " |" for family in FAMILIES]
    return "\n".join(
        [START, *lines, *_leader_reasons(), *_whole_reasons(), *_audio_reasons(), *_refused_reasons(), END]
    )


if __name__ == "__main__":
    print(family_table())
