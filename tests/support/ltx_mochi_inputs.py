"""LTX-Video, Mochi, LTX-2 (and later families of the same group): transformer inputs with an odd number of video
tokens (uneven over 2 ranks) and padded text, and the worker that checks them and their pipelines in one spawn."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

TRANSFORMER_MODELS = (
    "tiny-ltx",
    "tiny-ltx-i2v",
    "tiny-ltx-condition",
    "tiny-mochi",
    "tiny-ltx2",
    "tiny-easyanimate",
    "tiny-allegro",
)
"""The tiny transformers checked against one process (each name selects the inputs below)."""

VIDEO_TOKENS = {
    "tiny-ltx": 27,
    "tiny-ltx-i2v": 27,
    "tiny-ltx-condition": 27,
    "tiny-mochi": 9,
    "tiny-ltx2": 27,
    "tiny-easyanimate": 9,
    "tiny-allegro": 9,
}
"""Video tokens of ``ltx_mochi_inputs_of``: what the attention sees whole in one process, and in halves on 2 ranks."""


def _text_mask(batch: int, length: int) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length - 2 :] = 0  # per-sample prompt padding
    return mask


def ltx_mochi_inputs_of(model: str, batch: int = 2) -> dict[str, Any] | None:
    """Forward arguments of the tiny transformer of ``model`` (``None`` for another group's model)."""
    if model not in VIDEO_TOKENS:
        return None
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    steps = torch.tensor([500.0, 20.0][:batch])
    if model in ("tiny-ltx", "tiny-ltx-i2v", "tiny-ltx-condition"):  # 3 latent frames x 3 x 3 tokens, packed (B, S, C)
        inputs = {"hidden_states": rand(batch, 27, 8), "encoder_hidden_states": rand(batch, 7, 16),
                  "timestep": steps, "encoder_attention_mask": _text_mask(batch, 7)}  # fmt: skip
        if model == "tiny-ltx":
            return inputs | {"num_frames": 3, "height": 3, "width": 3, "rope_interpolation_scale": (0.32, 4.0, 4.0)}
        if model == "tiny-ltx-i2v":  # image-to-video: the first frame's 9 tokens are clean (timestep 0)
            per_token = steps[:, None] * (torch.arange(27) >= 9).float()
            return inputs | {"timestep": per_token, "num_frames": 3, "height": 3, "width": 3,
                             "rope_interpolation_scale": (0.32, 4.0, 4.0)}  # fmt: skip
        # the condition pipeline: video_coords (B, 3, S) and, without conditioning, one timestep (B, 1)
        grid = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(3.0), torch.arange(3.0), indexing="ij"))
        coords = (grid.flatten(1) * torch.tensor([[8 / 25], [32.0], [32.0]]))[None].repeat(batch, 1, 1)
        return inputs | {"timestep": steps[:, None], "video_coords": coords}
    if model == "tiny-mochi":  # 3 latent frames of 6 x 2 latents: 3 x 1 patches of 2, 9 tokens; text padded
        return {"hidden_states": rand(batch, 12, 3, 6, 2), "encoder_hidden_states": rand(batch, 7, 16),
                "timestep": steps, "encoder_attention_mask": _text_mask(batch, 7)}  # fmt: skip
    if model == "tiny-ltx2":  # 27 video tokens (split), 5 audio tokens (whole on every rank), text padded
        return {"hidden_states": rand(batch, 27, 4), "audio_hidden_states": rand(batch, 5, 8),
                "encoder_hidden_states": rand(batch, 7, 16), "audio_encoder_hidden_states": rand(batch, 7, 16),
                "timestep": steps, "encoder_attention_mask": _text_mask(batch, 7),
                "audio_encoder_attention_mask": _text_mask(batch, 7), "num_frames": 3, "height": 3, "width": 3,
                "audio_num_frames": 5}  # fmt: skip
    if model == "tiny-easyanimate":  # 3 frames of 6 x 2 latents: 3 x 1 patches of 2, 9 tokens; text in front
        return {
            "hidden_states": rand(batch, 4, 3, 6, 2),
            "timestep": steps,
            "encoder_hidden_states": rand(batch, 7, 16),
        }
    if model == "tiny-allegro":  # 3 frames of 6 x 2 latents: 3 x 1 patches of 2, 9 tokens; rotary tables + positions
        from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

        *tables, t, h, w = get_3d_rotary_pos_embed_allegro(12, ((0, 0), (3, 1)), (3, 1), 3)
        positions = torch.cartesian_prod(t.long(), h.long(), w.long()).T.reshape(3, 1, -1)
        return {"hidden_states": rand(batch, 4, 3, 6, 2), "encoder_hidden_states": rand(batch, 7, 16),
                "timestep": steps, "encoder_attention_mask": _text_mask(batch, 7),
                "image_rotary_emb": (tuple(tables), tuple(positions))}  # fmt: skip
    raise ValueError(model)


MULTI_OUTPUT = {"tiny-ltx2": ("audio_hidden_states", "audio_encoder_hidden_states")}
"""Models with more outputs than the video (LTX-2: the audio), checked by ``check_every_output``, with their further
float inputs whose gradients are compared too."""


def _run_all(model, inputs: dict, leaves_of: tuple[str, ...], grad_scale: float):
    """Every output and the gradients of ``sum(out_i * w_i) * grad_scale`` over all outputs."""
    model.zero_grad(set_to_none=True)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if k in leaves_of}
    outs = model(**(inputs | leaves), return_dict=False)
    g = torch.Generator().manual_seed(3)
    loss = sum((out * torch.randn(out.shape, generator=g)).sum() for out in outs)
    (loss * grad_scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    grads |= {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    return [out.detach() for out in outs], grads


def check_every_output(model_name: str) -> dict[str, float]:
    """Per layout 1x2 / 2x1: the worst error over every output (video gathered, audio whole) and over input and
    parameter gradients (relative above 1) of a loss on all outputs, against one process."""
    import torch.distributed as dist

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    model = build_tiny(model_name, "transformer").float()
    inputs = ltx_mochi_inputs_of(model_name)
    names = ("hidden_states", "encoder_hidden_states", *MULTI_OUTPUT[model_name])
    ref_outs, ref_grads = _run_all(model, inputs, names, 1.0)
    errors = {"ref_scale": min(out.abs().max().item() for out in ref_outs)}
    for layout in ((1, 1, 2), (1, 2, 1)):
        parallel = init_parallel(ParallelConfig(*layout))
        with parallelize(model, parallel):
            outs, grads = _run_all(model, inputs, names, 1.0 / parallel.sp)
        key = "dp{}-r{}-u{}".format(*layout)
        errors[key + ".outputs"] = max((o - r).abs().max().item() for o, r in zip(outs, ref_outs, strict=True))
        worst = 0.0
        for name, ref in ref_grads.items():
            summed = grads[name].clone()
            dist.all_reduce(summed, group=parallel.sp_group)
            worst = max(worst, (summed - ref).abs().max().item() / max(1.0, ref.abs().max().item()))
        errors[key + ".grads"] = worst
    return errors


def check_cfg_every_output(model_name: str) -> float:
    """The guidance batch ``[unconditional, conditional]`` split over cfg=2 (each rank its half, as a pipeline's
    transformer runs under ``parallelize(pipe)``): the worst error over every output (LTX-2: video and audio)."""
    from dit_sp import ParallelConfig, init_parallel
    from dit_sp.families import family_of
    from dit_sp.sp.guidance import GuidancePair
    from dit_sp.sp.handle import Parallelized
    from dit_sp.sp.transformer import parallelize_transformer
    from dit_sp.zoo import build_tiny

    model = build_tiny(model_name, "transformer").float()
    inputs = ltx_mochi_inputs_of(model_name)
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)
        parallel = init_parallel(ParallelConfig(cfg=2))
        handle = Parallelized(model)
        parallelize_transformer(model, parallel, handle, gather_grad="sum", kernel=None, verify=False,
                                guidance=GuidancePair(parallel, family_of(model)))  # fmt: skip
        batches: list[int] = []
        hook = model.proj_in.register_forward_hook(lambda module, args, out: batches.append(out.shape[0]))
        try:
            outs = model(**inputs, return_dict=False)
        finally:
            handle.undo()
            hook.remove()
    assert len(outs) == len(ref) > 1 and batches == [1], batches  # this rank ran one branch of the two
    return max((o - r).abs().max().item() for o, r in zip(outs, ref, strict=True))


def record_local_tokens(seen: list[int]):
    """A global forward hook: the query length of every attention module whose processor dit-sp routed (for a
    pipeline built inside ``generate``; its families have no gathered-key modules)."""

    def hook(module, args, output):
        processor = getattr(module, "processor", None)
        if type(processor).__name__.startswith("SequenceParallel"):
            out = output[0] if isinstance(output, tuple) else output
            seen.append(out.shape[1])

    return torch.nn.modules.module.register_module_forward_hook(hook)


def record_vae_rows(seen: list[int]):
    """A global forward pre-hook: the input height of every convolution of an LTX-Video or LTX-2 VAE
    (``LTXVideoCausalConv3d``, ``LTX2VideoCausalConv3d``), to tell a decode or encode split by rows from a whole one."""

    def hook(module, args):
        if type(module).__name__ in ("LTXVideoCausalConv3d", "LTX2VideoCausalConv3d"):
            seen.append(args[0].shape[-2])

    return torch.nn.modules.module.register_module_forward_pre_hook(hook)


def record_attention_tokens(model: torch.nn.Module, seen: list[int]) -> list:
    """Forward hooks on the family's split attention modules (``attention_modules``, not LTX-2's gathered-key
    ones, whose queries are the whole audio): their query lengths. Returns the hook handles."""
    import fnmatch

    from dit_sp.families import family_of

    def hook(module, args, output):
        seen.append((output[0] if isinstance(output, tuple) else output).shape[1])

    patterns = family_of(model).attention_modules
    return [module.register_forward_hook(hook) for name, module in model.named_modules()
            if any(fnmatch.fnmatchcase(name, p) for p in patterns)]  # fmt: skip


def condition_pipeline_frames(image: str, ulysses: int = 1) -> dict[str, Any]:
    """``tiny-ltx-condition`` with an image at frame 0 (its latents replace the first latent frame) and at frame 8
    (extra conditioning tokens appended to the sequence: 192 + 64 tokens), one process or parallelized on
    ``ulysses`` ranks: ``{"frames", "local_tokens"}``."""
    from PIL import Image

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-ltx-condition")
    if ulysses > 1:
        parallelize(pipe, init_parallel(ParallelConfig(ulysses=ulysses)), verify_inputs=True)
    with Image.open(image) as file:
        picture = file.convert("RGB")
    seen: list[int] = []
    hooks = record_attention_tokens(pipe.transformer, seen)
    out = pipe(image=[picture, picture], video=[None, None], frame_index=[0, 8], prompt="a red circle moving left",
               height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=32,
               generator=torch.Generator().manual_seed(0), output_type="np")  # fmt: skip
    for hook in hooks:
        hook.remove()
    return {"frames": out.frames[0], "local_tokens": sorted(set(seen))}


def check_ltx_mochi(models: tuple[str, ...], jobs: list[Any], image: str | None = None) -> dict[str, Any]:
    """In each of 2 workers: every tiny transformer on 1x2 and 2x1 against one process (``check_transformer``),
    with the query lengths its sequence-parallel attention saw, then each ``generate`` job (a ``GenerateConfig``)
    with the lengths of its run."""
    from model_checks import check_transformer

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    results: dict[str, Any] = {}
    for model in models:
        results[model] = check_transformer(model, [(1, 1, 2), (1, 2, 1)], relative=True)
        transformer = build_tiny(model, "transformer").float()
        seen: list[int] = []
        hooks = record_attention_tokens(transformer, seen)
        with torch.no_grad(), parallelize(transformer, init_parallel(ParallelConfig(ulysses=2))):
            transformer(**ltx_mochi_inputs_of(model), return_dict=False)
        for hook in hooks:
            hook.remove()
        results[model]["local_tokens"] = sorted(set(seen))
        if model in MULTI_OUTPUT:
            results[model]["every_output"] = check_every_output(model)
            results[model]["every_output"]["cfg2"] = check_cfg_every_output(model)
    if image is not None:
        results["condition_frames"] = condition_pipeline_frames(image, ulysses=2)
    from dit_sp import generate

    for i, settings in enumerate(jobs):
        seen, rows = [], []
        handles = [record_local_tokens(seen), record_vae_rows(rows)]
        try:
            report = generate(settings, True)
        finally:
            for handle in handles:
                handle.remove()
        results[f"job{i}"] = report | {"local_tokens": sorted(set(seen)), "vae_rows": min(rows, default=None)}
    results["cpu_seconds"] = time.process_time()  # this worker's CPU time: what the check costs on a quiet machine
    return results


def half(tokens: int) -> int:
    return math.ceil(tokens / 2)
