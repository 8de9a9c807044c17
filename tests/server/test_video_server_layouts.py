"""The video server on the layouts beyond Ulysses and dp (those are in test_video_server*.py), with the official
``openai`` client, each job's video against ``generate``'s on one process with the same settings and seed; one
server per layout, several checks on each:

- ring 2x1, serving a saved tiny SANA-Video (text-to-video and image-to-video): an uploaded first frame
  (``input_reference``) runs on its image-to-video view and equals ``generate --image`` with the same image; a request
  without one equals ``generate``'s text-to-video video.
- CFG parallel (``--cfg-parallel``) with ``--lora-dir``: the video equals ``generate``'s; adapters that do not fit
  the model (a module it lacks, wrong shapes, ``proj_out``) are 400s naming the adapter and its keys before
  anything is queued, and one that fits runs; an image for this text-to-video model is a 400.
- two "nodes" under torchrun (two torchrun processes on loopback, one rank each, dp 2): a job on each node's
  group equals ``generate``'s; SIGTERM to rank 0's torchrun stops both torchruns and every process below them.
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from serve_run import Server, alive, descendants, wait_until

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
SMALL = {"num_frames": 5, "num_inference_steps": 2}
SETTINGS = ["--set", "steps=2", "--set", "frames=5"]


def _client(server: Server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _frames(data: bytes) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(io.BytesIO(data), extension=".mp4")


def _generated(tmp_path, name: str, **settings) -> np.ndarray:
    """``generate``'s video on one process (the library's call, as the CLI makes it)."""
    from dit_sp import GenerateConfig, generate

    out = tmp_path / f"{name}.mp4"
    generate(GenerateConfig.load(overrides={"frames": 5, "steps": 2, "out": str(out), **settings}))
    return _frames(out.read_bytes())


def _finished(client, video_id: str, timeout: float = 120.0):
    """The job once it is completed or failed (``client.videos.poll`` waits without a limit)."""
    return wait_until(lambda: (v := client.videos.retrieve(video_id)).status in ("completed", "failed") and v,
                      timeout, f"{video_id} to finish")  # fmt: skip


def _served(client, **create) -> np.ndarray:
    video = _finished(client, client.videos.create(**create).id)
    assert video.status == "completed", video
    return _frames(client.videos.download_content(video.id).content)


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    data = io.BytesIO()
    Image.fromarray(pixels).save(data, format="PNG")
    return data.getvalue()


def test_ring_image_to_video(tmp_path):
    """A saved tiny SANA-Video checkpoint (``SanaVideoPipeline``, an image-to-video model too) served on ring 2: a job
    with an uploaded first frame runs on its image-to-video view (``SanaImageToVideoPipeline`` on the same modules) and
    equals ``generate --image`` with that file; a job without one, in the same server, equals ``generate``'s
    text-to-video video."""
    from dit_sp.zoo import build_tiny

    build_tiny("tiny-sana-video").save_pretrained(tmp_path / "sana")
    image = tmp_path / "first.png"
    image.write_bytes(_png(64, 32))
    server = Server(["--model", str(tmp_path / "sana"), "--ring", "2", *SETTINGS, "--set", "width=64", "--set",
                     "height=32", "--job-dir", str(tmp_path / "jobs")], cwd=tmp_path)  # fmt: skip
    try:
        client = _client(server)
        served = _served(client, prompt="a red circle rolls", size="64x32", extra_body={**SMALL, "seed": 4},
                         input_reference=("first.png", image.read_bytes(), "image/png"))  # fmt: skip
        text = _served(client, prompt="a blue square", size="64x32", extra_body={**SMALL, "seed": 5})
        assert server.terminate(60) == 0, server.output
    finally:
        server.kill()
    reference = _generated(tmp_path, "i2v", model=str(tmp_path / "sana"), prompt="a red circle rolls", seed=4,
                           width=64, height=32, image=str(image))  # fmt: skip
    assert served.shape == (5, 32, 64, 3)
    np.testing.assert_allclose(served, reference, atol=1)
    reference = _generated(tmp_path, "t2v", model=str(tmp_path / "sana"), prompt="a blue square", seed=5, width=64,
                           height=32)  # fmt: skip
    np.testing.assert_allclose(text, reference, atol=1)
    assert np.abs(text.astype(int) - served).mean() > 4  # two videos, not one twice (measured: 7.9 levels apart)


def _adapter(directory, tensors: dict) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "pytorch_lora_weights.safetensors"))


def test_cfg_parallel_and_lora_checks(tmp_path):
    import torch

    torch.manual_seed(0)
    width = 36  # the tiny Wan's attention: 3 heads x 12
    q, nope, out = "transformer.blocks.0.attn1.to_q", "transformer.blocks.0.attn1.to_nope", "transformer.proj_out"
    loras = tmp_path / "loras"
    _adapter(loras / "good", {f"{q}.lora_A.weight": torch.randn(4, width), f"{q}.lora_B.weight": torch.randn(width, 4)})
    _adapter(loras / "missing", {f"{nope}.lora_A.weight": torch.randn(4, width),
                                 f"{nope}.lora_B.weight": torch.randn(width, 4)})  # fmt: skip
    _adapter(loras / "shapes", {f"{q}.lora_A.weight": torch.randn(4, width + 1),
                                f"{q}.lora_B.weight": torch.randn(width, 4)})  # fmt: skip
    _adapter(loras / "projout", {f"{out}.lora_A.weight": torch.randn(4, width),
                                 f"{out}.lora_B.weight": torch.randn(16, 4)})  # fmt: skip
    server = Server(["--model", "tiny-wan", "--cfg-parallel", *SETTINGS, "--lora-dir", str(loras),
                     "--job-dir", str(tmp_path / "jobs")], cwd=tmp_path)  # fmt: skip
    try:
        client = _client(server)
        cases = {"missing": r"lora missing does not fit tiny-wan's transformer: 2 of its 2 keys: "
                            rf"{nope}\.lora_A\.weight \(the transformer has no module blocks\.0\.attn1\.to_nope\)",
                 "shapes": rf"lora shapes .*{q}\.lora_A\.weight \(shape \[4, 37\]: blocks\.0\.attn1\.to_q takes 36",
                 "projout": rf"lora projout .*{out}\.lora_A\.weight \(proj_out is where dit-sp splits"}  # fmt: skip
        for name, message in cases.items():
            with pytest.raises(openai.BadRequestError, match=message):
                client.videos.create(prompt="a red circle", extra_body={**SMALL, "lora": name})
        with pytest.raises(openai.BadRequestError, match="text-to-video model"):
            client.videos.create(prompt="a red circle", input_reference=("a.png", _png(32, 32), "image/png"))
        assert client.videos.list().data == []  # nothing was queued
        settings = {**SMALL, "seed": 2, "guidance_scale": 4.0}
        served = _served(client, prompt="a blue square", size="32x32", extra_body=settings)
        styled = _served(client, prompt="a blue square", size="32x32", extra_body={**settings, "lora": "good"})
        assert server.terminate(60) == 0, server.output
    finally:
        server.kill()
    reference = _generated(tmp_path, "cfg", model="tiny-wan", prompt="a blue square", seed=2, width=32, height=32,
                           guidance=4.0)  # fmt: skip
    np.testing.assert_allclose(served, reference, atol=1)
    assert np.abs(styled.astype(int) - served).max() > 8  # the adapter ran


def test_two_nodes_under_torchrun(tmp_path):
    from dit_sp.parallel.launch import free_port

    port = str(free_port())
    args = ["--model", "tiny-wan", *SETTINGS, "--job-dir", str(tmp_path / "jobs")]
    nodes = []
    try:
        for rank in (1, 0):  # node 1 first: it waits for node 0's store
            launcher = ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank), "--master-addr",
                        "127.0.0.1", "--master-port", port]  # fmt: skip
            nodes.append(Server(args, cwd=tmp_path, start_timeout=180, torchrun=launcher, wait=rank == 0))
        node1, node0 = nodes
        assert "2 workers, dp 2" in node0.output, node0.output
        client = _client(node0)
        prompts = {3: "a green circle", 4: "a yellow square"}
        videos = {seed: client.videos.create(prompt=prompt, size="32x32", extra_body={**SMALL, "seed": seed})
                  for seed, prompt in prompts.items()}  # fmt: skip
        done = {seed: _finished(client, v.id) for seed, v in videos.items()}
        assert all(v.status == "completed" for v in done.values()), done
        assert {v.dp_group for v in done.values()} == {0, 1}, "a job ran on each node's group"
        served = {seed: _frames(client.videos.download_content(v.id).content) for seed, v in done.items()}
        processes = [p for node in nodes for p in (node.proc.pid, *descendants(node.proc.pid))]
        start = time.monotonic()
        node0.proc.terminate()  # SIGTERM to rank 0's torchrun
        node0.proc.wait(60)
        node1.proc.wait(60)  # its worker was told to end; then its torchrun ends
        assert time.monotonic() - start < 60
        wait_until(lambda: not any(alive(p) for p in processes), 10, "every process to exit")
        assert "stopping: no new jobs" in node0.output, node0.output
    finally:
        for node in nodes:
            node.kill()
    for seed, prompt in prompts.items():
        reference = _generated(tmp_path, f"seed{seed}", model="tiny-wan", prompt=prompt, seed=seed, width=32, height=32)
        np.testing.assert_array_equal(served[seed], reference)  # each job on one process of its own group
