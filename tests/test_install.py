"""A non-editable install works away from the repository: configs, tiny model specs and the toy model travel
inside the package, the first README command runs from another directory, and so does the ``dit-sp`` console
script; what the stock pipelines need at run time is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_package_runs_the_first_readme_command_from_another_directory(tmp_path):
    site, source = tmp_path / "site", tmp_path / "source"
    # A copy of the repository (the build writes into its source tree), installed alone: its dependencies
    # are this environment's.
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "outputs", "*.egg-info"))
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
               "--target", str(site), str(source)]  # fmt: skip
    result = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (site / "dit_sp" / "assets" / "toy-wan" / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
    assert (site / "dit_sp" / "configs" / "grpo_toy.yaml").is_file()
    # one copy in the repository: the top-level configs/ and assets/, none inside the package's source
    assert (REPO / "configs" / "grpo_toy.yaml").is_file() and (REPO / "assets" / "toy-wan").is_dir()
    assert not (REPO / "dit_sp" / "configs").exists() and not (REPO / "dit_sp" / "assets").exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = os.environ | {"PYTHONPATH": str(site)}
    code = "import dit_sp, pipelines; print(dit_sp.__file__, pipelines.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.returncode == 0 and all(p.startswith(str(site)) for p in where.stdout.split()), where
    command = [sys.executable, "-m", "pipelines.generate", "--ulysses", "2", "--steps", "2",
               "--out", "outputs/video.mp4"]  # fmt: skip
    result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote outputs/video.mp4" in result.stdout and (elsewhere / "outputs" / "video.mp4").stat().st_size > 0
    # the console script (pyproject's [project.scripts]) runs the same CLIs: dit-sp train = pipelines.train_grpo
    script = site / "bin" / "dit-sp"
    listing = subprocess.run([str(script), "--help"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert listing.returncode == 0 and "serve-reward" in listing.stdout, listing
    usage = subprocess.run([str(script), "generate", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: dit-sp generate "), usage
    bundled = [str(script), "train", "--config", "grpo_tiny_wan", "--max-steps", "1",
               "--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=1", "--set", "grpo.steps=2",
               "--output-dir", "outputs/g"]  # fmt: skip
    result = subprocess.run(bundled, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (elsewhere / "outputs" / "g" / "final" / "model_index.json").is_file()


def test_wan_prompts_are_cleaned_as_the_stock_pipelines_expect():
    """diffusers' Wan pipelines fix mojibake in prompts with ftfy when it is installed and skip it silently
    otherwise (other embeddings than the reference); the project installs it."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    assert prompt_clean("a caf\u00c3\u00a9 at night") == "a caf\u00e9 at night"
