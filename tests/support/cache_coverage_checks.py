"""The step-cache runs of the cache-enabled pipelines that ``tests/cache/test_family_caches.py`` does not cover
(``tests/cache/test_cache_coverage.py``): their settings, inputs and what each run exercises."""

from __future__ import annotations

from pathlib import Path

import torch
from variant_generate_checks import write_random_inputs

from dit_sp import GenerateConfig

COSMOS_FRAMES = 1 / 255 + 1e-6
"""The Cosmos pipelines return their frames through the safety checker as uint8: a value within float rounding of an
8-bit step may land on either side, so their frames agree within one step (the latents within 1e-4)."""

# model: (the first-block cache's threshold and TeaCache's (None: not run here), each skipping some of the tiny
# model's 4 steps but not all; the pipeline's input files, made in the test's directory; its frame tolerance)
MODELS = {
    # Cosmos-Transfer2.5: its prompts are (text, image context) tuples, one per branch for the run, which name the
    # branch; the ControlNet's residuals are added inside the cached blocks (a skipped step reuses them), and the
    # ControlNet itself runs every step, uncached
    "tiny-cosmos2.5-transfer": (0.05, 0.05, {"control_video": "clip"}, COSMOS_FRAMES),
    "tiny-cosmos1-t2w": (0.6, 0.1, {}, COSMOS_FRAMES),  # Cosmos 1 (EDM) text-to-world, its wavelet VAE split by rows
    "tiny-kandinsky5-i2v": (0.5, 0.3, {"image": "image.png"}, 1e-4),  # the image latents and mask in channels
    "tiny-kandinsky5-t2i": (0.5, 0.3, {}, 1e-4),  # one frame of an image VAE
    "tiny-ltx2": (None, 0.3, {}, 1e-4),  # TeaCache: the video stream's modulated input; both streams' residuals
}
RUNS = [(m, policy) for policy, i in (("first_block", 0), ("teacache", 1)) for m, spec in MODELS.items() if spec[i]]


def write_inputs(tmp: Path) -> None:
    """``tmp/image.png`` and a 9-frame ``tmp/clip/`` (the control video) of random pixels."""
    write_random_inputs(tmp, 9, (32, 32))


def settings(tmp: Path, model: str, policy: str, name: str, **flags) -> GenerateConfig:
    """A 4-step ``generate`` run of ``model`` under ``policy``'s cache at the model's threshold, writing its video and
    latents to ``tmp``."""
    first_block, teacache, files, _ = MODELS[model]
    threshold = first_block if policy == "first_block" else teacache
    inputs = {key: str(tmp / value) for key, value in files.items()}
    return GenerateConfig.load(overrides={"model": model, "out": str(tmp / f"{model}-{policy}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{policy}-{name}.pt"), **inputs,
                                          "steps": 4, "cache": f"{policy}:{threshold}", **flags})  # fmt: skip


@torch.no_grad()
def branch_prompt_embeds(model: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The Qwen2.5-VL text embeddings ``(1, S, C)`` a Kandinsky 5 tiny pipeline gives its conditional and its
    unconditional branch under ``generate``'s defaults (its prompt, an empty negative prompt, the model's
    ``max_sequence_length``)."""
    from dit_sp.zoo import build_tiny

    config = GenerateConfig.load(overrides={"model": model})
    pipe = build_tiny(model)
    return tuple(pipe.encode_prompt(prompt=[text], max_sequence_length=config.max_sequence_length,
                                    device=torch.device("cpu"))[0]
                 for text in (config.prompt, config.negative_prompt))  # fmt: skip
