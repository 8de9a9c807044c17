"""ConsisID (``ConsisIDTransformer3DModel``): identity-preserving text-to-video on CogVideoX-5B.

Its blocks are CogVideoX's: every block attends over ``[text, video]`` jointly, text in front, through diffusers'
``CogVideoXAttnProcessor2_0``; the patch embedding runs on the full sequence and the video tokens are split where the
blocks start, gathered at ``proj_out`` (CogVideoX's plan, imported). The face conditioning adds, after every
``cross_attn_interval``-th block, a ``PerceiverCrossAttention``: each video token's query attends over the identity
tokens of the ``LocalFacialExtractor`` (``(B_id, num_queries, C)``, computed whole on every rank from ``id_cond`` and
``id_vit_hidden``). Its keys are the identity tokens alone, never other video tokens, so it is per token and stays
local on each rank's shard. The pipeline runs guidance as one call on ``[unconditional, conditional]``; the identity
inputs have one entry that both branches broadcast, so a CFG rank keeps them whole. The VAE is CogVideoX's.
``ConsisIDPipeline`` needs the face models of ``consisid_utils`` (insightface, facexlib, EVA-CLIP) to make its identity
inputs: no built-in model runs it whole (``tiny-consisid`` is the transformer only), and ``generate`` does not run it
(``ModelFamily.python_only``): it has no flags for those inputs.
"""

from __future__ import annotations

from dit_sp.families.cogvideox import _ARCHITECTURES as _COGVIDEOX
from dit_sp.families.cogvideox import COGVIDEOX_VAE, _plan, _shape_check, _teacache_probe
from dit_sp.families.family import ModelFamily

_I2V = _COGVIDEOX["cogvideox-5b-i2v"]
_ARCHITECTURES = {
    # BestWishYsh/ConsisID-preview: CogVideoX-5B-I2V's transformer (the face image's latents in channels: in_channels
    # 32, learned positional embeddings) with the face adapters at diffusers' defaults, which are the released ones
    # (LocalFacialExtractor: depth 10, 32 queries, output 2048; a PerceiverCrossAttention of 16 x 128 after every
    # second block); its VAE and T5-XXL are CogVideoX's. The face models (insightface, facexlib, EVA-CLIP) are not
    # counted: the pipeline does not hold them, the caller makes the identity inputs with them before the call.
    "consisid-preview": _I2V
    | {"transformers": {"transformer": ("ConsisIDTransformer3DModel", _I2V["transformers"]["transformer"][1]
                                        | {"is_train_face": True, "is_kps": False})},
       "names": ("consisid", "consisid-preview")},
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``)."""

PYTHON_ONLY = (
    "every sample needs face-identity inputs, id_cond and id_vit_hidden, made from a face image by the insightface, "
    "facexlib and EVA-CLIP models of diffusers' consisid_utils (prepare_face_models, then "
    "process_face_embeddings_infer), which generate does not make; make them so and call the pipeline from Python "
    "with them, under parallelize"
)
"""Why ``generate`` refuses ``ConsisIDPipeline`` before loading (one line); called with the identity inputs,
``parallelize`` splits it exactly."""

CONSISID = ModelFamily(
    name="consisid",
    class_names=("ConsisIDTransformer3DModel",),
    plan=_plan,  # CogVideoX's: root image_rotary_emb, transformer_blocks.0 hidden_states, gather proj_out
    attention_modules=("transformer_blocks.*.attn1",),  # perceiver_cross_attention.*: per token, local
    joint_position="front",
    cfg_mode="batched",
    # id_cond and id_vit_hidden: one entry for both guidance branches (the pipeline does not double them)
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep"),
    vae=COGVIDEOX_VAE,
    architectures=_ARCHITECTURES,
    shape_check=_shape_check,
    tiny_models=("tiny-consisid",),
    python_only={"ConsisIDPipeline": PYTHON_ONLY},
    block_outputs={"ConsisIDBlock": (0, 1)},  # CogVideoX's: (video, text); diffusers has no metadata for it
    # the perceiver cross-attention adds to the video tokens after every cross_attn_interval-th block: a skipped
    # step's cached residual holds it (dit_sp.cache.between)
    cache_between_blocks=("perceiver_cross_attention",),
    teacache_probe=_teacache_probe,  # CogVideoX's: the first block's norm1 output, (B, S_local, C)
    policy_refused={
        "ConsisIDPipeline": (
            "every sample needs face-identity inputs (id_cond and id_vit_hidden, made from a face image by "
            "the insightface, facexlib and EVA-CLIP models of consisid_utils), which the trainer does not "
            "make"
        ),
    },
)
