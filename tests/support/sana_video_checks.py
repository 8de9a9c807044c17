"""Worker side of the Sana-Video checks: the split collectives (all-reduce, halo) against one process, the
parallelized tiny transformer forward and backward against the stock one, and ``generate`` per job; each recording
how many tokens the linear attention saw (so a test sees that the sequence really was split)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dit_sp import ParallelConfig, init_parallel, parallelize

CONFIG = {"in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 12, "num_layers": 2,
          "num_cross_attention_heads": 2, "cross_attention_head_dim": 8, "cross_attention_dim": 24,
          "caption_channels": 16, "patch_size": (1, 2, 2), "mlp_ratio": 2.0}  # fmt: skip
"""A tiny ``SanaVideoTransformer3DModel`` (head dim 12: the rotary table splits it into frame, row and column parts)."""

CASES = {"t2v-3frames": (3, False), "i2v-4frames": (4, True), "t2v-1frame": (1, False)}
"""Input cases: latent frames and whether the timestep is per token (the image-to-video pipeline's, first frame
clean). 3 frames over 2 ranks: the last rank holds one padded frame; 1 frame: one rank holds only padding."""


def build() -> torch.nn.Module:
    import diffusers

    torch.manual_seed(0)
    model = diffusers.SanaVideoTransformer3DModel(**CONFIG).float()
    with torch.no_grad():  # zero-initialised weights would hide a wrong split of what they multiply
        for param in model.parameters():
            if bool((param == 0).all()):
                param.normal_(0, 0.1)
    return model


def inputs(frames: int, per_token: bool) -> dict[str, torch.Tensor]:
    """Latents ``(2, 4, frames, 4, 6)`` (6 tokens a frame after the 2x2 patch), padded text (4 and 6 real tokens)."""
    g = torch.Generator().manual_seed(7)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 4:] = 0
    timestep = torch.tensor([500.0, 20.0])
    if per_token:  # the image-to-video pipeline's (B, 1, F, H', W'), 0 on the first (conditioning) frame
        clean = torch.zeros(2, 1, frames, 2, 3)
        clean[:, :, 0] = 1
        timestep = timestep.view(2, 1, 1, 1, 1) * (1 - clean)
    return {"hidden_states": torch.randn(2, 4, frames, 4, 6, generator=g), "timestep": timestep,
            "encoder_hidden_states": torch.randn(2, 6, 16, generator=g), "encoder_attention_mask": mask}  # fmt: skip


def builtin_inputs(batch: int = 2) -> dict[str, torch.Tensor]:
    """Inputs of the built-in ``tiny-sana-video`` transformer: 3 latent frames of 4 x 8 (24 tokens), 8 text states."""
    g = torch.Generator().manual_seed(7)
    return {"hidden_states": torch.randn(batch, 4, 3, 4, 8, generator=g),
            "timestep": torch.tensor([500.0, 20.0][:batch]),
            "encoder_hidden_states": torch.randn(batch, 8, 16, generator=g)}  # fmt: skip


def _run(model: torch.nn.Module, kwargs: dict, scale: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    leaves = {k: kwargs[k].clone().requires_grad_() for k in ("hidden_states", "encoder_hidden_states")}
    out = model(**(kwargs | leaves), return_dict=False)[0]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    ((out * weight).sum() * scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    return out.detach(), grads | {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}


def _record_attention_tokens(seen: set[int]) -> Any:
    """Record the token count of every call of a module whose processor dit-sp made sequence-parallel."""

    def record(module, args, kwargs, output):
        if type(getattr(module, "processor", None)).__name__.startswith("SequenceParallel"):
            seen.add((args[0] if args else kwargs["hidden_states"]).shape[1])

    return torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)


def check_transformer(layouts: list[tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """Per case and layout: max abs errors of the output and of the input and parameter gradients (summed over
    the SP group) against one process, the linear attention's token counts and whether ``unparallelize``
    restores bit-identical outputs."""
    model = build()
    results = {}
    for case, (frames, per_token) in CASES.items():
        kwargs = inputs(frames, per_token)
        ref_out, ref_grads = _run(model, kwargs, 1.0)
        for dp, ring, ulysses in layouts:
            parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
            seen: set[int] = set()
            handle = _record_attention_tokens(seen)
            try:
                with parallelize(model, parallel, verify_inputs=True):
                    out, grads = _run(model, kwargs, 1.0 / parallel.sp)  # each rank's share of the one loss
            finally:
                handle.remove()
            worst = 0.0
            for name, ref in ref_grads.items():
                summed = grads[name].clone()
                dist.all_reduce(summed, group=parallel.sp_group)
                worst = max(worst, (summed - ref).abs().max().item())
            restored, _ = _run(model, kwargs, 1.0)
            results[f"{case}/dp{dp}-r{ring}-u{ulysses}"] = {
                "out": (out - ref_out).abs().max().item(), "grads": worst, "grad_count": len(grads),
                "ref_grad_count": len(ref_grads), "ref_scale": ref_out.abs().max().item(),
                "attention_tokens": sorted(seen), "restored_bit_identical": torch.equal(restored, ref_out),
            }  # fmt: skip
    return results


def check_collectives() -> dict[str, float]:
    """``all_reduce_sum`` and ``halo`` on the 2-rank world against one process, forward and backward: each rank
    holds 3 of 6 positions of a sequence; the whole sequence's results are rebuilt by all-gathering."""
    from dit_sp.parallel.comm import all_reduce_sum, halo

    parallel = init_parallel(ParallelConfig(ulysses=2))
    group, rank = parallel.sp_group, parallel.sp_rank
    g = torch.Generator().manual_seed(1)
    whole, weight = torch.randn(2, 6, 5, generator=g), torch.randn(2, 8, 5, generator=g)
    errors = {}
    # halo: [previous rank's last, own 3, next rank's first] = rows of the whole zero-padded sequence
    padded = torch.nn.functional.pad(whole, [0, 0, 1, 1]).requires_grad_()
    mine = whole[:, 3 * rank : 3 * rank + 3].clone().requires_grad_()
    out = halo(mine, group, dim=1, width=1)
    ref = padded[:, 3 * rank : 3 * rank + 5]
    errors["halo"] = (out - ref).abs().max().item()
    (out * weight[:, 3 * rank : 3 * rank + 5]).sum().backward()
    # one process: both ranks' windows of the padded sequence (they overlap where a halo was sent)
    sum((padded[:, 3 * q : 3 * q + 5] * weight[:, 3 * q : 3 * q + 5]).sum() for q in range(2)).backward()
    errors["halo_backward"] = (mine.grad - padded.grad[:, 1 + 3 * rank : 4 + 3 * rank]).abs().max().item()
    # all-reduce: every rank's copy of the total counts once in the loss; the adjoint sums the copies' gradients
    part = whole[:, 3 * rank : 3 * rank + 3].clone().requires_grad_()
    total = all_reduce_sum(part.sum(1), group)
    errors["all_reduce"] = (total - whole.sum(1)).abs().max().item()
    (total * weight[:, rank]).sum().backward()
    expected = (weight[:, 0] + weight[:, 1])[:, None].expand_as(part)
    errors["all_reduce_backward"] = (part.grad - expected).abs().max().item()
    return errors


def run_sana_matrix(layouts: list[tuple[int, int, int]], jobs: list[Any]) -> dict[str, Any]:
    """One spawned world: the collectives, the transformer checks, then ``generate`` for each job (a
    ``GenerateConfig``) with the linear attention's token counts."""
    from dit_sp import generate

    results: dict[str, Any] = {"collectives": check_collectives(), "transformer": check_transformer(layouts)}
    results["videos"] = []
    for settings in jobs:
        seen: set[int] = set()
        handle = _record_attention_tokens(seen)
        try:
            report = generate(settings, True)
        finally:
            handle.remove()
        results["videos"].append(report | {"attention_tokens": sorted(seen)})
    return results
