"""Wan 2.1 / 2.2 (``WanTransformer3DModel``; T2V, I2V, TI2V).

Self-attention (``attn1``) runs through USP. Cross-attention to text and the I2V image branch
(``attn2``) keep the stock processor: local queries against replicated keys need no communication.
The split/gather plan is the ``_cp_plan`` diffusers ships with the model.
"""

from dit_sp.models.family import ModelFamily

WAN = ModelFamily(
    name="wan",
    class_names=("WanTransformer3DModel",),
    plan=lambda model: model._cp_plan,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
)
