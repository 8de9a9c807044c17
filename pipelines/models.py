"""Built-in model names (tiny pipelines of each family, built offline from configs/models/*.yaml, tokenizers
included) and loading of local diffusers checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
MODEL_DIR = CONFIG_DIR / "models"


def builtin_models() -> list[str]:
    return sorted(p.stem for p in MODEL_DIR.glob("*.yaml"))


def default_model() -> str:
    """The trained tiny model when it is shipped, else the random tiny Wan."""
    return "toy-wan" if (CONFIG_DIR.parent / "assets" / "toy-wan" / "model_index.json").is_file() else "tiny-wan"


def model_spec(name: str) -> dict[str, Any]:
    path = MODEL_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown model {name!r}: built-in models are {builtin_models()}, or give a local directory")
    return yaml.safe_load(path.read_text())


# Llama 3's pre-tokenizer (words with their leading space, up to 3 digits, punctuation runs, newlines).
_LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)


def _llama3_byte_tokenizer(config: dict[str, Any]) -> Any:
    """A Llama 3 style byte-level BPE tokenizer, built here (nothing to download): every byte, and as one
    token each word of HunyuanVideo's stock prompt template (as in Llama 3's vocabulary), so the stock
    template's ``crop_start`` (95 tokens before the prompt) is exact for it too."""
    import re

    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    template = DEFAULT_PROMPT_TEMPLATE["template"]
    bos, eos = config["bos_token"], config["eos_token"]
    specials = list(dict.fromkeys([bos, eos, *re.findall(r"<\|[a-z_]+\|>", template)]))
    split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    parts = re.split("|".join(map(re.escape, specials)), template)
    words = [word for part in parts for word, _ in pre.pre_tokenize_str(part)]
    tokens = dict.fromkeys([*sorted(pre_tokenizers.ByteLevel.alphabet()), *words])
    tokenizer = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], ignore_merges=True))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre, decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **config)


def _clip_byte_vocab() -> dict[str, Any]:
    """``CLIPTokenizer`` arguments for byte-level BPE without merges: every byte a token (also as the
    end of a word)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = ["<|startoftext|>", "<|endoftext|>", *alphabet, *(c + "</w>" for c in alphabet)]
    return {"vocab": {t: i for i, t in enumerate(tokens)}, "merges": []}


def _component(spec: dict[str, Any]) -> Any:
    import diffusers
    import transformers

    cls_name = spec["class"]
    cls = getattr(diffusers, cls_name, None) or getattr(transformers, cls_name)
    config = dict(spec.get("config", {}))
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        return cls(cls.config_class(**config)).eval()
    if spec.get("vocab") == "llama3-bytes":
        return _llama3_byte_tokenizer(config)
    if spec.get("vocab") == "clip-bytes":
        return cls(**_clip_byte_vocab(), **config)
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


_SHAPE = ("frames", "height", "width", "steps", "guidance", "max_sequence_length")
# Generation defaults of a local checkpoint, by its pipeline class: the real models' usual settings.
CHECKPOINT_DEFAULTS = {
    "WanPipeline": dict(zip(_SHAPE, (33, 480, 832, 50, 5.0, 512))),
    "CogVideoXPipeline": dict(zip(_SHAPE, (49, 480, 720, 50, 6.0, 226))),
    # guidance-distilled: true classifier-free guidance off; its embedded guidance_scale stays at 6.0
    "HunyuanVideoPipeline": dict(zip(_SHAPE, (61, 320, 512, 30, 1.0, 256))),
}


def model_defaults(model: str) -> dict[str, Any]:
    """Generation defaults of a built-in model, or of a local checkpoint by its pipeline class."""
    path = Path(model)
    if path.is_dir():
        try:
            name = json.loads((path / "model_index.json").read_text()).get("_class_name")
        except (OSError, ValueError, AttributeError):
            name = None  # load_pipeline reports what is wrong with the directory
        return dict(CHECKPOINT_DEFAULTS.get(name, CHECKPOINT_DEFAULTS["WanPipeline"]))
    return dict(model_spec(model).get("defaults", {}))


def load_pipeline(model: str, dtype: torch.dtype) -> Any:
    """A built-in tiny pipeline, or a ``save_pretrained`` directory loaded offline."""
    path = Path(model)
    if not path.exists() and "path" in (spec := model_spec(model)):  # a shipped, trained checkpoint
        path = CONFIG_DIR.parent / spec["path"]
    if not path.exists():
        spec = model_spec(model)  # raises for unknown names
        if "pipeline" not in spec:
            with_pipeline = [m for m in builtin_models() if "pipeline" in model_spec(m)]
            raise ValueError(f"built-in model {model!r} has no pipeline (transformer only); use one of {with_pipeline}")
        pipe = build_tiny(model)
        return pipe if dtype == torch.float32 else pipe.to(dtype)
    if not (path / "model_index.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a diffusers pipeline directory: model_index.json is missing "
            "(save one with pipeline.save_pretrained(DIR))"
        )
    import diffusers

    try:
        return diffusers.DiffusionPipeline.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{path} is an incomplete diffusers pipeline directory: {e}") from e


def check_shape(pipe: Any, settings: dict[str, Any], flags: bool = True) -> None:
    """Frames, sizes and text length the VAE, the patching and the positional embeddings can take, or an
    error listing valid values. (Every supported transformer patches latent frames one by one, or, for
    CogVideoX 1.5, its pipeline pads them.) Messages name the settings as CLI flags (``--max-sequence-length``)
    or, with ``flags=False``, as config keys (``max_sequence_length``)."""

    def name(key: str) -> str:
        return "--" + key.replace("_", "-") if flags else key

    temporal = getattr(pipe, "vae_scale_factor_temporal", 1)
    spatial = getattr(pipe, "vae_scale_factor_spatial", 8)
    config = pipe.transformer.config
    patch = config.patch_size
    multiple = spatial * (patch[-1] if isinstance(patch, (list, tuple)) else patch)
    if (settings["frames"] - 1) % temporal:
        valid = [temporal * k + 1 for k in range(1, 5)]
        raise ValueError(f"{name('frames')} {settings['frames']}: the VAE needs {temporal}*k+1 frames, e.g. {valid}")
    for key in ("height", "width"):
        if settings[key] % multiple:
            lower, upper = (
                settings[key] // multiple * multiple or multiple,
                (settings[key] // multiple + 1) * multiple,
            )
            raise ValueError(
                f"{name(key)} {settings[key]}: must be a multiple of {multiple} (VAE x{spatial}, patch "
                f"x{multiple // spatial}), e.g. {lower} or {upper}"
            )
    # CogVideoX without RoPE adds sincos or learned positional embeddings over exactly this many text tokens
    text_len = config.get("max_text_seq_length") if not config.get("use_rotary_positional_embeddings", True) else None
    if text_len is not None and settings["max_sequence_length"] != text_len:
        raise ValueError(
            f"{name('max_sequence_length')} {settings['max_sequence_length']}: this model's positional embeddings "
            f"take exactly {text_len} text tokens; use {name('max_sequence_length')} {text_len}"
        )
