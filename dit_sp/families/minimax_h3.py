"""MiniMax-H3 (``MiniMaxH3Transformer3DModel``; Modular Diffusers only: ``MiniMaxH3ModularPipeline``).

One packed sequence per request: text, video and audio rows side by side, each row with its own ``(t, h, w)`` rotary
coordinates and its own ``(timestep, modality)`` modulation, under full non-causal self-attention (``attn``, through
USP) with no mask and no cross-attention; the text refiner before the blocks attends over text only (local). The
plan is the ``_cp_plan`` diffusers ships: the rotary tables, the packed rows at the first block, the per-row
modulation indices at every block and at the output norm, gathered at both output heads (the video and audio rows
are selected from the whole sequence after). Its length needs no divisibility here: an uneven tail is padded and
masked.
"""

from dit_sp._compat import model_cp_plan
from dit_sp.families.family import ModelFamily

MINIMAX_H3 = ModelFamily(
    name="minimax_h3",
    step_cache=False,
    class_names=("MiniMaxH3Transformer3DModel",),
    modular_pipelines=("MiniMaxH3ModularPipeline",),
    tiny_models=("tiny-minimax-h3",),
    plan=model_cp_plan,
    attention_modules=("transformer_blocks.*.attn",),
    cfg_refused=(
        "MiniMax-H3 is guidance-distilled: its modular denoise step makes one transformer call a step (no guider, "
        "no unconditional branch), so there is no guidance pair to split; use cfg=1"
    ),
)
