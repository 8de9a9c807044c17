"""The video server (``python -m pipelines.serve``) with the official ``openai`` client on loopback: one server
for the module (tiny Wan, two data-parallel groups, an API key, a queue of 3), and many checks against it:
the served model, create/poll/download equal to ``generate``'s video, concurrent jobs on both groups,
progress, cancel (queued and running), 400/401/404/429, list, and the web page in a real headless browser."""

from __future__ import annotations

import io
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from serve_run import Server, wait_until

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
KEY = "test-key-123"
SMALL = {"num_frames": 5, "num_inference_steps": 2}
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    server = Server(["--model", "tiny-wan", "--dp", "2", "--set", "steps=2", "--set", "frames=5", "--api-key", KEY,
                     "--max-queued", "3", "--max-request-mb", "1", "--job-dir", str(tmp / "jobs")],
                    cwd=tmp)  # fmt: skip
    yield server
    assert server.terminate(60) == 0, server.output


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _frames(data: bytes) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(io.BytesIO(data), extension=".mp4")


def test_models_and_keys(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny-wan"]
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="API key"):
        bad.videos.list()
    with pytest.raises(openai.AuthenticationError):
        bad.videos.create(prompt="a red circle")
    for path in ("/v1/videos", "/v1/models", "/health"):  # no header at all
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + path, timeout=10)
        assert refused.value.code == 401
    assert b"<form" in urllib.request.urlopen(server.url + "/", timeout=10).read()  # the page holds no data


def test_video_equals_generate(client, tmp_path):
    """The job's mp4 equals generate's with the same settings and seed (generate on one process; the server on
    two dp groups, each job on one of them)."""
    from dit_sp import GenerateConfig, generate

    video = client.videos.create_and_poll(prompt="a blue square moving right", size="32x32", poll_interval_ms=50,
                                          extra_body={**SMALL, "seed": 7, "guidance_scale": 3.0})  # fmt: skip
    assert video.status == "completed" and video.progress == 100, video
    assert (video.size, video.model, video.seconds) == ("32x32", "tiny-wan", "0.625")
    served = client.videos.download_content(video.id).content
    config = GenerateConfig.load(overrides={"model": "tiny-wan", "prompt": "a blue square moving right", "seed": 7,
                                            "frames": 5, "steps": 2, "height": 32, "width": 32, "guidance": 3.0,
                                            "out": str(tmp_path / "ref.mp4")})  # fmt: skip
    generate(config)
    reference = (tmp_path / "ref.mp4").read_bytes()
    assert _frames(served).shape == (5, 32, 32, 3)
    np.testing.assert_array_equal(_frames(served), _frames(reference))
    thumbnail = client.videos.download_content(video.id, variant="thumbnail").content
    from PIL import Image

    assert Image.open(io.BytesIO(thumbnail)).size == (32, 32)
    sheet = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="spritesheet").content))
    assert sheet.size == (32 * 5, 32)
    assert client.videos.retrieve(video.id).status == "completed"
    assert video.id in [v.id for v in client.videos.list(limit=100)]


def test_concurrent_jobs_on_both_groups(client):
    """Six clients at once: every job completes, and the two dp groups each ran some, at the same time."""
    results, errors = {}, []

    def one(i: int) -> None:
        try:
            video = client.videos.create(prompt=f"a green triangle {i}", size="32x32",
                                         extra_body={**SMALL, "num_inference_steps": 10, "seed": i})  # fmt: skip
            results[i] = client.videos.poll(video.id, poll_interval_ms=50)
        except openai.RateLimitError:  # the queue holds 3: a client retries as told
            time.sleep(0.5)
            one(i)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    seen_running: set[int] = set()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        running = [v for v in client.videos.list(limit=100).data if v.status == "in_progress"]
        seen_running = max(seen_running, {v.dp_group for v in running}, key=len)
        time.sleep(0.05)
    assert not errors, errors
    assert sorted(results) == list(range(6)) and all(v.status == "completed" for v in results.values())
    assert {v.dp_group for v in results.values()} == {0, 1}
    assert seen_running == {0, 1}, "the two groups never ran jobs at the same time"


def test_bad_requests_are_400_before_running(client):
    cases = [({"size": "33x32"}, "multiple of 16"), ({"size": "big"}, "WIDTHxHEIGHT"),
             ({"extra_body": {"num_frames": 4}}, "frames"), ({"extra_body": {"seed": "x"}}, "seed must be"),
             ({"extra_body": {"lora_path": "/etc/passwd"}}, "unknown field 'lora_path'"),
             ({"model": "sora-2"}, "not served here"), ({"seconds": "-1"}, "seconds must be"),
             ({"input_reference": ("a.png", b"not an image", "image/png")}, "not an image")]  # fmt: skip
    before = len(client.videos.list(limit=100).data)
    for kwargs, message in cases:
        with pytest.raises(openai.BadRequestError, match=message):
            client.videos.create(prompt="a red circle", **kwargs)
    with pytest.raises(openai.BadRequestError, match="prompt is required"):
        client.videos.create(prompt="")
    import PIL.Image

    image = io.BytesIO()
    PIL.Image.new("RGB", (32, 32)).save(image, format="PNG")
    with pytest.raises(openai.BadRequestError, match="text-to-video"):
        client.videos.create(prompt="a red circle", input_reference=("first.png", image.getvalue(), "image/png"))
    with pytest.raises(openai.APIStatusError, match="over the server's limit") as too_large:
        client.videos.create(prompt="a red circle", input_reference=("big.png", b"x" * (2 << 20), "image/png"))
    assert too_large.value.status_code == 413  # --max-request-mb 1
    assert len(client.videos.list(limit=100).data) == before  # nothing was queued


def test_seconds_map_to_frames(client):
    video = client.videos.create(prompt="a red circle", seconds="1", size="32x32", extra_body={"seed": 1})
    assert video.settings["frames"] == 9  # 1 s at the tiny Wan's 8 fps: 8 + 1 frames (Wan: 4k + 1)
    client.videos.delete(video.id)


def test_404(client):
    for bad in ("video_" + "0" * 32, "../../etc/passwd", "video_x"):
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(bad)
        with pytest.raises(openai.NotFoundError):
            client.videos.download_content(bad)
        with pytest.raises(openai.NotFoundError):
            client.videos.delete(bad)


def test_queue_full_progress_and_cancel(client):
    """A long job runs on each group, three wait, the next is 429; a queued job and a running one are cancelled
    (deleted: 404 after), and the group that ran it takes the next job at once."""
    long = {**SMALL, "num_inference_steps": 100_000}  # runs until cancelled
    running = [client.videos.create(prompt=f"long {i}", size="32x32", extra_body=long) for i in range(2)]
    wait_until(lambda: all(client.videos.retrieve(v.id).status == "in_progress" for v in running), 30, "both running")
    queued = [client.videos.create(prompt=f"queued {i}", size="32x32", extra_body=SMALL) for i in range(3)]
    with pytest.raises(openai.RateLimitError, match="queue is full"):
        client.videos.create(prompt="one too many", size="32x32", extra_body=SMALL)
    progress = wait_until(lambda: client.videos.retrieve(running[0].id).progress, 30, "progress")
    assert 0 < progress < 100
    assert client.videos.delete(queued[0].id).deleted
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(queued[0].id)
    start = time.monotonic()
    for video in running:
        assert client.videos.delete(video.id).deleted
    for video in queued[1:]:
        assert client.videos.poll(video.id, poll_interval_ms=50).status == "completed"
    assert time.monotonic() - start < 30, "the cancelled jobs held their groups"
    for video in running:
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(video.id)


NO_CHROMIUM = f"no Chromium at {CHROMIUM} (CI installs Debian's: apt-get install chromium)"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=NO_CHROMIUM)
def test_web_page_in_a_browser(server):
    """The page at / in headless Chromium: submit a prompt with the key, watch the job complete, play it."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.fill("#key", KEY)
            page.wait_for_function("document.getElementById('model').textContent === 'tiny-wan'", timeout=20_000)
            page.fill("#prompt", "a yellow circle in the browser")
            page.fill("#size", "32x32")
            page.fill("#frames", "5")
            page.fill("#steps", "2")
            page.click("#submit")
            row = page.locator("tr.job", has_text="a yellow circle in the browser")
            row.locator("button.play").click(timeout=60_000)
            page.wait_for_function("document.getElementById('player').src.startsWith('blob:')", timeout=20_000)
            duration = page.evaluate("""() => new Promise((done) => { const v = document.getElementById('player');
                if (v.readyState >= 1) done(v.duration); else v.onloadedmetadata = () => done(v.duration); })""")
            assert duration > 0
            page.fill("#size", "33x33")
            page.click("#submit")
            page.wait_for_function("document.getElementById('error').textContent.includes('multiple of 16')",
                                   timeout=20_000)  # fmt: skip
        finally:
            browser.close()
