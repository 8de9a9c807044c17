"""Worker-side checks of parallelized tiny transformers against the single-process model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from ltx_mochi_inputs import ltx_mochi_inputs_of, record_attention_tokens

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.zoo import build_tiny


def model_inputs(family: str, batch: int = 2) -> dict:
    """Inputs of the tiny transformers; 18 video tokens (uneven over 4 ranks) and padded text."""
    from variant_inputs import variant_inputs_of

    if (inputs := variant_inputs_of(family, batch)) is not None:
        return inputs
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    if family == "tiny-wan":
        return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 8, 16)}  # fmt: skip
    if family == "tiny-hunyuanvideo":
        mask = torch.ones(batch, 7, dtype=torch.long)
        mask[0, 5:] = 0  # per-sample prompt padding: 5 and 7 real text tokens
        return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": torch.tensor([500, 20][:batch]),
                "encoder_hidden_states": rand(batch, 7, 16), "encoder_attention_mask": mask,
                "pooled_projections": rand(batch, 8)}  # fmt: skip
    if family == "tiny-cogvideox":
        from diffusers.models.embeddings import get_3d_rotary_pos_embed

        rope = get_3d_rotary_pos_embed(16, ((0, 0), (3, 2)), grid_size=(3, 2), temporal_size=3)
        return {"hidden_states": rand(batch, 3, 4, 6, 4), "timestep": torch.tensor([500, 20][:batch]),
                "encoder_hidden_states": rand(batch, 8, 16), "image_rotary_emb": rope}  # fmt: skip
    if family == "tiny-cosmos3":  # one packed sequence, no batch: 7 prompt tokens, 27 video tokens
        from cosmos3_checks import transformer_inputs

        return transformer_inputs()
    if family == "tiny-anyflow-far":  # training mode: the block mask, compressed and clean context frames
        from anyflow_far_checks import train_inputs

        return train_inputs()
    if family == "tiny-consisid":
        from consisid_checks import consisid_inputs

        return consisid_inputs(batch)
    if family == "tiny-kandinsky6":  # video (27 tokens, an image frame appended) and audio
        from kandinsky6_checks import kandinsky6_inputs

        return kandinsky6_inputs(batch)
    if family == "tiny-wan-animate-2":  # the reference-extraction call, filling a fresh key/value cache
        from animate2_checks import extract_inputs

        return extract_inputs(batch)
    if family == "tiny-kandinsky6-sr":  # 384 tokens (6 NABLA blocks of 64), 3 heads
        from kandinsky6_sr_checks import sr_inputs

        return sr_inputs(batch)
    if family == "tiny-sana-wm":  # 5 latent frames of 2 x 3, camera conditions, Plucker embeddings
        from sana_wm_checks import sana_wm_inputs

        return sana_wm_inputs(batch)
    if family.startswith("tiny-sana-video"):
        from sana_video_checks import builtin_inputs

        return builtin_inputs(batch)
    inputs = ltx_mochi_inputs_of(family, batch)  # LTX-Video, Mochi, LTX-2, ...: tests/support/ltx_mochi_inputs.py
    if inputs is not None:
        return inputs
    raise ValueError(family)


def outputs_and_grads(model, inputs: dict, grad_scale: float):
    """Output and gradients of ``sum(out * w) * grad_scale`` w.r.t. float inputs and parameters."""
    model.zero_grad(set_to_none=True)
    leaves = {
        k: v.clone().requires_grad_() for k, v in inputs.items() if k in ("hidden_states", "encoder_hidden_states")
    }
    out = model(**(inputs | leaves), return_dict=False)[0]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    ((out * weight).sum() * grad_scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    grads |= {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def worst_grad_errors(grads: dict, ref_grads: dict, parallel, relative: bool = False) -> dict[str, Any]:
    """The largest error of the input and of the parameter gradients (``"input.*"``, ``"param.*"``), each summed
    over the SP group (the ranks' partials) against one process's, and the name of the worst: ``input_grads``,
    ``input_grads_worst``, ``param_grads``, ``param_grads_worst``. ``relative``: relative to the gradient's scale
    above 1 (a patch embedding sums over every token)."""
    worst = {"input": (0.0, ""), "param": (0.0, "")}
    for name, ref in ref_grads.items():
        summed = grads[name].clone()
        dist.all_reduce(summed, group=parallel.sp_group)
        scale = max(1.0, ref.abs().max().item()) if relative else 1.0
        kind = name.split(".", 1)[0]
        worst[kind] = max(worst[kind], ((summed - ref).abs().max().item() / scale, name))
    return {"input_grads": worst["input"][0], "input_grads_worst": worst["input"][1],
            "param_grads": worst["param"][0], "param_grads_worst": worst["param"][1]}  # fmt: skip


def check_transformer(
    family: str,
    layouts: list[tuple[int, int, int]],
    relative: bool = False,
    setup: Callable[[torch.nn.Module], None] | None = None,
    inputs: dict | None = None,
) -> dict[str, dict]:
    """Per layout: max abs errors of output, input grads and parameter grads vs. one process, whether
    unparallelize restores bit-identical outputs, and ``local_tokens``: the sorted distinct query lengths the
    family's split attention modules saw on this rank (``record_attention_tokens``: ceil(S / sp) when the sequence
    really is split). ``relative``: a gradient's error is divided by its
    magnitude where that is above 1 (fp32 rounds a gradient of 172, Mochi's RoPE frequencies, in steps of 1.5e-5).
    ``setup``: configures the built model (as a pipeline would); ``inputs``: instead of ``model_inputs``."""
    model = build_tiny(family, "transformer").float()
    if setup is not None:
        setup(model)
    inputs = model_inputs(family) if inputs is None else inputs
    ref_out, ref_grads = outputs_and_grads(model, inputs, 1.0)
    results = {}
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        errors = {}
        seen: list[int] = []
        hooks = record_attention_tokens(model, seen)
        with parallelize(model, parallel, verify_inputs=True):
            # Every rank computes the same loss from the gathered output: with the exact-adjoint gather,
            # each rank's share is 1/sp of it and summing the partial gradients over SP gives the total.
            out, grads = outputs_and_grads(model, inputs, 1.0 / parallel.sp)
        for hook in hooks:
            hook.remove()
        errors["local_tokens"] = sorted(set(seen))
        errors["out"] = (out - ref_out).abs().max().item()
        errors |= worst_grad_errors(grads, ref_grads, parallel, relative)
        restored, _ = outputs_and_grads(model, inputs, 1.0)
        errors["restored_bit_identical"] = float(torch.equal(restored, ref_out))
        errors["ref_scale"] = ref_out.abs().max().item()
        results[f"dp{dp}-r{ring}-u{ulysses}"] = errors
    return results
