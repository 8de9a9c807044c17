"""Memory is a feature: with a mid-size model (hundreds of millions of parameters, real head sizes) saved
with ``save_pretrained``, two processes each hold at most 0.6x of what one process holds, for GRPO set-up
plus a step and for weight-sharded generation; micro-batches bound a step's activations."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
import torch
from scale_checks import generate_peak, step_memory, train_peaks

from dit_sp import GenerateConfig, TrainConfig, spawn
from dit_sp.zoo import build_tiny

pytestmark = pytest.mark.slow  # builds and saves models of 0.4-1 B parameters, trains and samples them

HEADS = {"num_attention_heads": 12, "attention_head_dim": 128}  # Wan 2.1 1.3B's width: 1536, 128 per head


def _save_mid_size(path, layers: int) -> None:
    """tiny-wan's VAE and text encoder around a WanTransformer3DModel of Wan 1.3B's width and ``layers``."""
    from diffusers import WanTransformer3DModel

    pipe = build_tiny("tiny-wan")
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), **HEADS, in_channels=4, out_channels=4, text_dim=16,
                                        freq_dim=256, ffn_dim=8960, num_layers=layers, cross_attn_norm=True,
                                        qk_norm="rms_norm_across_heads", rope_max_seq_len=32)  # fmt: skip
    pipe.register_modules(transformer=transformer)
    pipe.save_pretrained(path)


def test_grpo_setup_and_step_per_process_memory_halves(tmp_path):
    _save_mid_size(tmp_path / "mid", layers=6)  # 295 M parameters: 1.2 GB in fp32, 4.7 GB with Adam
    base = {"model": str(tmp_path / "mid"), "prompts": "toy_prompts_train.txt", "checkpoint_every": 0,
            "sample": {"frames": 5, "height": 32, "width": 32, "guidance": 1.0, "max_sequence_length": 16},
            "grpo": {"steps": 2, "group_size": 2, "prompts_per_step": 1, "train_fraction": 0.5}}  # fmt: skip
    # one trained timestep: the step's peak is weights, gradients and Adam state; a second only repeats its activations
    one = spawn(train_peaks, 1, args=(TrainConfig.from_dict(base | {"output_dir": tempfile.mkdtemp()}),),
                timeout=900)[0]  # fmt: skip
    two = spawn(train_peaks, 2, args=(TrainConfig.from_dict(base | {"ulysses": 2, "output_dir": tempfile.mkdtemp()}),),
                timeout=900)  # fmt: skip
    print(f"GRPO peak RSS, MiB: 1 process {one}; 2 processes {two}")
    for rank in two:
        assert rank["step"] <= 0.6 * one["step"], (rank, one)
        assert rank["setup"] <= 0.7 * one["setup"], (rank, one)  # loading: each rank reads its own shards


def test_weight_sharded_generate_per_process_memory(tmp_path):
    _save_mid_size(tmp_path / "mid", layers=20)  # 950 M parameters: 3.8 GB in fp32
    # one step, no guidance: every module's weights are gathered (and freed) once; more steps only repeat that
    config = GenerateConfig(model=str(tmp_path / "mid"), steps=1, guidance=1.0, frames=5, height=32, width=32,
                            max_sequence_length=16, out=str(tmp_path / "v.mp4"))  # fmt: skip
    one = spawn(generate_peak, 1, args=(config,), timeout=900)[0]
    two = spawn(generate_peak, 2, args=(dataclasses.replace(config, ulysses=2, shard_weights=True),), timeout=900)
    print(f"generate peak RSS, MiB: 1 process {one:.0f}; 2 processes with --shard-weights {two}")
    assert max(two) <= 0.6 * one


def test_micro_batches_bound_the_activation_memory():
    wide = {"patch_size": (1, 2, 2), "num_attention_heads": 3, "attention_head_dim": 128, "in_channels": 4,
            "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 1536, "num_layers": 4,
            "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 64}  # fmt: skip
    base = {"max_steps": 2, "checkpoint_every": 0, "prompts": "toy_prompts_train.txt",
            "sample": {"frames": 5, "height": 192, "width": 192, "guidance": 2.0, "max_sequence_length": 16},
            "grpo": {"steps": 2, "group_size": 2, "prompts_per_step": 2, "train_fraction": 1.0}}  # fmt: skip
    added = {}
    for micro in (None, 1):
        values = base | {"output_dir": tempfile.mkdtemp()}
        values["grpo"] = base["grpo"] | {"micro_batch": micro}
        added[micro] = spawn(step_memory, 1, args=(TrainConfig.from_dict(values), wide), timeout=900)[0]["added"]
    print(f"a 4-sample step adds {added[None]:.0f} MiB in one batch, {added[1]:.0f} MiB in micro-batches of 1")
    assert added[1] <= 0.6 * added[None]
