"""Worker side of the LTX variant pipelines' test: what ``parallelize`` refuses of LTX-2's IC-LoRA pipeline."""

from __future__ import annotations

import torch
from PIL import Image

from dit_sp import load_pipeline, parallelize
from dit_sp.errors import ConfigError
from dit_sp.parallel import init_layout


def in_context_mask_refusal() -> str:
    """On Ulysses 2: ``LTX2InContextPipeline`` with ``conditioning_attention_strength`` 0.5, which makes the
    pipeline pass a video self-attention mask; the error it raises (``""`` if none)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

    parallel = init_layout(ulysses=2)
    pipe = load_pipeline("tiny-ltx2-in-context", torch.float32)
    frames = [Image.new("RGB", (32, 32), (40 * i, 90, 200)) for i in range(5)]
    with parallelize(pipe, parallel):
        try:
            pipe(prompt="a cat", reference_conditions=[LTX2ReferenceCondition(frames=frames)], height=32, width=32,
                 num_frames=5, num_inference_steps=1, guidance_scale=1.0, stg_scale=0.0, modality_scale=1.0,
                 conditioning_attention_strength=0.5, output_type="latent")  # fmt: skip
        except ConfigError as e:
            return str(e)
    return ""
