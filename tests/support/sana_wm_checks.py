"""Worker side of the Sana-WM checks: the tiny transformer (``tiny-sana-wm``) parallelized against one process,
forward and backward, recording the local token counts its attention branches were called with (the sequence really
is split) and the refusals that need a 2-process world."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.zoo import build_tiny

TOKENS_PER_FRAME = 6
"""Latents of 2 x 3 (patch 1 x 1 x 1)."""


def sana_wm_inputs(batch: int = 2, frames: int = 5, seed: int = 7) -> dict[str, Any]:
    """Latents ``(B, 4, F, 2, 3)``, per-frame timesteps ``(B, 1, F)`` (the first frame clean, as the pipeline
    conditions it), padded text ``(B, 1, 6, 16)`` (4 and 6 real tokens), camera conditions ``(B, F, 20)`` (poses
    moving along a path, pinhole intrinsics) and Plucker embeddings ``(B, 24, F, 2, 3)``; ``seed``: a dp replica's
    (``dp_seed``)."""
    g = torch.Generator().manual_seed(seed)
    c2w = torch.eye(4).repeat(batch, frames, 1, 1)
    c2w[..., :3, 3] = torch.randn(batch, frames, 3, generator=g).cumsum(1) * 0.3
    intrinsics = torch.tensor([3.0, 3.0, 1.5, 1.0]).expand(batch, frames, 4)
    timestep = torch.rand(batch, 1, frames, generator=g) * 1000
    timestep[:, :, 0] = 0
    mask = torch.ones(batch, 6, dtype=torch.long)
    mask[0, 4:] = 0
    return {"hidden_states": torch.randn(batch, 4, frames, 2, 3, generator=g), "timestep": timestep,
            "encoder_hidden_states": torch.randn(batch, 1, 6, 16, generator=g), "encoder_attention_mask": mask,
            "camera_conditions": torch.cat([c2w.flatten(2), intrinsics], -1),
            "chunk_plucker": torch.randn(batch, 24, frames, 2, 3, generator=g)}  # fmt: skip


def build(**config: Any) -> torch.nn.Module:
    """``tiny-sana-wm``'s transformer (or one of another config), its zero-initialised weights (the short
    convolutions, the Plucker embedding) drawn: zeros would hide a wrong split of what they multiply."""
    if config:
        import diffusers

        spec = build_tiny("tiny-sana-wm", "transformer").config
        torch.manual_seed(0)
        model = diffusers.SanaWMTransformer3DModel(**(dict(spec) | config))
    else:
        model = build_tiny("tiny-sana-wm", "transformer")
    model = model.float()
    with torch.no_grad():
        for param in model.parameters():
            if bool((param == 0).all()):
                param.normal_(0, 0.2)
    return model


BRANCHES = ("SanaWMBidirectionalGDNAttention", "SanaWMBidirectionalGDNCamAttention", "SanaWMSoftmaxAttention",
            "SanaWMSoftmaxCamAttention")  # fmt: skip


def _record_branch_tokens(model: torch.nn.Module, seen: dict[str, set[int]]) -> list[Any]:
    """Record the token count of every call of the attention branches (their queries ``(B, N, H, D)``)."""
    handles = []
    for module in model.modules():
        name = type(module).__name__
        if name in BRANCHES:
            hook = lambda m, args, name=name: seen.setdefault(name, set()).add(args[0].shape[1])
            handles.append(module.register_forward_pre_hook(hook))
    return handles


CASES = {"5frames": {"frames": 5}, "6frames-raymap": {"frames": 6, "config": {"use_chunk_plucker_post_attn": False}}}
"""5 latent frames over 2 ranks: 3 a rank, the last one padded; without the Plucker embedding the model adds the
camera's ray-map embedding to the tokens instead (whole on every rank, this rank's frames cut out)."""


def _record_whole_calls(seen: dict[str, set[tuple[int, int]]]) -> list[Any]:
    """Record ``(tokens, heads)`` of every call of the branches' stock ``forward`` (their class's, which the split
    runs over the whole sequence of a rank's head group); returns the ``(class, forward)`` pairs to put back."""
    import diffusers.models.transformers.transformer_sana_wm as sana_wm

    originals = []
    for name in BRANCHES:
        cls = getattr(sana_wm, name)
        original = cls.forward

        def forward(self, query, *args, original=original, name=name, **kwargs):
            seen.setdefault(name, set()).add(tuple(query.shape[1:3]))
            return original(self, query, *args, **kwargs)

        cls.forward = forward
        originals.append((cls, original))
    return originals


def _case_inputs(spec: dict[str, Any], seed: int) -> dict[str, Any]:
    kwargs = sana_wm_inputs(frames=spec["frames"], seed=seed)
    if not spec.get("config", {}).get("use_chunk_plucker_post_attn", True):
        kwargs.pop("chunk_plucker")
    return kwargs


@contextlib.contextmanager
def fp32_softmax() -> Iterator[None]:
    """Sana-WM's softmax branches cast fp32 queries, keys and values to bf16 for SDPA (diffusers, for flash kernels):
    the one-process gradients then move by 4e-5 with the thread count alone, and bf16's rounding turns a split's
    fp32 reorderings (1e-7) into steps of 1e-5. Both runs of the comparison keep them fp32 (``Tensor.bfloat16`` a
    no-op on fp32 tensors while inside)."""
    cast = torch.Tensor.bfloat16

    def keep(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if self.dtype == torch.float32 else cast(self, *args, **kwargs)

    with mock.patch.object(torch.Tensor, "bfloat16", keep):
        yield


def check_sana_wm(
    layouts: list[tuple[int, int, int]], cases: dict[str, dict] | None = None, refusals: bool = True
) -> dict[str, Any]:
    """Per case (default ``CASES``) and layout: max abs errors of the output and of every input and parameter
    gradient (summed over the SP group) against one process on this dp replica's inputs (``"seed"``), the branches'
    token counts and whether ``unparallelize`` restores bit-identical outputs, or the layout's one-line refusal at
    ``parallelize``; then (``refusals``, a 2-process world) the refusals."""
    import torch.distributed as dist

    results: dict[str, Any] = {}
    for case, spec in (CASES if cases is None else cases).items():
        model = build(**spec.get("config", {}))
        references = {7: _run_any(model, _case_inputs(spec, 7), 1.0)}
        for dp, ring, ulysses in layouts:
            parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
            seed = parallel.dp_seed(7)
            kwargs = _case_inputs(spec, seed)
            if seed not in references:  # one process on this replica's inputs (the model not split yet)
                references[seed] = _run_any(model, kwargs, 1.0)
            ref_out, ref_grads = references[seed]
            try:
                split = parallelize(model, parallel, verify_inputs=True)
            except NotImplementedError as error:
                results[f"{case}/dp{dp}-r{ring}-u{ulysses}"] = str(error)
                continue
            seen: dict[str, set[int]] = {}
            whole: dict[str, set[tuple[int, int]]] = {}
            handles = _record_branch_tokens(model, seen)
            originals = _record_whole_calls(whole)
            try:
                with split:
                    out, grads = _run_any(model, kwargs, 1.0 / parallel.sp)  # each rank's share of the one loss
            finally:
                for h in handles:
                    h.remove()
                for cls, original in originals:
                    cls.forward = original
            worst, where, relative = 0.0, "", (0.0, "")
            for name, ref in ref_grads.items():
                summed = grads[name].clone()
                dist.all_reduce(summed, group=parallel.sp_group)
                if (error := (summed - ref).abs().max().item()) > worst:
                    worst, where = error, name
                # fp32 rounds a gradient of 50 (the final layer's) in steps of 4e-6: above 1, relative to its size
                relative = max(relative, (error / max(1.0, ref.abs().max().item()), name))
            restored, _ = _run_any(model, kwargs, 1.0)
            results[f"{case}/dp{dp}-r{ring}-u{ulysses}"] = {
                "out": (out - ref_out).abs().max().item(), "grads": worst, "grads_worst": where,
                "grads_relative": relative[0], "grads_relative_worst": relative[1],
                "grad_count": len(grads), "ref_grad_count": len(ref_grads), "ref_scale": ref_out.abs().max().item(),
                "branch_tokens": {k: sorted(v) for k, v in seen.items()},
                "whole_calls": {k: sorted(v) for k, v in whole.items()},
                "restored_bit_identical": torch.equal(restored, ref_out), "seed": seed,
            }  # fmt: skip
    if refusals:
        results["refusals"] = _refusals()
    return results


def _run_any(model: torch.nn.Module, kwargs: dict, scale: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    names = [k for k in ("hidden_states", "encoder_hidden_states", "chunk_plucker") if k in kwargs]
    leaves = {k: kwargs[k].clone().requires_grad_() for k in names}
    out = model(**(kwargs | leaves), return_dict=False)[0]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    ((out * weight).sum() * scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    return out.detach(), grads | {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}


def _refusals() -> dict[str, str]:
    """The one-line errors of what the 2-process world cannot split exactly: a ring, too few frames a rank for the
    short convolution, a frame mask."""
    messages = {}
    model = build()
    ring = init_parallel(ParallelConfig(ring=2))
    try:
        parallelize(model, ring)
    except NotImplementedError as e:
        messages["ring"] = str(e)
    ulysses = init_parallel(ParallelConfig(ulysses=2))
    with torch.no_grad(), parallelize(model, ulysses):
        for name, change in (("frames", {"frames": 3}), ("frame_valid_mask", {})):
            kwargs = sana_wm_inputs(frames=change.get("frames", 5))
            if name == "frame_valid_mask":
                kwargs["frame_valid_mask"] = torch.ones(2, 5)
            try:
                model(**kwargs)
            except (ValueError, NotImplementedError) as e:
                messages[name] = str(e)
    return messages


def run_sana_wm(layouts: list[tuple[int, int, int]], jobs: list[Any]) -> dict[str, Any]:
    """One spawned world: the transformer checks, the stage-2 refiner's (``check_refiner``), then ``generate`` for
    each job (a ``GenerateConfig``), with the token counts the attention branches were called with."""
    from sana_wm_refiner_checks import check_refiner

    from dit_sp import generate

    with fp32_softmax():  # the transformer check in fp32 throughout (the pipelines below run as they are)
        results = check_sana_wm(layouts)
    results["refiner"] = check_refiner()  # the stage-2 refiner: its attention is fp32 as it is
    results["videos"] = []
    for settings in jobs:
        seen: dict[str, set[int]] = {}

        def record(module, args, seen=seen):
            if type(module).__name__ in BRANCHES:
                seen.setdefault(type(module).__name__, set()).add(args[0].shape[1])

        handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
        try:
            report = generate(settings, True)
        finally:
            handle.remove()
        results["videos"].append(report | {"branch_tokens": {k: sorted(v) for k, v in seen.items()}})
    return results
