"""Batches of prompts with one loaded model: the prompts file (``read_batch``), the output directory and its
``manifest.jsonl`` (what a re-run skips), and ``generate_batch``."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError
from dit_sp.inference.checks import check_before_loading, guidance_arguments
from dit_sp.inference.config import GenerateConfig
from dit_sp.io.prompts import prompt_entries
from dit_sp.io.schema import from_mapping
from dit_sp.io.video import check_output, check_writable, save_video

PER_PROMPT = (
    "prompt",
    "seed",
    "negative_prompt",
    "frames",
    "height",
    "width",
    "steps",
    "guidance",
    "image",
    "last_image",
)
"""Settings a line of a ``prompts`` file may give for its own video."""


def read_batch(config: GenerateConfig) -> list[GenerateConfig]:
    """The videos of ``config.prompts``: a .txt (one prompt per line; seeds ``seed + index``) or a .jsonl
    (``{"prompt": ..., "seed": ..., "frames": ...}`` per line, any of ``PER_PROMPT``), each checked."""
    path, entries = prompt_entries(
        config.prompts, f"--prompts {config.prompts}: no such file (a .txt, one prompt per line, or a .jsonl)"
    )
    base = dataclasses.asdict(config) | {"prompts": None, "save_latents": None}
    videos = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "prompt" not in entry or set(entry) - set(PER_PROMPT):
            raise ConfigError(f"{path}:{index + 1}: expected a JSON object with a 'prompt' and any of {PER_PROMPT}")
        entry = {"seed": config.seed + index} | entry
        for key in ("image", "last_image"):  # relative to the prompts file
            if isinstance(entry.get(key), str):
                entry[key] = str(path.parent / entry[key])
        videos.append(from_mapping(GenerateConfig, base | entry, where=f"{path}:{index + 1}"))
    if not videos:
        raise ConfigError(f"--prompts {config.prompts} holds no prompts")
    if any(video.image for video in videos) and not all(video.image for video in videos):
        raise ConfigError(f"--prompts {config.prompts}: some lines give an 'image' and some do not; one model runs "
                          "the whole batch: give every line an image (image-to-video) or none")  # fmt: skip
    return videos


def batch_layout(config: GenerateConfig) -> tuple[Path, str]:
    """The directory and the video format of a batch: ``--out outputs/video.mp4`` writes
    ``outputs/video/00000.mp4``, ``00001.mp4``, ... and ``outputs/video/manifest.jsonl``."""
    out = Path(config.out)
    return (out.with_suffix(""), out.suffix or ".mp4")


def _done(directory: Path) -> dict[int, dict]:
    """Manifest entries whose video is there: what a re-run skips."""
    manifest = directory / "manifest.jsonl"
    done = {}
    if manifest.exists():
        for line in manifest.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn last line: that video is redone
            if (directory / entry["path"]).is_file():
                done[entry["index"]] = entry
    return done


def _manifest_entry(index: int, video: GenerateConfig, name: str) -> dict:
    return {"index": index, **{key: getattr(video, key) for key in PER_PROMPT}, "model": video.model, "path": name}


def last_new_text(videos: list[GenerateConfig]) -> int | None:
    """The position of the last video whose texts (its prompt, and with guidance its negative prompt, at its
    token count) no earlier video has: once it is encoded, every later video's embeddings are cached."""
    seen: set[tuple[str, int]] = set()
    last = None
    for position, video in enumerate(videos):
        texts = {(video.prompt, video.max_sequence_length), (video.negative_prompt or "", video.max_sequence_length)}
        if not texts <= seen:
            last = position
        seen |= texts
    return last


def generate_batch(config: GenerateConfig, return_frames: bool = False) -> dict[str, Any]:
    """One rank's part of generating every prompt of ``config.prompts`` with one loaded model: prompt ``i``
    goes to data-parallel group ``i % dp``, whose sample leader writes ``DIR/{i:05d}.mp4`` and appends a line
    to ``DIR/manifest.jsonl`` (prompt, seed, settings, path). Videos already in the manifest (and on disk)
    with the same settings are skipped, so a re-run after a crash finishes only the missing ones. A
    prompt's seed is its own (not shifted per dp rank): every layout gives the same video for it.
    Prompts that come again are not encoded again, and the text encoders are freed in the first step of the
    last video with a new prompt (``dit_sp.inference.encoders``; ``free_text_encoders``, ``embedding_cache_mb``).
    With ``config.refine`` the model's stage-2 refiner, loaded once, refines each video's latents with its prompt and
    seed (``dit_sp.inference.refine``); with ``config.save_latents`` (``FILE.pt``) each video's final latents are
    saved as ``FILE_{index:05d}.pt``.
    Returns ``{"layout", "seconds", "videos", "text_encoders"}`` and, on sample leaders, ``"written"`` (paths) and, with
    ``return_frames``, ``"frames"`` by index."""
    import torch.distributed as dist
    from tqdm import tqdm

    from dit_sp.inference.encoders import TextEncoders
    from dit_sp.inference.refine import Refiner
    from dit_sp.inference.session import cache_report, sample, save_latents, setup

    videos = read_batch(config)
    directory, suffix = batch_layout(config)
    check_output(directory / f"00000{suffix}")
    if config.save_latents:
        check_writable(config.save_latents, "--save-latents")
    for video in videos:
        check_before_loading(video)
    parallel, pipe, guidance, cache = setup(config, images=any(video.image for video in videos))
    refiner = Refiner.load(pipe, config, parallel) if config.refine else None  # every rank: it may build groups
    done = _done(directory)
    mine = [i for i in range(len(videos)) if i % parallel.dp == parallel.dp_rank]
    todo = [i for i in mine if done.get(i) != _manifest_entry(i, videos[i], f"{i:05d}{suffix}")]
    if parallel.world_size > 1:
        dist.barrier()  # every rank has read the manifest before any rank writes to it
    encoders = TextEncoders(pipe, int(config.embedding_cache_mb * 2**20))
    last_new = last_new_text([videos[i] for i in todo]) if config.free_text_encoders else None
    start = time.perf_counter()
    report: dict[str, Any] = {"layout": str(parallel.config), "videos": len(todo), "skipped": len(mine) - len(todo)}
    if refiner is not None:
        report["refiner_layout"] = refiner.layout
    written, frames = [], {}
    for position, index in enumerate(
        tqdm(todo, desc="videos", disable=not (parallel.is_sample_leader and parallel.dp_rank == 0))
    ):
        if position == last_new:
            encoders.free_in_first_step(later_prompts_cached=True)
        one = videos[index]
        video = sample(pipe, one, guidance_arguments(pipe, one), one.seed, parallel.device,
                       output_type="latent" if refiner else "np")  # fmt: skip
        if refiner is not None:  # stage 2 on stage 1's latents, with this video's prompt and seed
            refined = refiner(video["frames"], one.prompt, one.seed, one.fps)
            video |= {"frames": refined["frames"], "latents": refined["latents"]}
        if parallel.is_sample_leader:
            name = f"{index:05d}{suffix}"
            written.append(str(save_video(video["frames"], directory / name, fps=one.fps)))
            if config.save_latents:
                path = Path(config.save_latents)
                save_latents(video["latents"], path.with_name(f"{path.stem}_{index:05d}{path.suffix}"))
            with (directory / "manifest.jsonl").open("a") as f:  # one short line per append: no interleaving
                f.write(json.dumps(_manifest_entry(index, videos[index], name)) + "\n")
            if return_frames:
                frames[index] = video["frames"]
    report["seconds"] = time.perf_counter() - start
    report["text_encoders"] = encoders.report()
    if cache is not None:
        report["cache"] = cache_report(cache)
    if parallel.is_sample_leader:
        report["written"] = written
        if return_frames:
            report["frames"] = frames
    return report
