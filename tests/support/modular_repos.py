"""Built-in tiny modular pipelines saved as Modular Diffusers repositories, laid out as a downloaded one is: what
``ModularPipeline.save_pretrained`` writes, with each component's spec pointing at a Hub id (as a published index
does; the files are loaded from the directory whatever the spec says) and MiniMax-H3's processor recorded as the
``transformers.Qwen3VLProcessor`` it stands in for (the tiny one is that class without its video processor, which
needs torchvision: ``dit_sp.zoo.tokenizers.without_video``)."""

from __future__ import annotations

import json
from pathlib import Path

HUB_ID = "dit-sp/not-on-this-machine"


def save_repository(model: str, directory: Path, *, distilled: bool = False, index_only: bool = False) -> Path:
    """The built-in ``model`` (``tiny-minimax-h3``, ``tiny-wan-animate-2``) saved in ``directory`` as a downloaded
    repository; ``distilled``: its index names Wan-Animate-2's distilled pipeline and blocks; ``index_only``: the
    repository is there already (a copy), only its index is changed."""
    from dit_sp.zoo import build_tiny

    if not index_only:
        build_tiny(model).save_pretrained(str(directory), overwrite_modular_index=True)
    file = directory / "modular_model_index.json"
    index = json.loads(file.read_text())
    for value in index.values():
        if isinstance(value, list) and len(value) == 3 and value[0] is not None:
            value[2]["pretrained_model_name_or_path"] = HUB_ID
            if value[1].startswith("TextImage"):  # the processor: as released
                value[0:2] = value[2]["type_hint"] = ["transformers", value[1].removeprefix("TextImage")]
                processor = directory / value[2]["subfolder"] / "processor_config.json"
                settings = json.loads(processor.read_text())
                processor.write_text(json.dumps(settings | {"processor_class": value[1]}, indent=2))
    if distilled:
        index["_class_name"] = "WanAnimate2DistilledModularPipeline"
        index["_blocks_class_name"] = "WanAnimate2DistilledBlocks"
    file.write_text(json.dumps(index, indent=2))
    return directory


def save_blocks_repository(model: str, blocks: str, directory: Path, config: dict | None = None,
                           **components: object) -> Path:  # fmt: skip
    """The built-in ``model``'s components (``tiny-ltx2``'s for Echo), with ``components`` replacing or adding some,
    run by the Modular Diffusers ``blocks`` (``EchoBlocks``) with the pipeline ``config`` (saved in the index: Cosmos 3
    distilled's ``distilled_sigmas``) and saved in ``directory`` as a downloaded repository of that modular pipeline
    (each spec pointing at a Hub id): a modular-only pipeline of a transformer whose classic pipelines have a built-in
    model, at that model's shapes."""
    import diffusers

    from dit_sp.zoo import build_tiny

    built = build_tiny(model)
    built.text_tokenizer = getattr(built, "text_tokenizer", None)  # (Cosmos 3's tokenizer)
    pipe = getattr(diffusers, blocks)().init_pipeline()
    parts = {name: getattr(built, name, None) for name in pipe.component_names} | components
    pipe.update_components(**{name: part for name, part in parts.items() if part is not None})
    pipe.register_to_config(**(config or {}))
    pipe.save_pretrained(str(directory), overwrite_modular_index=True)
    file = directory / "modular_model_index.json"
    index = json.loads(file.read_text())
    for value in index.values():
        if isinstance(value, list) and len(value) == 3 and value[0] is not None and isinstance(value[2], dict):
            value[2]["pretrained_model_name_or_path"] = HUB_ID
    file.write_text(json.dumps(index, indent=2))
    return directory


def tiny_diffusion_decoder() -> object:
    """A tiny LTX-2.5 diffusion decoder (``LTX2VideoDiffusionDecoderModel``) at ``tiny-ltx2``'s VAE factors (x4 in
    space and time, 4 latent channels), seeded: x4 in time from two temporal upsamples and x4 in space from its pixel
    patch (patch 4, no spatial upsample), 3 x 3 x 3 neighborhoods. Its stage-5 grid is the pixel grid over the patch
    (5 x 8 x 8 cells for 5 frames of 32 x 32): the unfused flex attention a CPU runs materializes every query-key
    pair, so the stock strides with patch 1 (17 x 64 x 64 cells for a 2 x 8 x 8 latent) take minutes and tens of GiB
    (decodes here in about 0.04 s)."""
    import diffusers
    import torch

    torch.manual_seed(0)
    return diffusers.LTX2VideoDiffusionDecoderModel(
        latent_channels=4, patch_size=4, decoder_head_dim=8, decoder_stage_channels=(16, 16, 16, 16, 8),
        decoder_stage_depths=(1, 1, 1, 1, 1), decoder_stage_kernels=((3, 3, 3),) * 4, decoder_stage5_kernel=(3, 3, 3),
        decoder_upsample_strides=((1, 1, 1), (1, 1, 1), (2, 1, 1), (2, 1, 1)),
        decoder_upsample_channel_reductions=(1, 1, 1, 2), decoder_t_emb_dim=16, spatial_compression_ratio=4,
        temporal_compression_ratio=4,
    )  # fmt: skip
