"""Kandinsky 5 in NABLA mode (``attention_type: nabla``): a tiny transformer, its inputs with the pipeline's own
``sparse_params``, and the worker-side checks against one process (there with diffusers' flex backend, which the stock
model needs for NABLA): the NABLA masks each rank builds for its heads (equal, block for block, to the one-process
masks of those heads), the output with flex attention, the output and every gradient with flex attention replaced by
the same block mask as dense SDPA in both runs (torch's flex attention has no backward on CPU, and eager flex ignores
a block mask without ``mask_mod``, as NABLA's is), the tokens each rank's self-attention took (the one-process
fractal-ordered sequence's contiguous half), and the ring refused in NABLA mode only.

The inputs: 2 latent frames of 16 x 32 at patch (1, 2, 2), 8 x 16 tokens a frame: 256 tokens in 4 NABLA blocks of 64
(``8 x 8`` neighbourhoods); 3 heads over 2 processes (uneven: a padded head)."""

from __future__ import annotations

import contextlib
from typing import Any

import nabla_stand_ins
import torch
from model_checks import worst_grad_errors

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.attention import head_group

MODULE = "diffusers.models.transformers.transformer_kandinsky"
NABLA = {"attention_type": "nabla", "attention_P": 0.5, "attention_wT": 1, "attention_wH": 1, "attention_wW": 1,
         "attention_add_sta": True, "attention_method": "topcdf"}  # fmt: skip
"""The NABLA settings of a Kandinsky 5 transformer config (the 10 s checkpoints' keys)."""
CONFIG = {"in_visual_dim": 4, "in_text_dim": 16, "in_text_dim2": 8, "time_dim": 16, "out_visual_dim": 4,
          "patch_size": (1, 2, 2), "model_dim": 48, "ff_dim": 64, "num_text_blocks": 1, "num_visual_blocks": 2,
          "axes_dims": (4, 6, 6)} | NABLA  # fmt: skip
TOKENS = 256
HEADS = 3


def build() -> torch.nn.Module:
    """The tiny NABLA transformer (seeded; zero-initialised modulation re-drawn), its visual self-attention on
    diffusers' flex backend (which the stock model's NABLA needs: the default backend takes no ``BlockMask``), as
    ``generate`` loads a NABLA checkpoint."""
    import diffusers
    from kandinsky_cosmos_checks import redraw_zeros

    torch.manual_seed(0)
    model = redraw_zeros(diffusers.Kandinsky5Transformer3DModel(**CONFIG)).float().eval()
    for block in model.visual_transformer_blocks:
        block.self_attention.set_attention_backend("flex")
    return model


def sparse_params(model: torch.nn.Module, latents: torch.Tensor) -> dict[str, Any]:
    """What ``Kandinsky5T2VPipeline`` passes for ``latents`` ``(B, T, H, W, C)`` (its own ``get_sparse_params``)."""
    from diffusers import Kandinsky5T2VPipeline

    pipe = Kandinsky5T2VPipeline.__new__(Kandinsky5T2VPipeline)  # the method reads the transformer's config only
    pipe.__dict__["transformer"] = model
    return Kandinsky5T2VPipeline.get_sparse_params(pipe, latents, latents.device)


def nabla_inputs(model: torch.nn.Module, batch: int = 2, seed: int = 7) -> dict[str, Any]:
    """``seed``: a dp replica's (``dp_seed``)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, 2, 16, 32, 4, generator=g)
    return {"hidden_states": hidden, "encoder_hidden_states": torch.randn(batch, 7, 16, generator=g),
            "timestep": torch.tensor([500.0, 20.0][:batch]), "pooled_projections": torch.randn(batch, 8, generator=g),
            "visual_rope_pos": [torch.arange(2), torch.arange(8), torch.arange(16)], "text_rope_pos": torch.arange(7),
            "scale_factor": (1.0, 2.0, 2.0), "sparse_params": sparse_params(model, hidden)}  # fmt: skip


def recorded_masks(masks: list[torch.Tensor]) -> contextlib.AbstractContextManager:
    """Each NABLA mask built while inside (the stock processor and dit-sp's both call the module's ``nablaT_v2``)."""
    return nabla_stand_ins.recorded_masks(MODULE, "nablaT_v2", masks)


def dense_block_attention() -> contextlib.AbstractContextManager:
    """Every attention of the model (the text blocks', the cross-attention's, NABLA's) as SDPA
    (``nabla_stand_ins.dense_block_attention``)."""
    return nabla_stand_ins.dense_block_attention(MODULE)


def _run(model: torch.nn.Module, kwargs: dict, grad_scale: float) -> tuple[torch.Tensor, dict]:
    """Output and gradients of ``sum(out * w)`` (times ``grad_scale``) w.r.t. the latents, the text and the
    parameters."""
    model.zero_grad(set_to_none=True)
    leaves = {k: kwargs[k].clone().requires_grad_() for k in ("hidden_states", "encoder_hidden_states")}
    out = model(**(kwargs | leaves)).sample
    loss = (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(3))).sum()
    (loss * grad_scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    return out.detach(), grads | {f"param.{n}": p.grad for n, p in model.named_parameters()}


def _taken(model: torch.nn.Module, taken: list[torch.Tensor]) -> list[Any]:
    """Hooks recording the hidden states ``(B, S_local, C)`` the first block's self-attention takes."""
    attention = model.visual_transformer_blocks[0].self_attention
    return [attention.register_forward_pre_hook(lambda m, args: taken.append(args[0].detach().clone()))]


def _refusal(fn: Any) -> str:
    try:
        fn()
    except NotImplementedError as error:
        return f"{type(error).__name__}: {error}"
    return ""


def check_nabla_transformer(layout: tuple[int, int, int] = (1, 1, 2), extras: bool = True) -> dict[str, Any]:
    """``layout`` (dp, ring, ulysses; default Ulysses 2) against this process's unsplit runs (the stock model on
    diffusers' flex backend) on this dp replica's inputs (``"seed"``): masks, the flex output, the dense output and
    gradients (summed over the group), the tokens the self-attention took (against the one-process fractal-ordered
    sequence), ``unparallelize`` restoring the stock modules; with ``extras`` (a 2-process world), the ring refused
    for NABLA and kept for the dense mode."""
    model = build()
    dp, ring, ulysses = layout
    parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
    kwargs = nabla_inputs(model, seed=parallel.dp_seed(7))
    ref_masks: list[torch.Tensor] = []
    ref_taken: list[torch.Tensor] = []
    handles = _taken(model, ref_taken)
    with torch.no_grad(), recorded_masks(ref_masks):
        ref_flex = model(**kwargs).sample
    for h in handles:
        h.remove()
    with dense_block_attention():
        ref_out, ref_grads = _run(model, kwargs, 1.0)

    masks: list[torch.Tensor] = []
    taken: list[torch.Tensor] = []
    with parallelize(model, parallel, verify_inputs=True):
        handles = _taken(model, taken)
        with torch.no_grad(), recorded_masks(masks):
            flex = model(**kwargs).sample
        for h in handles:
            h.remove()
        with dense_block_attention():
            out, grads = _run(model, kwargs, 1.0 / parallel.sp)
    heads = head_group(HEADS, parallel)
    real = heads.stop - heads.start  # this rank's real heads: the first of its group (a padded head behind them)
    rank, local = parallel.ulysses_rank, TOKENS // parallel.ulysses
    errors: dict[str, Any] = {
        "masks": len(masks),
        "masks_equal": len(masks) == len(ref_masks)
        and all(torch.equal(m[:, :real], r[:, heads]) for m, r in zip(masks, ref_masks)),
        "mask_density": torch.stack(ref_masks).float().mean().item(),
        "taken": tuple(taken[0].shape),
        # this rank's tokens: a contiguous run of whole NABLA blocks of the one-process (fractal-ordered) sequence
        "taken_error": (taken[0] - ref_taken[0][:, rank * local : (rank + 1) * local]).abs().max().item(),
        "flex": (flex - ref_flex).abs().max().item(),
        "out": (out - ref_out).abs().max().item(),
        "ref_scale": ref_out.abs().max().item(),
        "grads_compared": len(ref_grads),
        "params": len(list(model.parameters())),
        "seed": parallel.dp_seed(7),
    }
    errors |= worst_grad_errors(grads, ref_grads, parallel, relative=True)
    errors["left_stock"] = all("forward" not in vars(b.self_attention) for b in model.visual_transformer_blocks)
    with torch.no_grad():
        errors["restored_bit_identical"] = float(torch.equal(model(**kwargs).sample, ref_flex))
    if not extras:
        return errors
    ring = init_parallel(ParallelConfig(ring=2))
    errors["ring_refusal"] = _refusal(lambda: parallelize(model, ring))
    dense = model.from_config({k: v for k, v in model.config.items() if k not in NABLA})  # attention_type 'regular'
    with parallelize(dense, ring):  # the dense mode keeps its ring
        errors["dense_ring"] = True
    return errors


POLICY = {"frames": 5, "height": 128, "width": 128, "guidance": 4.0, "max_sequence_length": 16}
"""GRPO's sample: 2 latent frames of 8 x 8 tokens (one NABLA block each), guided."""


def nabla_policy(**settings: Any) -> Any:
    """``Kandinsky5Policy`` of ``tiny-kandinsky5`` with NABLA on in its transformer's config (fp32), on diffusers'
    flex backend as ``load_pipeline`` leaves a NABLA checkpoint; ``settings`` over ``POLICY``."""
    from dit_sp.families.kandinsky5 import Kandinsky5Policy
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-kandinsky5")
    pipe.transformer.register_to_config(**NABLA)
    for block in pipe.transformer.visual_transformer_blocks:
        block.self_attention.set_attention_backend("flex")
    return Kandinsky5Policy(pipe, pipe.transformer, **POLICY | settings)


def _policy_run(policy: Any, x: torch.Tensor, cond: Any, grad_scale: float) -> tuple[torch.Tensor, dict]:
    """The guided velocity at ``s = 0.7`` and the gradients of ``sum(v * w)`` (times ``grad_scale``) w.r.t. ``x`` and
    every transformer parameter."""
    model = policy.transformer
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    v = policy.velocity(x, 0.7, cond)
    ((v * torch.randn(v.shape, generator=torch.Generator().manual_seed(3))).sum() * grad_scale).backward()
    return v.detach(), {"input.x": x.grad} | {f"param.{n}": p.grad for n, p in model.named_parameters()}


def check_nabla_policy() -> dict[str, Any]:
    """GRPO's velocity of a NABLA checkpoint (``Kandinsky5Policy``: the transformer called with the pipeline's
    ``sparse_params``) and its gradients on Ulysses 2 against this process's unsplit run, the dense stand-in in both
    (flex attention has no CPU backward): errors, the NABLA masks built, and how far the velocity is from the dense
    model's (the same weights, ``attention_type`` regular: NABLA's masks act)."""
    policy = nabla_policy()
    cond = policy.encode(["a red circle"])
    x = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    ref_masks: list[torch.Tensor] = []
    with dense_block_attention(), recorded_masks(ref_masks):
        ref_v, ref_grads = _policy_run(policy, x, cond, 1.0)
    parallel = init_parallel(ParallelConfig(ulysses=2))
    masks: list[torch.Tensor] = []
    with parallelize(policy.transformer, parallel, verify_inputs=True), dense_block_attention(), recorded_masks(masks):
        v, grads = _policy_run(policy, x, cond, 1.0 / parallel.sp)
    policy.transformer.register_to_config(attention_type="regular")  # the same weights, dense
    with torch.no_grad(), dense_block_attention():
        dense = policy.velocity(x, 0.7, cond)
    errors = {"out": (v - ref_v).abs().max().item(), "ref_scale": ref_v.abs().max().item(),
              "masks": len(masks), "ref_masks": len(ref_masks), "vs_dense": (ref_v - dense).abs().max().item(),
              "grads_compared": len(ref_grads), "params": len(list(policy.transformer.parameters()))}  # fmt: skip
    return errors | worst_grad_errors(grads, ref_grads, parallel, relative=True)


def save_nabla_checkpoint(path: Any) -> str:
    """The built-in ``tiny-kandinsky5`` pipeline saved (``save_pretrained``) with NABLA on in its transformer's config,
    as the 10 s checkpoints ship it: ``generate --model PATH`` then runs NABLA (the pipeline passes ``sparse_params``
    for it)."""
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-kandinsky5")
    pipe.transformer.register_to_config(**NABLA)
    pipe.save_pretrained(path)
    return str(path)


def check_all(job: Any) -> dict[str, Any]:
    """One spawned world: the transformer checks, GRPO's policy's, then ``generate`` for ``job`` (a ``GenerateConfig``
    of a NABLA checkpoint on Ulysses 2) with the NABLA masks built and the largest token count the split attention
    computed."""
    from kandinsky_cosmos_checks import generate_counting_tokens

    results = {"transformer": check_nabla_transformer(), "policy": check_nabla_policy()}
    masks: list[torch.Tensor] = []
    with recorded_masks(masks):
        report = generate_counting_tokens([job])[0]
    results["generate"] = {"masks": len(masks), "attention_tokens": report["attention_tokens"]}
    if "out" in report:  # the leader
        results["generate"] |= {"frames": report["frames"], "latents": torch.load(report["latents"])}
    return results
