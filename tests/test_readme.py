"""The README is a contract: every fenced code block in it (and the examples in the public modules'
docstrings) runs here, with the tiny models, local paths and small sizes substituted where it names a real
checkpoint, torchrun across nodes or a long run. Every substitution must find its text in the README, and
every block must be claimed by one entry below, so an example cannot change or appear without a test."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_run import run_cli

from dit_sp import spawn

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
pytestmark = pytest.mark.slow


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands(block: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, trailing comments dropped."""
    joined = block.replace("\\\n", " ")
    lines = [re.sub(r"\s+#.*$", "", line) for line in joined.splitlines() if line.strip()]
    return [" ".join(line.split()) for line in lines]


def substitute(text: str, replacements: list[tuple[str, str]]) -> str:
    for old, new in replacements:
        assert old in text, f"the README no longer contains {old!r}: update tests/test_readme.py with it"
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def tiny_wan_dir(tmp_path_factory) -> Path:
    """A stock ``WanPipeline`` directory (the tiny Wan), standing in for the README's real checkpoints."""
    from dit_sp.zoo import build_tiny

    path = tmp_path_factory.mktemp("ckpt") / "tiny-wan"
    build_tiny("tiny-wan").save_pretrained(path)
    return path


def _run(command: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """A README command: ``python -m MODULE ...`` and ``dit-sp COMMAND ...`` as they run it, forked with the
    imports done (the installed interpreter's and script's own start is tested in test_install); torchrun as
    it is."""
    argv = shlex.split(command)
    if argv[:2] == ["python", "-m"]:
        result = run_cli(argv[2], argv[3:], cwd=cwd, timeout=timeout)
    elif argv[0] == "dit-sp":  # the console script's entry point (the installed script itself: test_install)
        result = run_cli("pipelines.cli", argv[1:], cwd=cwd, timeout=timeout)
    else:
        if argv[0] == "torchrun":
            argv[:1] = [sys.executable, "-m", "torch.distributed.run"]
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


# ---------------------------------------------------------------------------------------------------------
# Shell blocks: each command of the README, and what the test changes in it.

SMALL = "--frames 5 --height 32 --width 32 --steps 2 --max-sequence-length 16"
SMALL_GRPO = "--set grpo.group_size=2 --set grpo.prompts_per_step=2 --set grpo.steps=2 --eval-every 0"


def shell_cases(ckpt: Path, tmp: Path) -> dict[str, list[str]]:
    """README command -> the command(s) the test runs, in README order (later ones may use earlier outputs)."""
    out = f"--out {tmp}/v.mp4"
    return {
        "pip install torch==2.13.0 -e . && python -m pipelines.generate --ulysses 2 --out outputs/video.mp4": [
            f"python -m pipelines.generate --ulysses 2 --out {tmp}/video.mp4"  # the install is CI's own step
        ],
        # .ci/run runs it: see test_the_readme_test_command_is_what_ci_runs
        'pip install torch==2.13.0 -e ".[dev]" && python -m pytest -n 2 --dist loadscope': [],
        "python -m pipelines.generate": [f"python -m pipelines.generate --steps 2 {out}"],
        "python -m pipelines.generate --ring 2 --ulysses 2": [
            f"python -m pipelines.generate --ring 2 --ulysses 2 --steps 2 {out}"
        ],
        "python -m pipelines.generate --cfg-parallel --ulysses 2": [
            f"python -m pipelines.generate --cfg-parallel --ulysses 2 --steps 2 {out}"
        ],
        "python -m pipelines.generate --model tiny-hunyuanvideo --out v.gif": [
            f"python -m pipelines.generate --model tiny-hunyuanvideo --steps 2 --out {tmp}/v.gif"
        ],
        "dit-sp generate --help": ["dit-sp generate --help"],
        "dit-sp generate --ulysses 2 --print-config": ["dit-sp generate --ulysses 2 --print-config"],
        "dit-sp train --config grpo_tiny_wan --print-config": ["dit-sp train --config grpo_tiny_wan --print-config"],
        "python -m pipelines.generate --model tiny-wan-i2v --image first_frame.png --ulysses 2": [
            f"python -m pipelines.generate --model tiny-wan-i2v --image first_frame.png --ulysses 2 --steps 2 {out}"
        ],
        "python -m pipelines.generate --model /ckpt/Wan2.1-T2V-1.3B-Diffusers --config wan2.1-t2v-1.3b": [
            f"python -m pipelines.generate --model {ckpt} --config wan2.1-t2v-1.3b --ulysses 1 {SMALL} {out}"
        ],
        "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 -m pipelines.generate "
        "--model /ckpt/Wan2.1-T2V-14B-Diffusers --config wan2.1-t2v-14b --ulysses 8 --cfg-parallel": [
            f"torchrun --standalone --nproc-per-node 2 -m pipelines.generate --model {ckpt} --config wan2.1-t2v-14b "
            f"--ulysses 1 --cfg-parallel {SMALL} {out}"
        ],
        "python -m pipelines.generate --model /ckpt/Wan2.1-T2V-14B-Diffusers --config wan2.1-t2v-14b --ulysses 2 "
        "--shard-weights": [
            f"python -m pipelines.generate --model {ckpt} --config wan2.1-t2v-14b --ulysses 2 --shard-weights {SMALL} "
            f"{out}"
        ],
        "python -m pipelines.plan --config grpo_hunyuanvideo --gpus 32 --gpu-memory 80": [
            "python -m pipelines.plan --config grpo_hunyuanvideo --gpus 32 --gpu-memory 80"
        ],
        "python -m pipelines.plan --generate --config wan2.1-t2v-14b --gpus 8 --gpu-memory 40": [
            "python -m pipelines.plan --generate --config wan2.1-t2v-14b --gpus 8 --gpu-memory 40"
        ],
        "python -m pipelines.train_grpo --config grpo_tiny_wan": [
            f"python -m pipelines.train_grpo --config grpo_tiny_wan --max-steps 1 {SMALL_GRPO} --output-dir {tmp}/g1"
        ],
        "python -m pipelines.train_grpo --config grpo_tiny_wan --ulysses 2": [
            f"python -m pipelines.train_grpo --config grpo_tiny_wan --ulysses 2 --max-steps 1 --checkpoint-every 1 "
            f"{SMALL_GRPO} --output-dir {tmp}/g2"
        ],
        "python -m pipelines.train_grpo --config grpo_tiny_wan --resume": [
            f"python -m pipelines.train_grpo --config grpo_tiny_wan --resume --max-steps 2 {SMALL_GRPO} "
            f"--output-dir {tmp}/g2"  # continues the run above from its step-1 checkpoint
        ],
        "python -m pipelines.train_grpo --config grpo_tiny_wan --set grpo.group_size=4 --set optim.lr=3e-5": [
            f"python -m pipelines.train_grpo --config grpo_tiny_wan --set grpo.group_size=4 --set optim.lr=3e-5 "
            f"--max-steps 1 --set grpo.prompts_per_step=1 --set grpo.steps=2 --eval-every 0 --output-dir {tmp}/g3"
        ],
        "python -m pipelines.eval_toy": ["python -m pipelines.eval_toy --seeds 1 --steps 2"],
        "python -m pipelines.serve --model tiny-wan --ulysses 2 --port 8000 --job-dir outputs/serve": [],  # a server:
        # test_readme_serving_example starts it and runs the client block against it
        "python -m pipelines.generate --cache teacache:0.2 --ulysses 2": [
            f"python -m pipelines.generate --cache teacache:0.2 --ulysses 2 --steps 6 {out}"
        ],
        # run with its output checked by tests/cache/test_cache.py::test_generate_cli_with_cache_and_compile
        "python -m pipelines.generate --cache first_block --compile --cfg-parallel --ulysses 2": [],
        "python -m pipelines.eval_toy --cache teacache:0.2 --baseline toy-wan": [
            "python -m pipelines.eval_toy --cache teacache:0.2 --baseline toy-wan --seeds 1 --steps 4"
        ],
        "python -m pipelines.train_grpo --config grpo_toy --ulysses 2": [
            f"python -m pipelines.train_grpo --config grpo_toy --ulysses 2 --max-steps 1 {SMALL_GRPO} "
            f"--output-dir {tmp}/grpo_toy"
        ],
        "python -m pipelines.eval_toy --model outputs/grpo_toy/final --baseline toy-wan --guidance 1": [
            f"python -m pipelines.eval_toy --model {tmp}/grpo_toy/final --baseline toy-wan --guidance 1 --seeds 1 "
            "--steps 2"
        ],
    }


CHAINS = {  # README commands that use an earlier command's output run after it, in one test
    "python -m pipelines.train_grpo --config grpo_tiny_wan --resume": "python -m pipelines.train_grpo --config "
    "grpo_tiny_wan --ulysses 2",
    "python -m pipelines.eval_toy --model outputs/grpo_toy/final --baseline toy-wan --guidance 1": "python -m "
    "pipelines.train_grpo --config grpo_toy --ulysses 2",
}


def readme_commands() -> list[str]:
    return [command for block in blocks("bash") for command in commands(block)]


def chains() -> list[list[str]]:
    """The README's commands in groups that run in one test each (a command after the one whose output it
    uses), in README order: independent groups can run on separate test workers."""
    groups: dict[str, list[str]] = {}
    for command in readme_commands():
        groups.setdefault(CHAINS.get(command, command), []).append(command)
    runs = shell_cases(Path("/ckpt"), Path("/tmp"))  # a command that CI or another test runs has none here
    return [chain for chain in groups.values() if any(runs.get(command) for command in chain)]


def test_every_test_file_the_docs_name_exists():
    """Each ``tests/...py`` path named in README.md or docs/ (a renamed test file leaves a stale name behind)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    named = {(page.name, path) for page in pages for path in re.findall(r"tests/[\w/.\-]*?\.py", page.read_text())}
    assert len(named) > 20  # the pattern finds the docs' test paths
    assert [(page, path) for page, path in sorted(named) if not (REPO / path).is_file()] == []


def test_every_shell_command_of_the_readme_has_a_test(tmp_path):
    cases = shell_cases(Path("/ckpt"), tmp_path)
    assert sorted(readme_commands()) == sorted(cases), "a README command has no test (or a test lost its command)"
    assert all(command in cases for chain in CHAINS.items() for command in chain)


@pytest.mark.parametrize("chain", chains(), ids=lambda chain: chain[0][:60])
def test_every_shell_command_of_the_readme_runs(chain, tiny_wan_dir, tmp_path):
    cases = shell_cases(tiny_wan_dir, tmp_path)
    for command in chain:
        for run in cases[command]:
            result = _run(run, cwd=tmp_path)
            if "pipelines.generate" in run:
                assert "wrote " in result.stdout, result.stdout
            if "--cache" in run:
                assert "skipped" in result.stdout or '"saved_fraction"' in result.stdout, result.stdout
            if "pipelines.eval_toy" in run:
                assert '"faithfulness"' in result.stdout, result.stdout
            if run.endswith("--help"):
                assert result.stdout.startswith("usage: dit-sp generate ") and "(default: " in result.stdout
            if run.endswith("--print-config"):  # YAML that --config takes, nothing run
                assert ("ulysses: 2\n" if "generate" in run else "output_dir: outputs/grpo_tiny_wan\n") in result.stdout
                assert not (tmp_path / "outputs").exists()
        if command == "python -m pipelines.train_grpo --config grpo_tiny_wan --resume":
            rows = (tmp_path / "g2" / "metrics.jsonl").read_text().splitlines()
            assert len(rows) == 2  # the resumed run kept step 0 and added step 1


def test_the_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install --quiet torch==2.13.0 -e ".[dev]"' in ci and "python -m pytest -q -n 2 --dist loadscope" in ci


# ---------------------------------------------------------------------------------------------------------
# Python blocks: run in spawned workers (each worker is one rank, as under torchrun).


def run_snippet(code: str, cwd: str, names: tuple[str, ...]) -> dict:
    """In a worker: run ``code`` as a script in ``cwd``; return the named variables it left."""
    os.chdir(cwd)
    scope: dict = {"__name__": "__main__"}
    exec(compile(code, "<README>", "exec"), scope)
    return {name: scope[name] for name in names}


def python_block(marker: str) -> str:
    found = [block for block in blocks("python") if marker in block]
    assert len(found) == 1, f"exactly one README python block should contain {marker!r}"
    return found[0]


ONE_LINE = "parallelize(pipe, parallel)  # the one line"
USP = "out = usp_attention(q, k, v, parallel, seq_len=S)"
TRAINER = "trainer = GRPOTrainer(config"
SPLIT_VAE = "parallelize_vae(vae, parallel)  # decode and encode split over the processes of a sample"
CACHED = 'handle = parallelize(pipe, parallel, cache="first_block:0.1", compile=True)'
CLIENT = 'client = OpenAI(base_url="http://127.0.0.1:8000/v1"'
LORA = 'pipe.load_lora_weights("outputs/lora_run/final/lora")'


def test_every_python_block_has_a_test():
    markers = (ONE_LINE, USP, TRAINER, SPLIT_VAE, CACHED, CLIENT, LORA)
    for block in blocks("python"):
        assert sum(marker in block for marker in markers) == 1, f"no test runs this README block:\n{block}"


def test_readme_one_line_example_on_two_processes_equals_one_process(tiny_wan_dir, tmp_path):
    """The README's stock ``WanPipeline`` made sequence-parallel by ``parallelize`` (Ulysses 2 here) gives the
    frames of the stock pipeline in one process."""
    code = substitute(python_block(ONE_LINE), [
        ("ParallelConfig(ulysses=4, ring=2)", "ParallelConfig(ulysses=2)"),
        ('"/ckpt/Wan2.1-T2V-1.3B-Diffusers"', repr(str(tiny_wan_dir))),
        ("torch_dtype=torch.bfloat16", "torch_dtype=torch.float32"),
        ("num_frames=81, height=480, width=832,", "num_frames=5, height=32, width=32, num_inference_steps=2,"),
    ])  # fmt: skip
    parallel = spawn(run_snippet, 2, args=(code, str(tmp_path), ("video",)), timeout=300)
    stock = substitute(code, [("ParallelConfig(ulysses=2)", "ParallelConfig()"), (ONE_LINE, "")])
    single = spawn(run_snippet, 1, args=(stock, str(tmp_path), ("video",)), timeout=300)[0]["video"]
    assert single.shape == (5, 32, 32, 3) and single.std() > 0.01
    for rank in parallel:
        assert abs(rank["video"] - single).max() <= 1e-4


def test_readme_parallel_vae_example_equals_one_process(tiny_wan_dir, tmp_path):
    """The README's ``parallelize_vae`` on 2 processes decodes the frames one process decodes."""
    code = substitute(python_block(SPLIT_VAE), [
        ("ParallelConfig(ulysses=8)", "ParallelConfig(ulysses=2)"),
        ('"/ckpt/Wan2.1-T2V-14B-Diffusers"', repr(str(tiny_wan_dir))),
        ("torch.randn(1, 16, 21, 60, 104,", "torch.randn(1, 4, 3, 6, 5,"),
    ])  # fmt: skip
    parallel = spawn(run_snippet, 2, args=(code, str(tmp_path), ("video",)), timeout=300)
    stock = substitute(code, [("ParallelConfig(ulysses=2)", "ParallelConfig()"), (SPLIT_VAE, "")])
    single = spawn(run_snippet, 1, args=(stock, str(tmp_path), ("video",)), timeout=300)[0]["video"]
    assert single.shape == (1, 3, 9, 48, 40) and single.std() > 0.01
    for rank in parallel:
        assert (rank["video"] - single).abs().max() <= 1e-4


def test_readme_cache_and_compile_example_equals_the_cached_one_process_run(tmp_path):
    """The README's ``parallelize(..., cache=..., compile=True)`` on Ulysses 2 skips what one process
    skips (``enable_cache`` there, eager) and gives its frames."""
    code = python_block(CACHED) + "saved = handle.cache.stats.saved_fraction\n"
    parallel = spawn(run_snippet, 2, args=(code, str(tmp_path), ("video", "saved")), timeout=600)
    single = substitute(code, [
        ("ParallelConfig(ulysses=2)", "ParallelConfig()"),
        (CACHED, 'from dit_sp.cache import enable_cache\nhandle = enable_cache(pipe, "first_block:0.1")'),
        ("handle.cache.stats", "handle.stats"),
    ])  # fmt: skip
    expected = spawn(run_snippet, 1, args=(single, str(tmp_path), ("video", "saved")), timeout=300)[0]
    assert 0.1 < expected["saved"] < 0.9
    for rank in parallel:
        assert rank["saved"] == expected["saved"]
        assert abs(rank["video"] - expected["video"]).max() <= 1e-4


def test_readme_usp_example_equals_attention_over_the_whole_sequence(tmp_path):
    code = substitute(python_block(USP), [("ParallelConfig(ring=2, ulysses=4)", "ParallelConfig(ring=2, ulysses=2)")])
    results = spawn(run_snippet, 4, args=(code, str(tmp_path), ("y", "tokens", "H", "D")), timeout=300)
    tokens, heads, dim = results[0]["tokens"], results[0]["H"], results[0]["D"]
    q = tokens.unflatten(2, (heads, dim)).transpose(1, 2)
    expected = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).flatten(2)
    for rank in results:
        torch.testing.assert_close(rank["y"], expected, atol=1e-5, rtol=0)


def test_readme_trainer_example_steps_and_exports(tmp_path):
    code = substitute(python_block(TRAINER), [
        ('{"max_steps": 2, "output_dir": "outputs/notebook"}',
         '{"max_steps": 2, "output_dir": "outputs/notebook", "grpo.group_size": 2, "grpo.prompts_per_step": 1, '
         '"grpo.steps": 2, "eval_every": 0}'),
    ])  # fmt: skip
    result = spawn(run_snippet, 1, args=(code, str(tmp_path), ("row",)), timeout=300)[0]
    assert result["row"]["step"] == 1
    assert (tmp_path / "outputs/notebook/final/model_index.json").is_file()
    assert len((tmp_path / "outputs/notebook/metrics.jsonl").read_text().splitlines()) == 2


def test_readme_lora_example_equals_the_merged_export(tiny_wan_dir, tmp_path):
    """The README's LoRA run (from a checkpoint directory, rank 4 here), then its ``final/lora`` loaded by the
    stock ``WanPipeline`` onto the base: the merged export's frames within 1e-4."""
    code = substitute(python_block(LORA), [
        ('"grpo_wan2.1_1.3b"', '"grpo_tiny_wan"'),
        ('"output_dir": "outputs/lora_run"}', '"output_dir": "outputs/lora_run", "lora.rank": 4, "max_steps": 1, '
         '"grpo.group_size": 2, "grpo.prompts_per_step": 1, "grpo.steps": 2, "eval_every": 0, "optim.lr": 0.01}'),
        ('"/ckpt/Wan2.1-T2V-1.3B-Diffusers"', repr(str(tiny_wan_dir))),
        ("torch_dtype=torch.bfloat16", "torch_dtype=torch.float32"),
        ("num_frames=33, height=240, width=416,", "num_frames=5, height=32, width=32, num_inference_steps=2, "
         "max_sequence_length=16, generator=torch.Generator().manual_seed(0),"),
    ])  # fmt: skip
    video = spawn(run_snippet, 1, args=(code, str(tmp_path), ("video",)), timeout=300)[0]["video"]
    from diffusers import WanPipeline

    def frames(directory):
        pipe = WanPipeline.from_pretrained(directory, torch_dtype=torch.float32)
        return pipe(
            "a red circle moving left",
            num_frames=5,
            height=32,
            width=32,
            num_inference_steps=2,
            max_sequence_length=16,
            generator=torch.Generator().manual_seed(0),
            output_type="np",
        ).frames[0]

    expected, before = frames(tmp_path / "outputs/lora_run/final"), frames(tiny_wan_dir)
    assert video.shape == (5, 32, 32, 3) and video.std() > 0.01
    assert abs(video - before).max() > 1e-3  # the trained adapters change the video
    assert abs(video - expected).max() <= 1e-4


def test_readme_serving_example(tmp_path):
    """The README's server command, started as written (on a free port), and its client block against it."""
    from serve_run import Server

    pytest.importorskip("openai")
    command = next(c for b in blocks("bash") for c in commands(b) if c.startswith("python -m pipelines.serve "))
    server = Server(shlex.split(command)[3:], cwd=tmp_path)  # its --port 8000 is overridden by --port 0
    try:
        code = substitute(python_block(CLIENT), [
            ("http://127.0.0.1:8000", server.url),
            ('"num_inference_steps": 20', '"num_inference_steps": 2'),
        ])  # fmt: skip
        run_snippet(code, str(tmp_path), ())
        import imageio.v3 as iio

        assert iio.imread(tmp_path / "circle.mp4").shape == (9, 32, 32, 3)  # 1 s at 8 fps, as 8 + 1 frames
        assert len(list((tmp_path / "outputs" / "serve").glob("video_*/video.mp4"))) == 1
        assert server.terminate(60) == 0, server.output
    finally:
        server.kill()


# ---------------------------------------------------------------------------------------------------------
# Docstring examples of the public modules.


def docstring_example(module_name: str) -> str:
    import importlib

    doc = importlib.import_module(module_name).__doc__
    lines = re.search(r"\n\n((?:    .*\n|\n)+)", doc).group(1)
    return textwrap.dedent(lines)


def test_public_api_docstring_imports_work():
    code = docstring_example("dit_sp")
    assert code.count("from dit_sp import") == 4
    exec(code, {})


def test_trainer_docstring_example_runs(tmp_path):
    code = substitute(docstring_example("dit_sp.rl.trainer"), [
        ('{"max_steps": 2}', '{"max_steps": 2, "grpo.group_size": 2, "grpo.prompts_per_step": 1, "grpo.steps": 2}'),
    ])  # fmt: skip
    result = spawn(run_snippet, 1, args=(code, str(tmp_path), ("row",)), timeout=300)[0]
    assert result["row"]["step"] == 1 and (tmp_path / "outputs/final/model_index.json").is_file()


def test_sampling_docstring_example_runs(tmp_path):
    code = substitute(docstring_example("dit_sp.inference"), [('{"ulysses": 2}', '{"ulysses": 2, "steps": 2}')])
    result = spawn(run_snippet, 1, args=(code, str(tmp_path), ("report",)), timeout=300)[0]
    assert Path(tmp_path, result["report"]["out"]).is_file()


def test_train_config_docstring_example_parses():
    import yaml

    from dit_sp import TrainConfig

    config = TrainConfig.from_dict(yaml.safe_load(docstring_example("dit_sp.rl.config")))
    assert config.lora.rank == 8 and config.grpo.sde_window == (0, 2) and config.grpo.sde.kind == "flow"
