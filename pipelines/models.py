"""Built-in model names (tiny, offline) and loading of local diffusers checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
MODEL_DIR = CONFIG_DIR / "models"


def builtin_models() -> list[str]:
    return sorted(p.stem for p in MODEL_DIR.glob("*.yaml"))


def model_spec(name: str) -> dict[str, Any]:
    path = MODEL_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown model {name!r}: built-in models are {builtin_models()}, or give a local directory")
    return yaml.safe_load(path.read_text())


def _component(spec: dict[str, Any]) -> Any:
    import diffusers
    import transformers

    cls_name = spec["class"]
    cls = getattr(diffusers, cls_name, None) or getattr(transformers, cls_name)
    config = spec.get("config", {})
    if cls_name == "UMT5EncoderModel" or cls_name.endswith("EncoderModel"):
        config_cls = getattr(transformers, cls_name.replace("EncoderModel", "Config"))
        return cls(config_cls(**config)).eval()
    if cls_name.endswith("Tokenizer"):
        return cls(**config)
    if hasattr(cls, "from_config"):
        model = cls.from_config(config) if not issubclass(cls, torch.nn.Module) else cls(**config)
        return model.eval() if isinstance(model, torch.nn.Module) else model
    return cls(**config)


def build_tiny(name: str, component: str | None = None) -> Any:
    """A built-in tiny pipeline (or one of its components), with weights seeded from its config."""
    spec = model_spec(name)
    components = {}
    for key, comp_spec in spec["components"].items():
        if component is not None and key != component:
            continue
        torch.manual_seed(spec.get("seed", 0))  # each component independent of the others' sizes
        components[key] = _component(comp_spec)
    if component is not None:
        return components[component]
    import diffusers

    return getattr(diffusers, spec["pipeline"])(**components)


def model_defaults(model: str) -> dict[str, Any]:
    """Generation defaults of a built-in model (a local checkpoint has none: pass them or a --config)."""
    if Path(model).is_dir():
        return {"frames": 33, "height": 480, "width": 832, "steps": 50, "guidance": 5.0, "max_sequence_length": 512}
    return dict(model_spec(model).get("defaults", {}))


def load_pipeline(model: str, dtype: torch.dtype) -> Any:
    """A built-in tiny pipeline, or a ``save_pretrained`` directory loaded offline."""
    path = Path(model)
    if not path.exists():
        spec = model_spec(model)  # raises for unknown names
        if "pipeline" not in spec:
            raise ValueError(f"built-in model {model!r} has no pipeline (transformer only); use tiny-wan")
        pipe = build_tiny(model)
        return pipe if dtype == torch.float32 else pipe.to(dtype)
    if not (path / "model_index.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a diffusers pipeline directory: model_index.json is missing "
            "(save one with pipeline.save_pretrained(DIR))"
        )
    import diffusers

    try:
        return diffusers.DiffusionPipeline.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{path} is an incomplete diffusers pipeline directory: {e}") from e
