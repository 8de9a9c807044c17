"""Per-family sequence-parallel support for diffusers video transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError
from dit_sp.families.allegro import ALLEGRO
from dit_sp.families.anyflow import ANYFLOW
from dit_sp.families.anyflow_far import ANYFLOW_FAR
from dit_sp.families.chronoedit import CHRONOEDIT
from dit_sp.families.cogvideox import COGVIDEOX
from dit_sp.families.consisid import CONSISID
from dit_sp.families.cosmos import COSMOS
from dit_sp.families.cosmos3 import COSMOS3
from dit_sp.families.easyanimate import EASYANIMATE
from dit_sp.families.family import PARALLELIZED_TRANSFORMERS, TRANSFORMERS, ModelFamily, VAEFactors
from dit_sp.families.helios import HELIOS
from dit_sp.families.hunyuan_video import HUNYUAN_VIDEO
from dit_sp.families.hunyuan_video15 import HUNYUAN_VIDEO15
from dit_sp.families.hunyuan_video_framepack import HUNYUAN_VIDEO_FRAMEPACK
from dit_sp.families.kandinsky5 import KANDINSKY5
from dit_sp.families.kandinsky6 import KANDINSKY6
from dit_sp.families.kandinsky6_sr import KANDINSKY6_SR
from dit_sp.families.latte import LATTE
from dit_sp.families.ltx import LTX
from dit_sp.families.ltx2 import LTX2
from dit_sp.families.minimax_h3 import MINIMAX_H3
from dit_sp.families.mochi import MOCHI
from dit_sp.families.motif_video import MOTIF_VIDEO
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.families.sana_video import SANA_VIDEO
from dit_sp.families.sana_wm import SANA_WM
from dit_sp.families.shape import check_latent_shape
from dit_sp.families.skyreels_v2 import SKYREELS_V2
from dit_sp.families.wan import WAN
from dit_sp.families.wan_animate import WAN_ANIMATE
from dit_sp.families.wan_animate_2 import WAN_ANIMATE_2
from dit_sp.families.wan_vace import WAN_VACE
from dit_sp.vae import VAEPlan

if TYPE_CHECKING:
    import torch

FAMILIES: tuple[ModelFamily, ...] = (
    WAN, HUNYUAN_VIDEO, COGVIDEOX,
    LTX, MOCHI, LTX2, EASYANIMATE, ALLEGRO,
    SKYREELS_V2, WAN_VACE, CHRONOEDIT, HUNYUAN_VIDEO15, HUNYUAN_VIDEO_FRAMEPACK, ANYFLOW, ANYFLOW_FAR,
    KANDINSKY5, MOTIF_VIDEO, COSMOS, MINIMAX_H3, HELIOS,
    LATTE, WAN_ANIMATE, SANA_VIDEO, COSMOS3, CONSISID, KANDINSKY6, KANDINSKY6_SR,
    WAN_ANIMATE_2, SANA_WM,
)  # fmt: skip


def supported_classes() -> list[str]:
    """The transformer classes ``parallelize`` splits (not those a family refuses, ``ModelFamily.refused``)."""
    return [name for family in FAMILIES for name in family.class_names if name not in family.refused]


def family_named(class_name: str) -> ModelFamily | None:
    """The family of the transformer class named ``class_name`` (read from a checkpoint's files, before loading), or
    None for a class of no registered family."""
    return next((f for f in FAMILIES if class_name in f.class_names), None)


def family_of(model: torch.nn.Module, controlnets: bool = False) -> ModelFamily:
    """The family of a diffusers transformer, or a clear error listing the supported ones; with ``controlnets``, a
    family's ControlNet (``ModelFamily.controlnet``, e.g. Cosmos-Transfer2.5's) is known too, as its own family."""
    names = {cls.__name__ for cls in type(model).__mro__}
    for family in FAMILIES:
        if names & set(family.class_names):
            return family
        if controlnets and family.controlnet is not None and names & set(family.controlnet.class_names):
            return family.controlnet
    raise TypeError(
        f"{type(model).__name__} is not supported for sequence parallelism; supported transformers: "
        f"{', '.join(supported_classes())}. To add it, write a ModelFamily for it in dit_sp/families/ and register "
        "it in FAMILIES (docs/architecture.md, section 8: Model families)"
    )


def prepare_pipeline(pipe: Any) -> None:
    """Ready ``pipe`` for this install with its transformer's family's ``prepare_pipeline`` (nothing for a pipeline
    of no supported family)."""
    found = (getattr(pipe, name, None) for name in PARALLELIZED_TRANSFORMERS)
    transformer = next((t for t in found if t is not None), None)
    names = {cls.__name__ for cls in type(transformer).__mro__} if transformer is not None else set()
    family = next((f for f in FAMILIES if names & set(f.class_names)), None)
    if family is not None:
        family.prepare_pipeline(pipe)


def vae_plan_of(vae: torch.nn.Module) -> VAEPlan | None:
    """How a diffusers VAE runs split (``dit_sp.vae``), or None for a VAE of no supported family."""
    names = {cls.__name__ for cls in type(vae).__mro__}
    return next((f.vae for f in FAMILIES if f.vae is not None and names & set(f.vae.class_names)), None)


def supported_vaes() -> list[str]:
    # (a VAE that several families' pipelines take, registered by each, once)
    return list(dict.fromkeys(name for family in FAMILIES if family.vae is not None for name in family.vae.class_names))


def policy_refusal(pipeline: str | None) -> str | None:
    """Why GRPO does not train the pipeline class named ``pipeline`` (``ModelFamily.policy_refused``), as the one
    line ``policy_for`` raises; None for a pipeline no family refuses."""
    why = next((f.policy_refused[pipeline] for f in FAMILIES if pipeline in f.policy_refused), None)
    return None if why is None else f"GRPO does not train {pipeline}: {why}"


def policy_for(pipe: Any) -> type[DiffusersPolicy]:
    """The GRPO policy class of a loaded pipeline, or a clear error listing the trainable pipelines."""
    name = type(pipe).__name__
    refusal = policy_refusal(name)
    if refusal is not None:
        raise ConfigError(refusal)
    for family in FAMILIES:
        if family.policy is not None and any(cls.__name__ in family.pipelines for cls in type(pipe).__mro__):
            return family.policy
    trainable = sorted(p for family in FAMILIES if family.policy is not None for p in family.pipelines)
    raise ConfigError(f"GRPO has no policy for {name}; supported pipelines: {trainable}")


def policy_named(pipeline: str | None) -> type[DiffusersPolicy] | None:
    """The GRPO policy class of the pipeline class named ``pipeline`` (read from a checkpoint's files, before
    loading), or None for a pipeline without one."""
    return next((f.policy for f in FAMILIES if f.policy is not None and pipeline in f.pipelines), None)


def policy_loads_vae(pipeline: str | None) -> bool:
    """Whether the GRPO policy of the pipeline class named ``pipeline`` conditions with the VAE on every rank
    (``DiffusersPolicy.conditions_with_vae``), so that every rank must load it; False for an unknown name."""
    policy = policy_named(pipeline)
    return policy is not None and policy.conditions_with_vae


def tiny_models() -> list[str]:
    """Every family's built-in models (``dit_sp/zoo/specs/<name>.yaml``), sorted."""
    return sorted(name for family in FAMILIES for name in family.tiny_models)


def checkpoint_defaults() -> dict[str, dict[str, Any]]:
    """Generation defaults of a local checkpoint, by its pipeline class, over all families."""
    return {pipeline: dict(d) for family in FAMILIES for pipeline, d in family.checkpoint_defaults.items()}


def vae_factors() -> dict[str, VAEFactors]:
    """How each pipeline class derives its VAE's ``(temporal, spatial)`` compression from the VAE config."""
    return {pipeline: read for family in FAMILIES for pipeline, read in family.vae_factors.items()}


def refused_pipelines() -> dict[str, str]:
    """The pipeline classes ``parallelize`` and ``generate`` refuse, with the reason, over all families."""
    return {pipeline: why for family in FAMILIES for pipeline, why in family.refused_pipelines.items()}


def python_only_pipelines() -> dict[str, str]:
    """The pipeline classes ``generate`` does not run but ``parallelize`` splits (called from Python), with the
    reason, over all families."""
    return {pipeline: why for family in FAMILIES for pipeline, why in family.python_only.items()}


def video_tensor_pipelines() -> dict[str, Any]:
    """The pipeline classes that take ``--video`` as one ``(1, T, 3, H, W)`` tensor in [0, 1], each with the lengths
    it takes (``ModelFamily.video_tensor``), over all families."""
    return {pipeline: lengths for family in FAMILIES for pipeline, lengths in family.video_tensor.items()}


def architectures() -> dict[str, dict[str, Any]]:
    """The real checkpoints the memory planner knows, over all families."""
    return {name: arch for family in FAMILIES for name, arch in family.architectures.items()}


def image_to_video_pipeline(pipeline: str | None, config: dict[str, Any]) -> str | None:
    """The image-to-video pipeline class that runs a checkpoint of pipeline class ``pipeline`` (its pipeline config:
    ``model_index.json``'s settings) when an image is given (``ModelFamily.image_to_video``, where the family's
    ``image_to_video_if`` holds), or None: it runs as it is."""
    for family in FAMILIES:
        if pipeline in family.image_to_video and family.image_to_video_if(config):
            return family.image_to_video[pipeline]
    return None


def ring_refusal(config: Any, *, class_name: str = "", pipeline: str = "") -> str:
    """Why a ring cannot split exactly the transformer of ``config`` (its ``config.json`` mapping), of transformer
    class ``class_name`` or in a pipeline of class ``pipeline``, from its family (``ModelFamily.ring_refusal``); empty
    where a ring splits it or the family is not known. Read before any weights load (``generate``, the GRPO trainer's
    preflight, the memory planner)."""
    family = family_named(class_name) or next(
        (f for f in FAMILIES if pipeline in {*f.checkpoint_defaults, *f.modular_pipelines}), None
    )
    return family.ring_refusal(config or {}) if family is not None else ""


def check_shape(pipe: Any, settings: dict[str, Any], flags: bool = True) -> None:
    """``check_latent_shape`` with every registered family's own limits (``ModelFamily.shape_check``)."""
    check_latent_shape(pipe, settings, flags, rules=[family.shape_check for family in FAMILIES])


__all__ = [
    "FAMILIES",
    "PARALLELIZED_TRANSFORMERS",
    "TRANSFORMERS",
    "DiffusersPolicy",
    "ModelFamily",
    "architectures",
    "check_shape",
    "checkpoint_defaults",
    "family_named",
    "family_named",
    "family_of",
    "image_to_video_pipeline",
    "policy_for",
    "policy_refusal",
    "policy_loads_vae",
    "policy_named",
    "python_only_pipelines",
    "ring_refusal",
    "supported_classes",
    "supported_vaes",
    "tiny_models",
    "vae_factors",
    "vae_plan_of",
    "video_tensor_pipelines",
]
