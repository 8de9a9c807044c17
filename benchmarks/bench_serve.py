"""The video server under load: N concurrent ``openai`` clients against ``python -m pipelines.serve`` on loopback,
beside ``python -m pipelines.generate --prompts`` on the same prompts and layout.

    python benchmarks/bench_serve.py                                   # 4 clients, 16 prompts, tiny Wan, dp 2
    python benchmarks/bench_serve.py --clients 8 --prompts 32 --ulysses 2 --dp 1

Each client takes the next prompt, creates a job (the prompt's own seed), polls it to the end and downloads
the mp4; latency is from create to completed (queueing included). Videos per hour: videos over the wall time
from the first create to the last completion (the server's model load excluded, as ``generate`` excludes its
own). Nothing lost: every prompt's job completes, and each downloaded video's frames equal ``generate``'s for
that prompt.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

warnings.filterwarnings("ignore", category=DeprecationWarning, module="openai")  # its note on OpenAI's own service

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["a red circle moving left", "a blue square moving right", "a green triangle moving up",
           "a yellow circle moving down"]  # fmt: skip


def _frames(data: bytes) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(io.BytesIO(data), extension=".mp4")


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_generate(args: argparse.Namespace, prompts: Path, out: Path, layout: list[str]) -> tuple[float, float]:
    """``generate --prompts``: (its own videos per hour, wall seconds with the model load)."""
    command = [sys.executable, "-m", "pipelines.generate", "--model", args.model, "--prompts", str(prompts),
               "--out", str(out / "video.mp4"), "--steps", str(args.steps), "--frames", str(args.frames),
               "--height", str(args.size), "--width", str(args.size), *layout]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"generate failed:\n{result.stderr[-3000:]}")
    rate = float(re.search(r"([\d.]+) videos/hour", result.stdout)[1])
    return rate, wall


def run_server(args: argparse.Namespace, entries: list[dict], jobs: Path, layout: list[str]) -> dict:
    """The server with ``--clients`` concurrent clients: latencies, wall time, and the videos by prompt index."""
    import openai

    command = [sys.executable, "-m", "pipelines.serve", "--model", args.model, "--port", "0", "--job-dir", str(jobs),
               "--max-queued", str(max(64, args.clients)), "--set", f"steps={args.steps}",
               "--set", f"frames={args.frames}", *layout]  # fmt: skip
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in server.stdout:
        match = re.search(r"serving \S+ on (http://\S+)", line)
        if match:
            url = match[1]
            break
    if url is None:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()  # keep the pipe drained
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        todo = list(enumerate(entries))
        lock = threading.Lock()
        latencies: list[float] = []
        videos: dict[int, bytes] = {}
        errors: list[str] = []

        def one_client() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    index, entry = todo.pop(0)
                begin = time.perf_counter()
                try:
                    video = client.videos.create(prompt=entry["prompt"], size=f"{args.size}x{args.size}",
                                                 extra_body={"seed": entry["seed"]})  # fmt: skip
                    video = client.videos.poll(video.id, poll_interval_ms=50)
                    if video.status != "completed":
                        raise RuntimeError(f"{video.id} {video.status}: {video.error}")
                    latency = time.perf_counter() - begin
                    data = client.videos.download_content(video.id).content
                except Exception as e:  # noqa: BLE001 - counted as lost
                    errors.append(f"prompt {index}: {type(e).__name__}: {e}")
                    continue
                with lock:
                    latencies.append(latency)
                    videos[index] = data

        start = time.perf_counter()
        clients = [threading.Thread(target=one_client) for _ in range(args.clients)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        wall = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(120)
    return {"latencies": latencies, "wall": wall, "videos": videos, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-wan")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--prompts", type=int, default=16, help="videos in all (default 16)")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel groups (default 2)")
    parser.add_argument("--ulysses", type=int, default=1, help="Ulysses degree (default 1)")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps (default 4)")
    parser.add_argument("--frames", type=int, default=9, help="frames (default 9)")
    parser.add_argument("--size", type=int, default=32, help="height and width (default 32)")
    args = parser.parse_args()
    layout = ["--dp", str(args.dp), "--ulysses", str(args.ulysses)]
    entries = [{"prompt": f"{PROMPTS[i % len(PROMPTS)]} {i}", "seed": i} for i in range(args.prompts)]
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        tmp = Path(tmp)
        prompts = tmp / "prompts.jsonl"
        prompts.write_text("".join(json.dumps(e) + "\n" for e in entries))
        rate, generate_wall = run_generate(args, prompts, tmp / "generate", layout)
        served = run_server(args, entries, tmp / "jobs", layout)
        lost = [i for i in range(len(entries)) if i not in served["videos"]]
        reference = tmp / "generate" / "video"
        unequal = [
            i for i, data in served["videos"].items()
            if not np.array_equal(_frames(data), _frames((reference / f"{i:05d}.mp4").read_bytes()))
        ]  # fmt: skip
    lat = served["latencies"]
    print(f"{args.prompts} videos of {args.frames} x {args.size} x {args.size}, {args.steps} steps, {args.model}, "
          f"dp {args.dp} x ulysses {args.ulysses}\n")  # fmt: skip
    print("| run | videos | videos/hour | p50 latency (s) | p95 latency (s) |")
    print("|---|---|---|---|---|")
    print(f"| generate --prompts | {args.prompts} | {rate:.0f} (wall with load {generate_wall:.1f} s) | - | - |")
    print(f"| serve, {args.clients} clients | {len(served['videos'])} | {len(lat) / served['wall'] * 3600:.0f} | "
          f"{_percentile(lat, 50):.2f} | {_percentile(lat, 95):.2f} |")  # fmt: skip
    print(f"\nlost: {len(lost)} {lost or ''}; videos unequal to generate's: {len(unequal)} {unequal or ''}")
    for error in served["errors"]:
        print("error:", error)
    if lost or unequal:
        sys.exit(1)


if __name__ == "__main__":
    main()
