"""The video server's faults and restarts, on two short-lived servers sharing one job directory: a killed worker
fails its job with an error naming it and the workers restart; SIGTERM cancels the running job within the grace
time and leaves no process; a new server serves the finished jobs again; a job past --job-timeout fails, and a
server out of restarts exits 1."""

from __future__ import annotations

import io
import json
import os
import signal
import time

import numpy as np
import pytest
from serve_run import Server, alive, descendants, wait_until

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
SMALL = {"num_frames": 5, "num_inference_steps": 2}
LONG = {"num_frames": 5, "num_inference_steps": 100_000}


def _client(server: Server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _frames(data: bytes) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(io.BytesIO(data), extension=".mp4")


def _running(client, prompt: str):
    video = client.videos.create(prompt=prompt, size="32x32", extra_body=LONG)
    wait_until(lambda: client.videos.retrieve(video.id).progress > 0, 60, f"{prompt} to run")
    return video


def _adapter(directory) -> None:
    """A random LoRA of the tiny Wan's attention, saved as diffusers saves one."""
    import torch
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from dit_sp.zoo import load_pipeline

    torch.manual_seed(0)
    pipe = load_pipeline("tiny-wan", torch.float32, "cpu")
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                            init_lora_weights=False))  # fmt: skip
    type(pipe).save_lora_weights(directory, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer))


def _with_lora(directory, config, out) -> None:
    """``config``'s video from the stock pipeline with the adapter loaded, in this process."""
    import torch

    from dit_sp.inference import guidance_arguments
    from dit_sp.inference.session import sample
    from dit_sp.io.video import save_video
    from dit_sp.zoo import load_pipeline

    pipe = load_pipeline("tiny-wan", torch.float32, "cpu")
    pipe.load_lora_weights(str(directory))
    video = sample(pipe, config, guidance_arguments(pipe, config), config.seed, torch.device("cpu"))
    save_video(video["frames"], out, fps=config.fps)


def test_killed_worker_sigterm_and_restart(tmp_path):
    from dit_sp import GenerateConfig, generate

    jobs = str(tmp_path / "jobs")
    _adapter(tmp_path / "loras" / "style")
    first = Server(["--model", "tiny-wan", "--ulysses", "2", "--job-dir", jobs, "--shutdown-grace", "1",
                    "--max-restarts", "1", "--lora-dir", str(tmp_path / "loras")], cwd=tmp_path)  # fmt: skip
    try:
        client = _client(first)
        # a video on two Ulysses ranks equals generate's on one process
        done = client.videos.create_and_poll(prompt="a red circle moving left", size="32x32", poll_interval_ms=50,
                                             extra_body={**SMALL, "seed": 5})  # fmt: skip
        assert done.status == "completed", done
        video = client.videos.download_content(done.id).content
        generate(GenerateConfig.load(overrides={"model": "tiny-wan", "prompt": "a red circle moving left", "seed": 5,
                                                "frames": 5, "steps": 2, "height": 32, "width": 32,
                                                "out": str(tmp_path / "ref.mp4")}))  # fmt: skip
        np.testing.assert_allclose(_frames(video), _frames((tmp_path / "ref.mp4").read_bytes()), atol=1)

        # a LoRA per request, loaded into the parallelized pipeline between jobs and unloaded after
        settings = {"prompt": "a red circle moving left", "size": "32x32", "poll_interval_ms": 50}
        styled = client.videos.create_and_poll(**settings, extra_body={**SMALL, "seed": 5, "lora": "style"})
        assert styled.status == "completed", styled
        config = GenerateConfig.load(overrides={"model": "tiny-wan", "prompt": "a red circle moving left", "seed": 5,
                                                "frames": 5, "steps": 2, "height": 32, "width": 32})  # fmt: skip
        _with_lora(tmp_path / "loras" / "style", config, tmp_path / "lora.mp4")
        styled_video = _frames(client.videos.download_content(styled.id).content)
        np.testing.assert_allclose(styled_video, _frames((tmp_path / "lora.mp4").read_bytes()), atol=1)
        assert np.abs(styled_video.astype(int) - _frames(video)).max() > 8  # the adapter changed the video
        plain = client.videos.create_and_poll(**settings, extra_body={**SMALL, "seed": 5})
        assert _frames(client.videos.download_content(plain.id).content).tolist() == _frames(video).tolist()

        # a worker killed mid-job: the job fails naming it, the workers restart, the next job runs
        killed = _running(client, "killed")
        workers = first.workers()
        assert len(workers) == 2, first.output
        os.kill(workers[1], signal.SIGKILL)
        failed = client.videos.poll(killed.id, poll_interval_ms=50)
        assert failed.status == "failed" and failed.error.code == "worker_failed", failed
        assert "was killed by SIGKILL" in failed.error.message and "rank" in failed.error.message
        after = client.videos.create_and_poll(prompt="after the restart", size="32x32", poll_interval_ms=100,
                                              extra_body=SMALL, timeout=120)  # fmt: skip
        assert after.status == "completed", after
        assert set(first.workers()).isdisjoint(workers)

        # SIGTERM while a job runs: it is cancelled within the grace time, and no process is left
        cancelled = _running(client, "cancelled by SIGTERM")
        processes = [first.proc.pid, *descendants(first.proc.pid)]  # the workers, their fork server, ...
        assert len(processes) >= 4, processes
        start = time.monotonic()
        assert first.terminate(30) == 0, first.output
        took = time.monotonic() - start
        assert took < 10, f"SIGTERM took {took:.1f} s: longer than the grace time (1 s) and the workers' stop"
        wait_until(lambda: not any(alive(p) for p in processes), 10, "every worker to exit")
    finally:
        first.kill()

    second = Server(["--model", "tiny-wan", "--job-dir", jobs, "--max-restarts", "0", "--job-timeout", "4"],
                    cwd=tmp_path)  # fmt: skip
    try:
        client = _client(second)
        listed = {v.id: v for v in client.videos.list(limit=100, order="asc")}
        assert [listed[i].status for i in (done.id, killed.id, after.id, cancelled.id)] == [
            "completed", "failed", "completed", "failed"]  # fmt: skip
        assert "shut down" in listed[cancelled.id].error.message
        assert client.videos.download_content(done.id).content == video
        # a job past --job-timeout fails and the workers restart; out of restarts, the server exits 1 saying why
        last = client.videos.create(prompt="past the job timeout", size="32x32", extra_body=LONG)
        assert second.proc.wait(60) == 1, second.output
        assert "error: a job ran past --job-timeout; gave up after 0 restarts (--max-restarts)" in second.output
        record = json.loads((tmp_path / "jobs" / last.id / "job.json").read_text())
        assert record["status"] == "failed" and record["error"]["code"] == "timeout", record
        wait_until(lambda: not descendants(second.proc.pid), 10, "every worker to exit")
    finally:
        second.kill()
