"""What the CLIs say about themselves: every flag of every CLI has help text and its default, usage reads the
command the user typed (``python -m pipelines.X`` or ``dit-sp COMMAND``), ``dit-sp --help`` lists the
commands, and ``--print-config`` prints the resolved settings as a config file that loads back equal,
starting nothing."""

from __future__ import annotations

import re

import pytest
import yaml
from cli_run import run_cli

from dit_sp import GenerateConfig, TrainConfig

pytestmark = pytest.mark.slow  # CLI processes (forked from a server with the imports done)
CLIS = {"generate": "generate", "train_grpo": "train", "serve": "serve", "reward_server": "serve-reward",
        "plan": "plan", "eval_toy": "eval-toy", "train_toy": "train-toy"}  # module: dit-sp command  # fmt: skip


def options(text: str) -> dict[str, str]:
    """``--help`` output's options: the first long flag of each entry -> its help (wrapped lines joined)."""
    section = text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    entries: dict[str, str] = {}
    flag = None
    for line in section.splitlines():
        entry = re.match(r"^  (-\S.*?)(?:\s{2,}(\S.*))?$", line)
        if entry:
            flag = next(f for f in re.findall(r"--[\w-]+", entry.group(1)))
            entries[flag] = entry.group(2) or ""
        else:
            entries[flag] = f"{entries[flag]} {line.strip()}".strip()
    return entries


@pytest.mark.parametrize("module", list(CLIS))
def test_every_flag_has_help_and_its_default(module, tmp_path):
    result = run_cli(f"pipelines.{module}", ["--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m pipelines.{module} "), result.stdout[:200]
    flags = options(result.stdout)
    assert len(flags) >= 4, flags
    for flag, text in flags.items():
        if flag == "--help":
            continue
        assert re.search(r"\w{3}", text.split("(default")[0]), f"{module} {flag}: no help text: {text!r}"
        assert "default" in text or text.endswith("(required)"), f"{module} {flag}: no default: {text!r}"
        assert "None" not in text and "False" not in text, f"{module} {flag}: a default in Python: {text!r}"


def test_defaults_are_the_resolved_ones(tmp_path):
    """generate's come from the default model where the model decides; train_grpo's are TrainConfig's."""
    generate = options(run_cli("pipelines.generate", ["--help"], cwd=tmp_path).stdout)
    model = GenerateConfig.load()
    assert f"(default: {model.model})" in generate["--model"]
    assert f"(default: the model's; {model.model}: {model.frames})" in generate["--frames"]
    assert f"(default: the model's; {model.model}: {model.steps})" in generate["--steps"]
    assert "(default: 1)" in generate["--ulysses"] and "(default: on)" in generate["--parallel-vae"]
    assert "(default: off)" in generate["--cfg-parallel"] and "(default: float32)" in generate["--dtype"]
    train = options(run_cli("pipelines.train_grpo", ["--help"], cwd=tmp_path).stdout)
    assert f"(default: {TrainConfig().max_steps})" in train["--max-steps"]
    assert "(default: off)" in train["--resume"] and "--print-config" in train


def test_dit_sp_lists_the_commands_and_runs_each_as_its_module(tmp_path):
    listing = run_cli("pipelines.cli", ["--help"], cwd=tmp_path)
    assert listing.returncode == 0 and listing.stdout.startswith("usage: dit-sp "), listing
    commands = dict(re.findall(r"^  ([a-z-]+) {2,}(\S.*)$", listing.stdout.split("\ncommands:\n", 1)[1], re.M))
    assert set(commands) == set(CLIS.values()), commands
    for module, command in CLIS.items():
        result = run_cli("pipelines.cli", [command, "--help"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: dit-sp {command} "), result.stdout[:200]
        alone = run_cli(f"pipelines.{module}", ["--help"], cwd=tmp_path).stdout
        assert options(result.stdout) == options(alone), command
    bare = run_cli("pipelines.cli", [], cwd=tmp_path)
    assert bare.returncode == 2 and "train-toy" in bare.stderr
    wrong = run_cli("pipelines.cli", ["gen"], cwd=tmp_path)
    assert wrong.returncode == 2 and "invalid choice: 'gen'" in wrong.stderr and "Traceback" not in wrong.stderr
    error = run_cli("pipelines.cli", ["generate", "--steps", "0"], cwd=tmp_path)  # a command's own errors
    assert error.returncode == 2 and "steps must be >= 1, got 0" in error.stderr, error.stderr


def test_generate_print_config_loads_back_and_starts_nothing(tmp_path):
    argv = ["--config", "wan2.1-t2v-1.3b", "--model", "tiny-wan", "--frames", "5", "--ulysses", "4",
            "--out", str(tmp_path / "v.mp4"), "--print-config"]  # fmt: skip
    printed = run_cli("pipelines.generate", argv, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    settings = yaml.safe_load(printed.stdout)
    assert (settings["frames"], settings["width"], settings["ulysses"]) == (5, 832, 4)  # flag, file, flag
    assert settings["cache_thresholds"] == {"first_block": 0.05, "teacache": 0.08}
    assert not (tmp_path / "v.mp4").exists() and "wrote" not in printed.stdout
    (tmp_path / "resolved.yaml").write_text(printed.stdout)
    again = run_cli("pipelines.generate", ["--config", str(tmp_path / "resolved.yaml"), "--print-config"], tmp_path)
    assert again.returncode == 0 and again.stdout == printed.stdout, again.stderr
    expected = GenerateConfig.load("wan2.1-t2v-1.3b", {"model": "tiny-wan", "frames": 5, "ulysses": 4,
                                                       "out": str(tmp_path / "v.mp4")})  # fmt: skip
    assert GenerateConfig.load(tmp_path / "resolved.yaml") == expected


def test_train_print_config_loads_back_and_starts_nothing(tmp_path):
    run = tmp_path / "run"
    argv = ["--config", "grpo_tiny_wan", "--set", "grpo.group_size=4", "--set", "optim.max_grad_norm=.inf",
            "--ulysses", "2", "--output-dir", str(run), "--print-config"]  # fmt: skip
    printed = run_cli("pipelines.train_grpo", argv, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    settings = yaml.safe_load(printed.stdout)
    assert settings["grpo"]["group_size"] == 4 and settings["grpo"]["steps"] == 10  # the file's other keys stay
    assert settings["ulysses"] == 2 and settings["optim"]["max_grad_norm"] == float("inf")
    assert not run.exists()
    (tmp_path / "resolved.yaml").write_text(printed.stdout)
    again = run_cli("pipelines.train_grpo", ["--config", str(tmp_path / "resolved.yaml"), "--print-config"], tmp_path)
    assert again.returncode == 0 and again.stdout == printed.stdout, again.stderr
    expected = TrainConfig.load("grpo_tiny_wan", {"grpo.group_size": 4, "optim.max_grad_norm": ".inf",
                                                  "ulysses": 2, "output_dir": str(run)})  # fmt: skip
    assert TrainConfig.load(tmp_path / "resolved.yaml") == expected
