"""A served text-to-video checkpoint that is an image-to-video model too (``ModelFamily.image_to_video``; a saved tiny
SANA-Video, as SANA-Video 2B ships): the server's worker loads it once and builds its image-to-video view on the same
modules (``setup_with_image_view``), then runs each job as the worker does (``dit_sp.server.workers.run_job``), in
this process: a job with an image equals ``generate --image``, one without equals plain text-to-video (frames within
1e-4), no weight is held twice, and the progress callback and the cancel point work on the view; a request's LoRA,
loaded through the text pipeline, runs on the view (a saved tiny Wan 2.2 TI2V). The same on two
processes, through HTTP: ``tests/server/test_video_server_layouts.py`` (ring 2); the image-to-video class on every
layout against one process: ``tests/inference/test_image_to_video.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from dit_sp import GenerateConfig, generate
from dit_sp.server.workers import Cancelled, run_job
from dit_sp.zoo import build_tiny

pytestmark = pytest.mark.slow  # loads models and samples videos
TOL = 1e-4


def _tensors(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    return {t.data_ptr(): t for t in [*module.parameters(), *module.buffers()] if t.numel()}


def test_a_job_with_an_image_runs_on_the_image_to_video_view_of_the_same_modules(tmp_path):
    from dit_sp.inference.session import setup_with_image_view

    build_tiny("tiny-sana-video").save_pretrained(tmp_path / "sana")  # saved as SanaVideoPipeline
    pixels = np.random.RandomState(0).rand(40, 30, 3)  # another size than the video's: resized
    Image.fromarray((pixels * 255).astype("uint8")).save(tmp_path / "first.png")
    base = GenerateConfig.load(overrides={"model": "tiny-sana-video", "steps": 2, "frames": 5, "seed": 3})
    base = dataclasses.replace(base, model=str(tmp_path / "sana"))
    jobs = {"image": dataclasses.replace(base, prompt="a red circle rolls", image=str(tmp_path / "first.png")),
            "text": dataclasses.replace(base, prompt="a blue square", seed=4)}  # fmt: skip
    expected = {name: generate(dataclasses.replace(job, out=str(tmp_path / f"{name}.mp4")), True)["frames"]
                for name, job in jobs.items()}  # fmt: skip

    parallel, pipe, view = setup_with_image_view(base)
    assert (type(pipe).__name__, type(view).__name__) == ("SanaVideoPipeline", "SanaImageToVideoPipeline")
    modules = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    assert modules.keys() == {"transformer", "vae", "text_encoder"}
    for name, module in modules.items():  # the very modules: not copies
        assert view.components[name] is module, name
    tensors = {n: _tensors(m) for n, m in modules.items()}
    for name, module in view.components.items():
        if isinstance(module, torch.nn.Module):  # each weight's storage is the text pipeline's
            assert _tensors(module).keys() == tensors[name].keys(), name
    # the weights the view reaches, the text pipeline's alone (its scheduler and tokenizer are the same objects too)
    assert all(view.components[n] is pipe.components[n] for n in ("scheduler", "tokenizer"))

    steps: dict[str, list[tuple[int, int]]] = {"image": [], "text": []}
    served = {name: run_job(pipe, view, None, job, parallel.device, lambda d, t, n=name: steps[n].append((d, t)))
              for name, job in jobs.items()}  # fmt: skip
    for name in jobs:
        error = np.abs(served[name]["frames"] - expected[name]).max()
        assert served[name]["frames"].shape == expected[name].shape == (5, 32, 64, 3) and error <= TOL, (name, error)
        assert steps[name] == [(1, 2), (2, 2)], name  # the server's progress
    assert np.abs(served["image"]["frames"] - served["text"]["frames"]).max() > 0.05  # two videos, not one twice

    def cancel(done: int, total: int) -> None:  # the worker's cancel point: after a denoising step
        steps["cancelled"] = [(done, total)]
        raise Cancelled()

    with pytest.raises(Cancelled):
        run_job(pipe, view, None, jobs["image"], parallel.device, cancel)
    assert steps["cancelled"] == [(1, 2)]


def test_a_lora_served_on_the_text_pipeline_runs_on_the_image_to_video_view(tmp_path):
    """A saved tiny Wan 2.2 TI2V (``WanPipeline``, run with an image as ``WanImageToVideoPipeline``): the worker loads a
    request's adapter through the text pipeline (``switch_lora``) into the transformer both share, so a job with an
    image equals ``generate --image --lora`` (frames within 1e-4), and once unloaded the view runs the base model."""
    from safetensors.torch import save_file

    from dit_sp.inference.session import setup_with_image_view
    from dit_sp.server.workers import switch_lora

    build_tiny("tiny-wan2.2-ti2v").save_pretrained(tmp_path / "ti2v")
    Image.fromarray((np.random.RandomState(1).rand(32, 32, 3) * 255).astype("uint8")).save(tmp_path / "first.png")
    job = {"steps": 2, "frames": 5, "width": 32, "height": 32, "prompt": "a red circle"}
    base = GenerateConfig.load(overrides={"model": "tiny-wan2.2-ti2v", "image": str(tmp_path / "first.png"), **job})
    base = dataclasses.replace(base, model=str(tmp_path / "ti2v"))
    parallel, pipe, view = setup_with_image_view(base)
    assert (type(pipe).__name__, type(view).__name__) == ("WanPipeline", "WanImageToVideoPipeline")
    assert view.transformer is pipe.transformer
    torch.manual_seed(0)
    width = pipe.transformer.get_submodule("blocks.0.attn1.to_v").in_features
    (tmp_path / "loras" / "style").mkdir(parents=True)
    v = "transformer.blocks.0.attn1.to_v"
    save_file({f"{v}.lora_A.weight": 4 * torch.randn(4, width), f"{v}.lora_B.weight": 4 * torch.randn(width, 4)},
              str(tmp_path / "loras" / "style" / "pytorch_lora_weights.safetensors"))  # fmt: skip
    expected = generate(dataclasses.replace(base, out=str(tmp_path / "v.mp4"),
                                            lora=[str(tmp_path / "loras" / "style")]), True)["frames"]  # fmt: skip

    assert switch_lora(pipe, None, "style", str(tmp_path / "loras")) == "style"
    styled = run_job(pipe, view, None, base, parallel.device)["frames"]
    assert switch_lora(pipe, "style", None, str(tmp_path / "loras")) is None
    plain = run_job(pipe, view, None, base, parallel.device)["frames"]
    assert styled.shape == expected.shape == (5, 32, 32, 3) and np.abs(styled - expected).max() <= TOL
    assert np.abs(plain - expected).max() > 0.05  # the adapter ran on the view, and is gone once unloaded
