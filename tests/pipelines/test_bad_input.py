"""Bad input to the CLIs: every case exits non-zero within seconds, prints no traceback, and names the culprit
(and, where there is one, the fix). Nothing heavy starts first: sizes are checked against the model's config
files and outputs against the file system before any weights load or workers start."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_run import run_cli

pytestmark = pytest.mark.slow  # one CLI process per case (forked from a server with the imports done)
TRAIN = ["--config", "grpo_tiny_wan", "--max-steps", "1"]

# (id, CLI module, argv, files to write first {name: text}, expected message as a regex)
CASES = [
    ("gen-frames", "generate", ["--model", "tiny-wan", "--frames", "8"], {}, r"--frames 8: the VAE needs 4\*k\+1 frames"),
    ("gen-height-sp", "generate", ["--height", "33", "--ulysses", "2"], {}, r"--height 33: must be a multiple of 16 \(VAE x4, patch x2, and Wan's pipelines take multiples of 16\), e.g. 32 or 48"),
    ("gen-width", "generate", ["--model", "tiny-wan", "--width", "40"], {}, r"--width 40: must be a multiple of 16"),
    ("gen-ulysses-0", "generate", ["--ulysses", "0"], {}, r"ulysses must be >= 1, got 0"),
    ("gen-ulysses-word", "generate", ["--ulysses", "two"], {}, r"ulysses: expected an integer, got 'two'"),
    ("gen-ring-float", "generate", ["--ring", "1.5"], {}, r"ring: expected an integer, got '1.5'"),
    ("gen-steps-neg", "generate", ["--steps", "-1"], {}, r"steps must be >= 1, got -1"),
    ("gen-dtype", "generate", ["--dtype", "float8"], {}, r"dtype: expected one of 'float32', 'bfloat16', 'float16'"),
    ("gen-guidance", "generate", ["--guidance", "x"], {}, r"guidance: expected a number, got 'x'"),
    ("gen-cfg", "generate", ["--cfg-parallel", "--guidance", "1"], {}, r"guidance 1.0 turns guidance off"),
    ("gen-cfg-unguided", "generate", ["--model", "tiny-kandinsky6-sr", "--cfg-parallel", "--guidance", "4"], {},
     r"--cfg-parallel for Kandinsky6SRPipeline: Kandinsky6SRPipeline does not guide .*; use cfg=1"),
    ("gen-echo-steps", "generate", ["--model", "{tmp}/echo", "--steps", "4"], {"echo": lambda path: _modular(path, "echo")},
     r"--steps 4: .*/echo \(EchoModularPipeline\) runs at --steps 8 only \(its blocks run their 8 fixed DMD sigmas\); "
     r"use --steps 8 or drop --steps"),
    ("gen-echo-guidance", "generate", ["--model", "{tmp}/echo", "--guidance", "3"], {"echo": lambda path: _modular(path, "echo")},
     r"--guidance 3.0: .*/echo \(EchoModularPipeline\) runs at --guidance 1.0 only \(no guider, no guidance input"),
    ("gen-cosmos3-distilled-steps", "generate", ["--model", "{tmp}/c3", "--steps", "6"], {"c3": lambda path: _modular(path, "cosmos3")},
     r"--steps 6: .*/c3 \(Cosmos3DistilledModularPipeline\) runs at --steps 4 only \(its schedule is the index's "
     r"distilled_sigmas\); use --steps 4 or drop --steps"),
    ("gen-cosmos3-distilled-guidance", "generate", ["--model", "{tmp}/c3", "--guidance", "3"], {"c3": lambda path: _modular(path, "cosmos3")},
     r"--guidance 3.0: .*/c3 \(Cosmos3DistilledModularPipeline\) runs at --guidance 1.0 only \(guidance is distilled"),
    ("gen-text-len", "generate", ["--max-sequence-length", "0"], {}, r"max_sequence_length must be >= 1"),
    ("gen-no-model", "generate", ["--model", "/nonexistent/model"], {}, r"model directory /nonexistent/model does not exist"),
    ("gen-unknown-model", "generate", ["--model", "tiny-nope"], {}, r"unknown model 'tiny-nope': built-in models are"),
    ("gen-not-a-pipeline", "generate", ["--model", "{tmp}"], {}, r"model_index.json is missing"),
    ("gen-no-config", "generate", ["--config", "{tmp}/none.yaml"], {}, r"none.yaml'?: no such file"),
    ("gen-bad-yaml", "generate", ["--config", "{tmp}/bad.yaml"], {"bad.yaml": "steps: [1, 2\n"}, r"not valid YAML at line"),
    ("gen-unknown-key", "generate", ["--config", "{tmp}/c.yaml"], {"c.yaml": "framez: 9\n"},
     r"unknown key 'framez' \(did you mean 'frames'\?\)"),
    ("gen-webm", "generate", ["--out", "{tmp}/v.webm"], {}, r"unknown video format '.webm'; use .mp4, .gif"),
    ("gen-unwritable", "generate", ["--out", "/proc/v.mp4"], {}, r"--out /proc/v.mp4: cannot write to /proc"),
    ("gen-no-prompts", "generate", ["--prompts", "{tmp}/none.txt"], {}, r"--prompts .*none.txt: no such file"),
    ("gen-bad-prompts", "generate", ["--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"prompt": "a", "fps": 3}\n'}, r"p.jsonl:1: expected a JSON object with a 'prompt' and any of"),
    ("gen-prompt-size", "generate", ["--model", "tiny-wan", "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"prompt": "a", "height": 40}\n'}, r"--height 40: must be a multiple of 16"),
    ("gen-embedded", "generate", ["--model", "tiny-wan", "--steps", "1", "--embedded-guidance", "6"], {},
     r"distilled guidance of HunyuanVideo; this model has none"),
    ("gen-guidance-2", "generate", ["--model", "tiny-wan", "--steps", "1", "--guidance-2", "3"], {},
     r"--guidance-2 is the guidance of Wan 2.2 A14B's low-noise expert; this model has one transformer"),
    ("gen-image-t2v", "generate", ["--model", "tiny-wan", "--image", "{tmp}/a.png"], {},
     r"--image: tiny-wan is a text-to-video model \(WanPipeline\) and takes no image; use an image-to-video model"),
    ("gen-i2v-no-image", "generate", ["--model", "tiny-wan-i2v"], {},
     r"tiny-wan-i2v is an image-to-video model \(WanImageToVideoPipeline\): give its first frame with --image PATH"),
    ("gen-refine-python", "generate", ["--model", "tiny-ltx2-dfr-refine"], {},
     r"tiny-ltx2-dfr-refine \(LTX2DFRTemporalRefinePipeline\): generate does not run it: it refines the latent output "
     r"of a previous LTX2DFRPipeline pass .*; call the two passes from Python, each under parallelize"),
    ("gen-consisid-no-face", "generate", ["--model", "{tmp}/consisid"],
     {"consisid": lambda path: _save_consisid(path)},
     r"{tmp}/consisid \(ConsisIDPipeline\): generate does not run it: every sample needs face-identity inputs, "
     r"id_cond and id_vit_hidden, made from a face image by .* consisid_utils .*; make them so and call the pipeline "
     r"from Python with them, under parallelize"),
    ("gen-anyflow-long-video", "generate", ["--model", "tiny-anyflow", "--frames", "9", "--video", "{tmp}/clip"],
     {"clip": lambda path: _write_clip(path, 13)},
     r"--video .*clip: 13 frames encode to 4 latent frames, more than the 3 of the --frames 9 to make "
     r"\(AnyFlowPipeline keeps the video's latent frames as the first of its output\); give --frames 13 or more, or "
     r"a video of at most 12 frames"),
    ("gen-anyflow-far-video-length", "generate", ["--model", "tiny-anyflow-far", "--video", "{tmp}/clip"],
     {"clip": lambda path: _write_clip(path, 3)},
     r"--video .*clip: 3 frames; AnyFlowFARPipeline takes a video of 1 or 5 frames \(it keeps the video's latent "
     r"frames as whole chunks of its chunk_partition \[1, 1, 1\] and makes the rest, at least the last\): trim it "
     r"to one of them"),
    ("gen-image-missing", "generate", ["--model", "tiny-cogvideox-i2v", "--image", "{tmp}/none.png"], {},
     r"--image .*none.png: no such file"),
    ("gen-image-unreadable", "generate", ["--model", "tiny-wan-i2v", "--image", "{tmp}/a.png"], {"a.png": "text\n"},
     r"--image .*a.png: not an image this machine can read"),
    ("gen-last-image-i2v", "generate", ["--model", "tiny-wan-i2v", "--image", "{tmp}/a.png", "--last-image", "{tmp}/b.png"],
     {}, r"--last-image: tiny-wan-i2v encodes one image \(Wan2.1-I2V\); first-last-frame video needs a Wan2.1-FLF2V"),
    ("gen-last-image-ti2v", "generate", ["--model", "tiny-wan2.2-ti2v", "--image", "{tmp}/a.png", "--last-image",
     "{tmp}/b.png"], {}, r"--last-image: tiny-wan2.2-ti2v takes the first frame only \(Wan 2.2 TI2V's .* ignores last_image\); drop --last-image"),
    ("gen-flf-no-last", "generate", ["--model", "tiny-wan-flf2v", "--image", "{tmp}/a.png"], {},
     r"tiny-wan-flf2v is a first-last-frame model \(Wan2.1-FLF2V\): give the last frame too with --last-image PATH"),
    ("gen-guidance-2-off", "generate", ["--model", "tiny-wan2.2-a14b", "--guidance", "1", "--guidance-2", "3"], {},
     r"guidance 1.0 turns guidance off for both experts; use guidance > 1 or drop guidance_2"),
    ("gen-batch-mixed", "generate", ["--model", "tiny-wan2.2-ti2v", "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "a", "image": "a.png"}\n{"prompt": "b"}\n', "a.png": "x"},
     r"some lines give an 'image' and some do not; one model runs the whole batch"),
    ("gen-shard-one", "generate", ["--shard-weights"], {}, r"--shard-weights shards the weights over the processes of one sample, and this layout has one"),
    ("gen-cache-name", "generate", ["--cache", "magic:0.1"], {}, r"--cache 'magic:0.1': unknown policy 'magic'; expected NAME\[:THRESHOLD\]"),
    ("gen-cache-threshold", "generate", ["--cache", "teacache:fast"], {}, r"the threshold 'fast' is not a number"),
    ("gen-shard-compile", "generate", ["--shard-weights", "--compile", "--ulysses", "2"], {}, r"drop --compile or --shard-weights"),
    ("gen-shard-cache-cfg", "generate", ["--shard-weights", "--cache", "fbc", "--cfg-parallel"], {}, r"--cache with --cfg-parallel lets each guidance branch skip on its own"),
    ("eval-cache", "eval_toy", ["--cache", "fbc:x"], {}, r"the threshold 'x' is not a number"),
    ("train-no-config", "train_grpo", ["--config", "{tmp}/none.yaml"], {}, r"no such file, and no bundled config"),
    ("train-bad-yaml", "train_grpo", ["--config", "{tmp}/bad.yaml"], {"bad.yaml": "optim: {lr: \n  - x\n"},
     r"not valid YAML"),
    ("train-lr-word", "train_grpo", [*TRAIN, "--set", "optim.lr=abc"], {}, r"optim.lr: expected a number, got 'abc'"),
    ("train-steps-str", "train_grpo", ["--config", "{tmp}/c.yaml"], {"c.yaml": "max_steps: forty\n"},
     r"max_steps: expected an integer, got 'forty'"),
    ("train-ulysses-float", "train_grpo", ["--config", "{tmp}/c.yaml"], {"c.yaml": "ulysses: 2.5\n"},
     r"ulysses: expected an integer, got 2.5"),
    ("train-adv-std", "train_grpo", [*TRAIN, "--set", "grpo.adv_std=batch"], {}, r"grpo.adv_std: expected one of 'group', 'global'"),
    ("train-precision", "train_grpo", [*TRAIN, "--set", "mixed_precision=fp8"], {}, r"mixed_precision: expected one of 'bfloat16'"),
    ("train-unknown-key", "train_grpo", [*TRAIN, "--set", "grpo.nope=1"], {}, r"unknown key 'nope'"),
    ("train-set-syntax", "train_grpo", [*TRAIN, "--set", "bogus"], {}, r"--set bogus: expected KEY=VALUE"),
    ("train-no-prompts", "train_grpo", [*TRAIN, "--prompts", "{tmp}/none.txt"], {}, r"prompt file .*none.txt does not exist"),
    ("train-empty-prompts", "train_grpo", [*TRAIN, "--prompts", "{tmp}/empty.txt"], {"empty.txt": "\n\n"}, r"holds no prompts"),
    ("train-bad-jsonl", "train_grpo", [*TRAIN, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"text": "a"}\n'},
     r"p.jsonl:1: expected a JSON object with a 'prompt'"),
    ("train-image-missing", "train_grpo", [*TRAIN, "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "a", "image": "none.png"}\n'}, r"p.jsonl:1: image none.png does not exist \(paths are relative to the file\)"),
    ("train-image-mixed", "train_grpo", [*TRAIN, "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "a", "image": "a.png"}\n{"prompt": "b"}\n', "a.png": "x"},
     r"some prompts have an 'image' and some do not"),
    ("train-i2v-no-image", "train_grpo", [*TRAIN, "--model", "tiny-wan-i2v"], {},
     r"tiny-wan-i2v is an image-to-video model: give a JSONL prompt file with an 'image' per prompt"),
    ("train-t2v-image", "train_grpo", [*TRAIN, "--model", "tiny-wan", "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "a", "image": "a.png"}\n', "a.png": "x"},
     r"tiny-wan is a text-to-video model \(WanPipeline\): its prompts take no image"),
    ("train-flf2v", "train_grpo", [*TRAIN, "--model", "tiny-wan-flf2v", "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "a", "image": "a.png"}\n', "a.png": "x"},
     r"Wan2.1-FLF2V \(first and last frame\) is not trained by GRPO yet"),
    ("train-dp-split", "train_grpo", [*TRAIN, "--dp", "3"], {}, r"cannot be split evenly over dp=3"),
    ("train-reward", "train_grpo", [*TRAIN, "--set", "reward=shiny"], {}, r"unknown reward 'shiny'; built-in rewards"),
    ("train-reward-weight", "train_grpo", [*TRAIN, "--set", "reward={brightness: high}"], {},
     r"reward 'brightness': weight must be a number"),
    ("train-no-model", "train_grpo", [*TRAIN, "--model", "/nonexistent/model"], {}, r"model directory /nonexistent/model"),
    ("train-height", "train_grpo", [*TRAIN, "--set", "sample.height=33"], {}, r"height 33: must be a multiple of 16"),
    ("train-resume-nothing", "train_grpo", [*TRAIN, "--resume", "--output-dir", "{tmp}/new"], {},
     r"holds no complete checkpoint to continue from"),
    ("train-resume-overwrite", "train_grpo", [*TRAIN, "--resume", "--overwrite"], {}, r"resume and overwrite exclude"),
    ("train-existing-run", "train_grpo", [*TRAIN, "--output-dir", "{tmp}/run"], {"run/metrics.jsonl": "{}\n"},
     r"already holds a run \(metrics.jsonl\); pass --resume to continue it, --overwrite to replace it"),
    ("train-experts", "train_grpo", [*TRAIN, "--model", "tiny-wan2.2-a14b", "--set", "experts=[transformer_3]"], {},
     r"experts: \['transformer_3'\] must name some of this pipeline's transformers \['transformer', 'transformer_2'\]"),
    ("train-guidance-2", "train_grpo", [*TRAIN, "--set", "sample.guidance_2=3"], {},
     r"guidance_2 is the guidance of Wan 2.2 A14B's low-noise expert"),
    ("train-lora-neg", "train_grpo", [*TRAIN, "--set", "lora.rank=-1"], {}, r"rank must be >= 0"),
    ("train-vae-split", "train_grpo", [*TRAIN, "--set", "vae_split=columns"], {},
     r"vae_split: expected one of 'rows', 'samples', got 'columns'"),
    ("train-vae-split-serial", "train_grpo", [*TRAIN, "--set", "vae_split=samples", "--set", "parallel_vae=false"], {},
     r"vae_split: samples splits the decode over the SP ranks, and parallel_vae: false"),
    ("train-vae-batch", "train_grpo", [*TRAIN, "--set", "vae_batch=0"], {},
     r"vae_batch must be >= 1 \(or null: the micro-batch\), got 0"),
    ("train-tail-no-window", "train_grpo", [*TRAIN, "--set", "grpo.tail_steps=2"], {},
     r"tail_steps re-spaces the ODE steps after the SDE window, and there is none"),
    ("eval-seeds", "eval_toy", ["--seeds", "0"], {}, r"--seeds and --steps must be at least 1"),
    ("eval-no-prompts", "eval_toy", ["--prompts", "{tmp}/none.txt"], {}, r"prompt file .*none.txt does not exist"),
    ("eval-not-toy", "eval_toy", ["--prompts", "{tmp}/p.txt"], {"p.txt": "a cat surfing\n"}, r"p.txt: "),
    ("eval-no-model", "eval_toy", ["--model", "/nonexistent/model", "--seeds", "1"], {},
     r"model directory /nonexistent/model does not exist"),
    ("toy-steps", "train_toy", ["--vae-steps", "0"], {}, r"--vae-steps must be >= 1, got 0"),
]  # fmt: skip


def _save_consisid(path: Path) -> None:
    """A tiny ``ConsisIDPipeline`` directory at ``path`` (``consisid_checks.consisid_pipeline``)."""
    from consisid_checks import consisid_pipeline

    consisid_pipeline().save_pretrained(path)


_MODULAR: dict[str, Path] = {}
_MODULAR_LOCK = threading.Lock()


def _modular(path: Path, kind: str) -> None:
    """A tiny modular repository at ``path`` (``modular_repos.save_blocks_repository``): ``echo``, Echo's blocks over
    ``tiny-ltx2``; ``cosmos3``, Cosmos 3's distilled blocks over ``tiny-cosmos3`` with 4 ``distilled_sigmas``. Built once
    per kind, then copied (the cases run on two threads)."""
    import shutil

    import diffusers
    from modular_repos import save_blocks_repository

    with _MODULAR_LOCK:
        if kind in _MODULAR:
            shutil.copytree(_MODULAR[kind], path)
        elif kind == "echo":
            _MODULAR[kind] = save_blocks_repository("tiny-ltx2", "EchoBlocks", path)
        else:
            _MODULAR[kind] = save_blocks_repository("tiny-cosmos3", "Cosmos3DistilledBlocks", path,
                                                    config={"distilled_sigmas": [1.0, 0.75, 0.5, 0.25]},
                                                    scheduler=diffusers.FlowMatchEulerDiscreteScheduler())  # fmt: skip


def _write_clip(path: Path, frames: int) -> None:
    """A video of ``frames`` 16 x 16 PNG frames at ``path``."""
    from PIL import Image

    path.mkdir()
    for i in range(frames):
        Image.new("RGB", (16, 16), (i * 10, 0, 0)).save(path / f"{i:02d}.png")


def _run_case(case: tuple, tmp: Path) -> tuple[subprocess.CompletedProcess, float, Path]:
    """A case's CLI run in ``tmp``, its files written first (a text, or a function that writes at the path given)."""
    _, cli, argv, files, _ = case
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        text(tmp / name) if callable(text) else (tmp / name).write_text(text)
    argv = [arg.replace("{tmp}", str(tmp)) for arg in argv]
    began = time.monotonic()
    result = run_cli(f"pipelines.{cli}", argv, cwd=tmp)
    return result, time.monotonic() - began, tmp


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple]:
    """Every case's CLI run, two at a time (the cases are independent; this machine has 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case[0]: pool.submit(_run_case, case, tmp_path_factory.mktemp(case[0])) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(outcomes, case):
    result, elapsed, tmp = outcomes[case[0]]
    assert result.returncode != 0, result.stdout[-1000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(case[4].replace("{tmp}", re.escape(str(tmp))), result.stderr), result.stderr[-2000:]
    assert elapsed < 60, f"took {elapsed:.0f} s: the error should come before anything heavy"
    assert not (tmp / "outputs").exists(), "a refused run must not write outputs"


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)
