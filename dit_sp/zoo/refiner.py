"""Stage-2 refiners (``generate --refine``): a second pipeline run on the first's latents (Sana-WM's
``SanaWMLTX2Refiner``, ``ModelFamily.refiners``), found beside the model: a checkpoint directory's ``refiner/`` (the
refiner's ``save_pretrained`` directory), or a built-in model's ``refiner:`` table in its spec. It decodes through the
first pipeline's VAE (passed in: one VAE for both stages)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.families import FAMILIES
from dit_sp.zoo import _component, check_checkpoint, checkpoint_dir, model_spec, pipeline_class_name

if TYPE_CHECKING:
    import torch

REFINER_DIR = "refiner"
"""A checkpoint directory's subfolder holding its refiner's pipeline directory."""


def check_refiner(model: str | Path) -> str:
    """Before anything loads: ``model``'s pipeline has a stage-2 refiner (its family's ``refiners``) and the refiner
    is there (a built-in's spec table, or ``DIR/refiner/``: its ``model_index.json`` naming that class, its
    components' files sound: ``check_checkpoint``); one line otherwise. Returns the refiner's class name."""
    name = pipeline_class_name(model)
    refiner = next((f.refiners[name] for f in FAMILIES if name in f.refiners), None)
    if refiner is None:
        refined = ", ".join(sorted(p for f in FAMILIES for p in f.refiners))
        raise ConfigError(f"--refine: {model} ({name}) has no stage-2 refiner that generate runs (it refines "
                          f"{refined}); drop --refine")  # fmt: skip
    path = checkpoint_dir(model)
    if path is None:
        if "refiner" not in model_spec(str(model)):
            raise ConfigError(f"--refine: the built-in {model} has no refiner; drop --refine")
        return refiner
    directory = path / REFINER_DIR
    if not (directory / "model_index.json").is_file():
        raise MissingFileError(f"--refine: {path} has no {REFINER_DIR}/model_index.json: save its {refiner} there "
                               f"(refiner.save_pretrained(DIR/{REFINER_DIR})), or drop --refine")  # fmt: skip
    found = check_checkpoint(directory).get("_class_name")
    if found != refiner:
        raise ConfigError(f"--refine: {directory / 'model_index.json'} names {found!r}, not the {refiner} that "
                          f"refines {name}")  # fmt: skip
    return refiner


def check_refiner_layout(model: str | Path, ulysses: int, why: str) -> None:
    """Before anything loads: the Ulysses degree ``ulysses`` the refiner of ``model`` (checked by ``check_refiner``)
    runs on splits its transformer (its family's ``layout_check``, on the transformer built on the meta device from
    its config: the spec's, or ``DIR/refiner/transformer/config.json``); one line naming ``why`` it runs on that
    degree otherwise."""
    import types

    import diffusers
    import torch

    from dit_sp.families import family_of
    from dit_sp.zoo.files import json_object

    if ulysses == 1:
        return
    path = checkpoint_dir(model)
    if path is None:
        part = model_spec(str(model))["refiner"]["components"]["transformer"]
        name, config = part["class"], part.get("config", {})
    else:
        config = json_object(path / REFINER_DIR / "transformer" / "config.json", "the refiner transformer's config")
        name = config.get("_class_name")
    with torch.device("meta"):  # no weights: the layout check reads the modules' shapes
        transformer = getattr(diffusers, name).from_config(config)
    try:
        family_of(transformer).layout_check(transformer, types.SimpleNamespace(ring=1, ulysses=ulysses))
    except (NotImplementedError, ValueError) as e:
        raise ConfigError(f"--refine: its refiner runs on Ulysses {ulysses} ({why}): {e}") from None


def load_refiner(model: str | Path, vae: Any, dtype: torch.dtype, device: torch.device | str | None = None) -> Any:
    """The stage-2 refiner of ``model`` (checked by ``check_refiner``) in ``dtype`` on ``device``, decoding through
    ``vae`` (the first stage's): a built-in's built from its spec's ``refiner:`` table (each component seeded as
    ``build_tiny`` seeds them), a checkpoint's read offline from ``DIR/refiner/``."""
    import diffusers
    import torch

    refiner = check_refiner(model)
    path = checkpoint_dir(model)
    if path is not None:
        pipe = getattr(diffusers, refiner).from_pretrained(path / REFINER_DIR, vae=vae, dtype=dtype,
                                                           local_files_only=True)  # fmt: skip
        return pipe if device is None else pipe.to(device)
    spec, components = model_spec(str(model))["refiner"], {}
    for key, part in spec["components"].items():
        torch.manual_seed(part.get("seed", 0))
        components[key] = _component(part)
    pipe = getattr(diffusers, spec["pipeline"])(**components, vae=vae, **spec.get("pipeline_config", {}))
    pipe = pipe if dtype == torch.float32 else pipe.to(dtype)  # built in float32, as load_pipeline's tiny models
    return pipe if device is None else pipe.to(device)
