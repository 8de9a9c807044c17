"""Worker side of group B's pipeline checks: ``generate`` each job, recording how many video tokens the
sequence-parallel attention modules got (so a test sees that the sequence really was split)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit_sp import GenerateConfig, generate, spawn


def generate_recording(jobs: list[GenerateConfig], then: Callable[[], Any] | None = None) -> list[Any]:
    """``generate`` per job; each report gains ``attention_lengths``: the sorted distinct ``hidden_states``
    lengths of the modules whose processor dit-sp made sequence-parallel, and ``attention_batches``: their sorted
    distinct batch sizes (1 on each rank of a CFG-parallel pair: its one branch); and ``vae_rows``: the most rows a VAE
    convolution (a diffusers autoencoder's ``*Conv*`` module, or a torch convolution inside an image VAE's encoder or
    decoder, ``diffusers.models.autoencoders.vae``; not one of one row, as the 1 x 1 ``post_quant_conv``, which runs
    whole beside the split decoder) took on this rank, 0 if none ran (a VAE split by rows takes its own rows and a
    halo); and ``vae_calls``: how many decoder calls of a VAE that is split by calls, not rows, ran on this rank (its
    ``CALL_MARKERS`` module ran). ``then``: a check run after the jobs in the same workers, its result last."""
    reports = []
    image_vae: set[torch.nn.Module] = set()  # the modules of the image VAE parts that ran

    def enter(module, args):
        if type(module).__module__ == "diffusers.models.autoencoders.vae":
            image_vae.update(module.modules())

    for settings in jobs:
        seen: set[int] = set()
        batches: set[int] = set()
        rows = [0]
        calls = [0]

        def record(module, args, kwargs, output, seen=seen, batches=batches, rows=rows, calls=calls):
            if type(getattr(module, "processor", None)).__name__.startswith("SequenceParallel"):
                hidden = args[0] if args else kwargs["hidden_states"]
                seen.add(hidden.shape[1])
                batches.add(hidden.shape[0])
            kind = type(module)
            calls[0] += kind.__name__ in CALL_MARKERS
            in_vae = kind.__module__.startswith("diffusers.models.autoencoders") or module in image_vae
            if in_vae and "Conv" in kind.__name__ and args:
                kernel = getattr(module, "kernel_size", ())  # a wrapper without one (HunyuanVideo-1.5's) counts
                if len(kernel) < 2 or kernel[-2] > 1:
                    rows.append(args[0].shape[-2])

        handles = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
                   torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)]  # fmt: skip
        try:
            report = generate(settings, True)
        finally:
            for handle in handles:
                handle.remove()
        reports.append(report | {"attention_lengths": sorted(seen), "attention_batches": sorted(batches),
                                 "vae_rows": max(rows), "vae_calls": calls[0]})  # fmt: skip
    return reports if then is None else [*reports, then()]


CALL_MARKERS = ("MiniMaxH3VideoRotaryPosEmbed",)
"""Modules that run once per call of a VAE decoder whose calls (clips, tiles) are shared out whole (MiniMax-H3's ViT
decoder's rotary embedding): in a shared call that another rank ran, they do not run."""


def layout_reports(jobs: list[tuple[object, GenerateConfig]], then: Callable[[], Any] | None = None) -> dict:
    """Each ``(key, settings)`` job run on 2 workers (one spawn for all): per key, the report of the one rank
    that wrote the output, with every rank's attention lengths under ``"lengths"`` (and batch sizes under
    ``"batches"``), its ``vae_calls`` under
    ``"vae_calls"`` and its step cache's report (None without one) under ``"caches"``; with ``then`` (a module-level
    check run after the jobs in the same workers), its result on each rank under ``"then"``."""
    by_rank = spawn(generate_recording, 2, args=([settings for _, settings in jobs], then), timeout=300)
    reports = {}
    for i, (key, _) in enumerate(jobs):
        leaders = [rank_reports[i] for rank_reports in by_rank if "out" in rank_reports[i]]
        assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
        reports[key] = leaders[0] | {
            "lengths": [rank_reports[i]["attention_lengths"] for rank_reports in by_rank],
            "batches": [rank_reports[i]["attention_batches"] for rank_reports in by_rank],
            "vae_calls": [rank_reports[i]["vae_calls"] for rank_reports in by_rank],
            "caches": [rank_reports[i].get("cache") for rank_reports in by_rank],
        }
    if then is not None:
        reports["then"] = [rank_reports[-1] for rank_reports in by_rank]
    return reports


def variant_settings(tmp: Path, model: str, name: str, inputs: dict[str, Any], base: dict[str, Any],
                     **flags: Any) -> GenerateConfig:  # fmt: skip
    """A matrix run's settings: ``model`` with the ``base`` settings, its ``inputs`` (a value under a file setting,
    ``FILE_SETTINGS``, is a file in ``tmp``) and the layout's ``flags``, writing ``tmp/{model}-{name}.mp4`` and its
    latents beside it."""
    inputs = {key: str(tmp / value) if key in FILE_SETTINGS else value for key, value in inputs.items()}
    return GenerateConfig.load(overrides={"model": model, "out": str(tmp / f"{model}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{name}.pt"), **base, **inputs,
                                          **flags})  # fmt: skip


FILE_SETTINGS = ("video", "image", "last_image", "control_video")
"""The settings that name an input file (in the test's directory)."""


def assert_same_video(report: dict, reference: dict, frame_tolerance: float = 1e-4, frame_scale: Any = 1.0) -> None:
    """A layout's video against one process's: its frames within ``frame_tolerance`` (relative to ``frame_scale``:
    HDR's linear light), its saved latents within 1e-4, and a real video, not a constant."""
    assert report["frames"].shape == reference["frames"].shape
    difference = np.abs(report["frames"] - reference["frames"]) / frame_scale
    assert difference.max() <= frame_tolerance
    assert (difference > 1e-4).mean() < 0.01  # (Cosmos' uint8 frames) only values at an 8-bit step's edge
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01  # a real video, not a constant


def write_random_inputs(tmp: Path, clip_frames: int, clip_size: tuple[int, int]) -> None:
    """The matrices' input files, of random pixels (seed 0): ``tmp/image.png`` (40 x 30) and ``tmp/clip/``, a video
    of ``clip_frames`` PNG frames of ``clip_size`` (height, width)."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8")).save(tmp / "image.png")
    (tmp / "clip").mkdir()
    for i in range(clip_frames):
        Image.fromarray((rng.rand(*clip_size, 3) * 255).astype("uint8")).save(tmp / "clip" / f"{i:02d}.png")
