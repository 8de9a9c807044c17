"""LoRA (``dit_sp.train.lora``): the adapters' gradients on every layout, their KL term, the merged export."""

from __future__ import annotations

import sys

import pytest
import torch
from cli_run import run_python
from grpo_checks import step_gradients, tiny_config
from train_runs import assert_grads_equal, max_error, metrics_rows

from dit_sp import spawn

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLIs end to end


def test_lora_step_trains_only_the_adapters():
    """LoRA: one process and Ulysses 2 give the same adapter gradients; the base weights get none."""
    one = spawn(step_gradients, 1, args=(tiny_config(lora_rank=4),), timeout=300)[0]
    two = spawn(step_gradients, 2, args=(tiny_config(lora_rank=4, ulysses=2),), timeout=300)[0]
    assert one["grads"] and all("lora" in name for name in one["grads"])
    assert_grads_equal(two["grads"], one["grads"], f"rank {two['rank']}")


@pytest.mark.parametrize(("ring", "ulysses"), [(1, 2), (2, 1)])
def test_lora_kl_step_equals_single_process(ring, ulysses):
    """LoRA with a KL term to the adapters-off model: with moved adapters the KL is positive, changes the
    gradient, and every layout gives the single-process gradient."""
    lora = {"lora_rank": 4, "kl_coef": 1.0}
    one = spawn(step_gradients, 1, args=(tiny_config(**lora), 0.05), timeout=300)[0]
    no_kl = spawn(step_gradients, 1, args=(tiny_config(lora_rank=4), 0.05), timeout=300)[0]
    assert one["kl"] > 1e-6 and no_kl["kl"] == 0.0
    assert max_error(one["grads"], no_kl["grads"]) > 1e-4  # the KL term reaches the adapters
    results = spawn(step_gradients, 2, args=(tiny_config(ring=ring, ulysses=ulysses, **lora), 0.05), timeout=300)
    for result in results:
        assert abs(result["kl"] - one["kl"]) <= 1e-6 * max(1.0, one["kl"])
        assert_grads_equal(result["grads"], one["grads"], f"rank {result['rank']}")


def test_lora_run_exports_plain_merged_weights(tmp_path):
    """A LoRA run exports a plain diffusers transformer (adapters merged, no peft layers) that generate loads.
    Its KL term is to the model with the adapters off: zero at the start (the adapters start at zero),
    positive once they have moved."""
    from safetensors.torch import load_file

    config = tmp_path / "lora.yaml"
    config.write_text("sample: {frames: 5, height: 32, width: 32}\n"
                      "grpo: {steps: 2, group_size: 2, prompts_per_step: 1, kl_coef: 0.1}\n"
                      "optim: {lr: 0.01}\nlora: {rank: 4}\nprompts: prompts_demo.txt\n")  # fmt: skip
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pipelines.train_grpo", "--config", str(config), "--output-dir", str(out),
           "--max-steps", "2", "--checkpoint-every", "0"]  # fmt: skip
    run_python(cmd, check=True, timeout=300)
    kl = [row["kl"] for row in metrics_rows(out)]
    assert kl[0] == 0.0 and kl[1] > 1e-8, kl
    exported = load_file(next((out / "final" / "transformer").glob("*.safetensors")))
    from dit_sp.zoo import build_tiny

    base = build_tiny("tiny-wan", "transformer").state_dict()
    assert exported.keys() == base.keys()  # no lora_A/B, no base_layer
    changed = [k for k in base if not torch.equal(exported[k], base[k])]
    assert changed and all(".to_" in k for k in changed)  # only the adapted attention projections moved
    gen = run_python([sys.executable, "-m", "pipelines.generate", "--model", str(out / "final"), "--frames", "5",
                      "--height", "32", "--width", "32", "--steps", "2", "--out", str(tmp_path / "v.gif")],
                     timeout=300)  # fmt: skip
    assert gen.returncode == 0, gen.stderr[-2000:]
