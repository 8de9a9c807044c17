"""The model zoo: built-in model names (tiny pipelines of each family, built offline from ``specs/*.yaml`` with
their tokenizers; the shipped trained ``toy-wan``), generation defaults, and offline loading of local
diffusers checkpoints."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dit_sp import families
from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.families import PARALLELIZED_TRANSFORMERS, TRANSFORMERS  # noqa: F401 (TRANSFORMERS: re-exported)
from dit_sp.families.family import no_grad
from dit_sp.io.bundled import ASSET_DIR, asset_path
from dit_sp.zoo.files import check_component, has_class, json_object
from dit_sp.zoo.hub import cached_snapshot, is_hub_id
from dit_sp.zoo.image import as_image_to_video, image_class  # noqa: F401 (as_image_to_video: re-exported)
from dit_sp.zoo.modular import is_modular, pipeline_of, read_index
from dit_sp.zoo.sample import read_sample_settings
from dit_sp.zoo.tokenizers import (
    clip_byte_vocab,
    llama3_byte_tokenizer,
    qwen2_5_vl_processor,
    qwen3_vl_processor,
    qwen_byte_tokenizer,
)

if TYPE_CHECKING:
    import torch

SPEC_DIR = Path(__file__).resolve().parent / "specs"

TEXT_ENCODERS = ("text_encoder", "text_encoder_2")
"""Pipeline components that only encode prompts (HunyuanVideo has two)."""

TILED_ONLY_VAES = ("AutoencoderKLAllegro",)
"""VAEs that decode only in tiles (Allegro's untiled decode raises ``NotImplementedError``): loaded with tiling on."""


def _tile_if_needed(pipe: Any) -> Any:
    families.prepare_pipeline(pipe)  # what the family needs of this install (Cosmos: a resize without torchvision)
    vae = getattr(pipe, "vae", None)
    if type(vae).__name__ in TILED_ONLY_VAES:
        vae.enable_tiling()
    return pipe


def builtin_models() -> list[str]:
    """The families' built-in models (each family lists its own; their specs are ``specs/<name>.yaml``): the
    trained ``toy-wan`` (``trained_models``) and the random tiny ones."""
    return families.tiny_models()


def trained_models() -> list[str]:
    """The built-in models with trained weights (a shipped checkpoint, ``toy-wan``); the others are seeded
    random weights, for checking layouts and code paths: their videos are noise."""
    return [name for name in builtin_models() if "path" in model_spec(name)]


def models_help() -> str:
    """The built-in models for a listing (a ``--model`` help): the trained ones apart from the random ones."""
    trained = trained_models()
    random = [name for name in builtin_models() if name not in trained]
    default = "; the default" if default_model() in trained else ""
    return f"built-in: {', '.join(trained)} (trained{default}), or {', '.join(random)} (random weights: noise)"


def random_weights_note(model: str | Path) -> str | None:
    """One line for a built-in model with random weights (its video is noise), else None: said once, so that
    noise is not taken for a bug."""
    if Path(model).exists() or str(model) not in builtin_models() or str(model) in trained_models():
        return None
    trained = " or ".join(trained_models())
    return f"note: {model} has random weights (for checking layouts): its video is noise; {trained} is trained"


def call_arguments(model: str | Path) -> dict[str, Any]:
    """Pipeline call arguments a built-in model's spec fixes (its ``call:`` table; e.g. ``tiny-ltx-long``'s decode
    tiles, which a 32 x 32 video does not need), ``{}`` for any other model."""
    if Path(model).exists() or str(model) not in builtin_models():
        return {}
    return dict(model_spec(str(model)).get("call", {}))


def default_model() -> str:
    """The trained tiny model when it is shipped, else the random tiny Wan."""
    return "toy-wan" if (ASSET_DIR / "toy-wan" / "model_index.json").is_file() else "tiny-wan"


def model_spec(name: str) -> dict[str, Any]:
    path = SPEC_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown model {name!r}: built-in models are {builtin_models()}, or give a local directory")
    return copy.deepcopy(_parsed_spec(path))  # a copy: callers may change theirs


@functools.cache
def _parsed_spec(path: Path) -> dict[str, Any]:
    """A spec, parsed once per process (a CLI's help and notes read every spec), by libyaml where PyYAML has it."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _component(spec: dict[str, Any]) -> Any:
    import diffusers
    import torch
    import transformers

    cls_name = spec["class"]
    if "module" in spec:  # a pipeline's own model class (LTX-2's connectors, vocoder): diffusers.pipelines.<name>
        import importlib  # (or a tiny model's stand-in here: dit_sp.zoo.guardrail's safety checker)

        if not str(spec["module"]).startswith(("diffusers.pipelines.", "dit_sp.zoo.")):
            raise ConfigError(f"component module {spec['module']!r}: only diffusers.pipelines.* and dit_sp.zoo.* "
                              "modules are built")  # fmt: skip
        cls = getattr(importlib.import_module(spec["module"]), cls_name)
    else:
        cls = getattr(diffusers, cls_name, None) or getattr(transformers, cls_name)
    config = dict(spec.get("config", {}))
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        return cls(cls.config_class(**config)).eval()
    if spec.get("vocab") in ("llama3-bytes", "llama3-bytes-i2v"):
        return llama3_byte_tokenizer(config, image_to_video=spec["vocab"] == "llama3-bytes-i2v")
    if spec.get("vocab") == "qwen-bytes":
        return qwen_byte_tokenizer(config)
    if spec.get("vocab") == "qwen-vl-bytes":  # Qwen-VL's tokenizer with its vision markers, or a processor over it
        if cls_name.endswith("Processor"):
            return qwen3_vl_processor(config) if cls_name.startswith("Qwen3") else qwen2_5_vl_processor(config)
        return qwen_byte_tokenizer(config, vision=True)
    if spec.get("vocab") == "clip-bytes":
        return cls(**clip_byte_vocab(), **config)
    if cls_name.endswith("Tokenizer"):
        return cls(**config)
    if hasattr(cls, "from_config"):
        model = cls.from_config(config) if not issubclass(cls, torch.nn.Module) else cls(**config)
        if "extra_config" in spec:  # a config key a pipeline reads that the class does not take (cache_mag_vae)
            model.register_to_config(**spec["extra_config"])
        if "redraw_zeros" in spec:  # weights a family initialises to zero (adaLN modulation): re-drawn, seeded
            _redraw_zeros(model, spec["redraw_zeros"])
        return model.eval() if isinstance(model, torch.nn.Module) else model
    return cls(**config)


@no_grad
def _redraw_zeros(model: torch.nn.Module, std: float) -> None:
    """Draw the parameters a family initialises to all zeros (its blocks' gates: a tiny random model of it would be
    the identity, and a check of its layouts could not fail) from N(0, std), from the global seed."""
    for param in model.parameters():
        if param.numel() and not param.any():
            param.normal_(0.0, std)


def build_tiny(name: str, component: str | None = None) -> Any:
    """A built-in tiny pipeline (or one of its components), with weights seeded from its config."""
    import torch

    spec = model_spec(name)
    components = {}
    for key, comp_spec in spec["components"].items():
        if component is not None and key != component:
            continue
        torch.manual_seed(comp_spec.get("seed", spec.get("seed", 0)))  # independent of the others' sizes
        components[key] = _component(comp_spec)
    if component is not None:
        return components[component]
    import diffusers

    if "blocks" in spec:  # a Modular Diffusers pipeline (MiniMax-H3): its blocks' pipeline, holding the components
        pipe = getattr(diffusers, spec["blocks"])().init_pipeline()
        pipe.update_components(**components)
        pipe.register_to_config(**spec.get("pipeline_config", {}))  # its blocks' configs (saved in its index)
        return pipe
    pipe = getattr(diffusers, spec["pipeline"])(**components, **spec.get("pipeline_config", {}))
    for key, value in spec.get("pipeline_attributes", {}).items():  # set after building (Kandinsky 5's resolutions)
        # YAML lists of pairs as the tuples the pipeline compares against
        is_list = isinstance(value, list)
        setattr(pipe, key, [tuple(v) if isinstance(v, list) else v for v in value] if is_list else value)
    return _tile_if_needed(pipe)


CHECKPOINT_DEFAULTS = families.checkpoint_defaults()
"""Generation defaults of a local checkpoint, by its pipeline class (each family's ``checkpoint_defaults``)."""


def checkpoint_dir(model: str | Path) -> Path | None:
    """The directory a model name stands for: a local path, a bundled asset (``toy-wan``), a hub id
    (``ORG/NAME``) in the local Hugging Face cache (``dit_sp.zoo.hub``), or the shipped checkpoint of a
    built-in name; ``None`` for a tiny model built in code. Unknown names raise."""
    path = asset_path(model)
    if path is not None:
        return path
    if is_hub_id(model):  # ORG/NAME: the local hub cache's snapshot, or one line naming the download command
        return cached_snapshot(str(model))
    if Path(model).is_absolute() or len(Path(model).parts) > 1:
        raise MissingFileError(f"model directory {model} does not exist")
    spec = model_spec(str(model))  # raises for unknown names
    return asset_path(spec["path"]) if "path" in spec else None


def pipeline_class_name(model: str | Path, *, image: bool = False) -> str | None:
    """The diffusers pipeline class of a built-in model or a checkpoint directory (from its files alone);
    ``None`` where it cannot be read (the full load reports why). ``image``: the class that runs it with an
    image (``dit_sp.zoo.image``: its family's image-to-video class, where it has one; ``ConfigError`` where that
    class does not take the checkpoint's components)."""
    index = pipeline_index(model)
    if index is None:
        return None
    name, settings, components = index
    return image_class(name, settings, components, model) if image else name


def pipeline_index(model: str | Path) -> tuple[str | None, dict[str, Any], dict[str, bool]] | None:
    """A built-in model's or checkpoint directory's pipeline class, settings (``model_index.json``'s entries, a
    spec's ``pipeline_config``) and components (by name: whether it has one), from its files alone; ``None`` where
    they cannot be read."""
    try:
        path = checkpoint_dir(model)
        if path is None:
            spec = model_spec(str(model))
            return (
                spec.get("pipeline"),
                spec.get("pipeline_config", {}),
                dict.fromkeys(spec.get("components", {}), True),
            )
        if is_modular(path):  # a Modular Diffusers repository: the pipeline its blocks run as
            return pipeline_of(path), {}, {}
        settings = json.loads((path / "model_index.json").read_text())
        components = {key: value[0] is not None for key, value in settings.items()
                      if not key.startswith("_") and isinstance(value, list) and len(value) == 2}  # fmt: skip
        return settings.get("_class_name"), settings, components
    except (OSError, ValueError, AttributeError, ConfigError, MissingFileError):
        return None


def model_defaults(model: str) -> dict[str, Any]:
    """Generation defaults of a built-in model, or of a local checkpoint: its pipeline class's (the real
    models' settings), then those a trained export recorded (``dit_sp.zoo.sample``: the size and steps it
    was trained at)."""
    if not Path(model).exists() and model in builtin_models():
        return dict(model_spec(model).get("defaults", {}))
    path = checkpoint_dir(model)  # raises for a missing directory or an unknown name
    if path is not None and path.is_dir():
        try:
            name = (
                pipeline_of(path)
                if is_modular(path)
                else json.loads((path / "model_index.json").read_text()).get("_class_name")
            )
        except (OSError, ValueError, AttributeError, ConfigError):
            name = None  # load_pipeline reports what is wrong with the directory
        defaults = dict(CHECKPOINT_DEFAULTS.get(name, CHECKPOINT_DEFAULTS["WanPipeline"]))
        if name is not None and is_modular(path) and (sigmas := read_index(path).get("distilled_sigmas")):
            defaults["steps"] = len(sigmas)  # a distilled schedule fixed by the index (Cosmos 3's distilled)
        return defaults | read_sample_settings(path)
    return dict(model_spec(model).get("defaults", {}))


def check_checkpoint(model: str | Path) -> dict[str, Any]:
    """A checkpoint directory checked from its files alone, before anything loads or any worker starts: its
    ``model_index.json`` (valid JSON naming a diffusers pipeline class, and library classes that exist), each
    component's directory, the ``config.json`` of each model component and the headers of its safetensors
    files (``dit_sp.weights.loading.safetensors_header``: truncated or foreign files). A ``ConfigError`` (or
    ``MissingFileError``) names the file and what is wrong; returns the parsed ``model_index.json`` (``{}`` for
    a tiny model built in code). Class names are looked up in the libraries' lazy listings (nothing imported). A
    Modular Diffusers repository is checked by ``dit_sp.zoo.modular.check_repository``."""
    from dit_sp.zoo.modular import check_repository

    path = checkpoint_dir(model)
    if path is None:
        return {}
    file = path / "model_index.json"
    if is_modular(path):
        return check_repository(path)
    if not file.is_file():
        raise MissingFileError(f"{path} is not a diffusers pipeline directory: model_index.json is missing "
                               "(save one with pipeline.save_pretrained(DIR))")  # fmt: skip
    index = json_object(file, "the pipeline's index, as pipeline.save_pretrained(DIR) writes it")
    name = index.get("_class_name")
    if not has_class("diffusers", name):
        raise ConfigError(f"{file}: _class_name {name!r} is not a pipeline class of this diffusers; is it a "
                          "pipeline directory of a newer diffusers, or a model's own directory?")  # fmt: skip
    for key, value in index.items():
        if key.startswith("_") or not isinstance(value, list) or len(value) != 2 or value[0] is None:
            continue  # a pipeline setting (expand_timesteps, ...) or an absent component ([null, null])
        check_component(path, key, tuple(value), file, "diffusers pipeline directory")
    return index


def load_pipeline(
    model: str | Path,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    *,
    empty_transformers: bool = False,
    without: tuple[str, ...] = (),
    sharded_text_encoders: tuple[Any, torch.dtype] | None = None,
    workflow: str | None = None,
) -> Any:
    """A built-in tiny pipeline, or a ``save_pretrained`` directory loaded offline, in ``dtype`` on ``device``: a
    diffusers pipeline directory, or a Modular Diffusers repository (``dit_sp.zoo.modular``: its modular pipeline).

    ``empty_transformers``: the transformer(s) of a checkpoint directory are built with their parameters on
    the meta device (no memory) instead of loaded; shard them, then fill them with
    ``dit_sp.weights.load_shards(model, model.weights_dir, device)``. ``without``: components of a checkpoint
    directory not to load (left ``None``; those it lacks are ignored). ``sharded_text_encoders=(group, dtype)``:
    the text encoders of a checkpoint directory are built empty and each process of ``group`` reads and holds
    about ``1/N`` of them, in ``dtype`` (``dit_sp.weights.encoder``; every process of ``group`` must then encode
    the same prompts). ``workflow``: a Modular Diffusers repository's workflow whose components load (default: its
    family's ``modular_workflow``). Tiny built-in models load whole.
    """
    import torch

    path = checkpoint_dir(model)
    if path is None:
        spec = model_spec(str(model))
        if "pipeline" not in spec:
            with_pipeline = [m for m in builtin_models() if "pipeline" in model_spec(m)]
            raise ConfigError(f"built-in model {model!r} is a transformer only; use one of {with_pipeline}")
        pipe = build_tiny(str(model))
        pipe = pipe if dtype == torch.float32 else pipe.to(dtype)
        return pipe if device is None else pipe.to(device)
    index = check_checkpoint(path)
    import diffusers

    present = [name for name, value in index.items() if isinstance(value, list) and value[0] is not None]
    if is_modular(path):  # the transformer(s) its workflow runs (MiniMax-H3's ref2va: transformer_ref)
        from dit_sp.zoo.modular import needed_components

        present = [name for name in present if name in needed_components(pipeline_of(path, index), workflow)]
    empty = [name for name in PARALLELIZED_TRANSFORMERS if empty_transformers and name in present]
    encoders = [name for name in TEXT_ENCODERS if sharded_text_encoders is not None and name in present]
    skipped = [name for name in (*without, *encoders) if name in present]
    if is_modular(path):  # its components in their folders (a spec's subfolder), set with update_components
        from dit_sp.zoo.modular import folders, load_repository

        pipe, folder = load_repository(path, dtype, skip=(*empty, *skipped), workflow=workflow), folders(index)
        return _fill(pipe, dtype, device, {n: path / folder[n] for n in (*empty, *encoders)}, empty,
                     [n for n in encoders if n not in without], sharded_text_encoders)  # fmt: skip
    try:
        try:
            pipe = diffusers.DiffusionPipeline.from_pretrained(
                path, dtype=dtype, local_files_only=True, **dict.fromkeys(empty + skipped)
            )
        except AttributeError:
            if "vae" not in skipped:
                raise
            # HunyuanVideo-1.5's pipelines read their VAE's config when built: load it, and drop it once built
            kept = [name for name in skipped if name != "vae"]
            pipe = diffusers.DiffusionPipeline.from_pretrained(
                path, dtype=dtype, local_files_only=True, **dict.fromkeys(empty + kept)
            )
            pipe.register_modules(vae=None)
    except (OSError, ValueError) as e:
        raise MissingFileError(f"{path} is an incomplete diffusers pipeline directory: {e}") from e
    _tile_if_needed(pipe)
    if "vae" in skipped:  # the pipeline derived them from its VAE, and fell back to Wan's defaults without one
        info = shape_info(path)
        if info is not None:
            pipe.vae_scale_factor_temporal = info.vae_scale_factor_temporal
            pipe.vae_scale_factor_spatial = info.vae_scale_factor_spatial
    return _fill(pipe, dtype, device, {n: path / n for n in (*empty, *encoders)}, empty,
                 [n for n in encoders if n not in without], sharded_text_encoders)  # fmt: skip


def _fill(pipe: Any, dtype: torch.dtype, device: Any, dirs: dict[str, Path], empty: list[str],
          encoders: list[str], sharded: tuple[Any, torch.dtype] | None) -> Any:  # fmt: skip
    """``pipe`` moved to ``device``, then its ``empty`` transformers built on meta (filled after sharding from their
    ``weights_dir``) and its ``encoders`` read shard-wise (``sharded``: ``(group, dtype)``), each from ``dirs``."""
    register = pipe.update_components if hasattr(pipe, "update_components") else pipe.register_modules  # modular
    if device is not None:
        pipe = pipe.to(device)  # before the empty transformers join: meta parameters cannot move
    if empty:
        from dit_sp.weights import empty_model

        for name in empty:
            transformer = empty_model(dirs[name], dtype)
            transformer.weights_dir = dirs[name]
            register(**{name: transformer})
    if encoders:
        from dit_sp.weights.encoder import load_sharded_text_encoder

        group, encoder_dtype = sharded
        for name in encoders:
            register(**{name: load_sharded_text_encoder(dirs[name], group, device or "cpu", encoder_dtype)})
    return pipe


_VAE_FACTORS = families.vae_factors()
"""How each pipeline class derives its VAE's (temporal, spatial) compression (each family's ``vae_factors``)."""


def _config_with_defaults(class_name: str, config: dict[str, Any]) -> dict[str, Any]:
    import inspect

    import diffusers

    parameters = inspect.signature(getattr(diffusers, class_name).__init__).parameters.values()
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return defaults | config


def shape_info(model: str | Path) -> Any | None:
    """What ``dit_sp.families.check_shape`` needs (the VAE's scale factors, the transformer's config) from the
    model's config files alone, so that sizes are checked before any weights load or workers start;
    ``None`` where the pipeline class or its files are not known (the full load reports those)."""
    from types import SimpleNamespace

    from diffusers.configuration_utils import FrozenDict

    path = checkpoint_dir(model)
    try:
        if path is None:
            spec = model_spec(str(model))
            pipeline, parts = spec.get("pipeline"), spec["components"]
            transformer, vae = (
                _config_with_defaults(parts[key]["class"], parts[key].get("config", {}))
                for key in ("transformer", "vae")
            )
        else:
            pipeline = json.loads((path / "model_index.json").read_text())["_class_name"]
            transformer, vae = (json.loads((path / key / "config.json").read_text()) for key in ("transformer", "vae"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pipeline not in _VAE_FACTORS:
        return None
    temporal, spatial = _VAE_FACTORS[pipeline](vae)
    return SimpleNamespace(transformer=SimpleNamespace(config=FrozenDict(transformer)),
                           vae_scale_factor_temporal=temporal, vae_scale_factor_spatial=spatial)  # fmt: skip


def check_shape_from_files(model: str | Path, settings: dict[str, Any], flags: bool = True) -> Any | None:
    """``dit_sp.families.check_shape`` of ``settings`` against the model's config files alone (before any weights
    load or workers start); returns ``shape_info(model)`` (``None``, and nothing checked, where it is unknown)."""
    from dit_sp.families import check_shape

    info = shape_info(model)
    if info is not None:
        check_shape(info, settings, flags)
    return info
