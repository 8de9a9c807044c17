"""The sharded text encoder (``dit_sp.weights.encoder``): on 2 processes its output equals one process's in
fp32 (UMT5 for Wan, Llama and CLIP for HunyuanVideo), each process holds about half of the weights, and in
bf16 it equals a one-process bf16 encoder (its difference to fp32 is printed: what mixed precision costs)."""

from __future__ import annotations

import pytest
import torch
from encoder_checks import ENCODERS, build, outputs, sharded_encoders, token_ids

from dit_sp import spawn


@pytest.mark.slow  # 2 workers
def test_sharded_encoders_are_exact_and_hold_half(tmp_path):
    directories, full, reference, bf16 = {}, {}, {}, {}
    for name in ENCODERS:
        model = build(name)
        model.save_pretrained(tmp_path / name)
        directories[name] = str(tmp_path / name)
        full[name] = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        reference[name] = outputs(model, token_ids(name))
        bf16[name] = outputs(type(model).from_pretrained(tmp_path / name, dtype=torch.bfloat16), token_ids(name))
    results = spawn(sharded_encoders, 2, args=(directories,), timeout=300)
    for name in ENCODERS:
        for rank, result in enumerate(results):
            got = result[name]
            assert torch.allclose(got["fp32"], reference[name], rtol=0, atol=1e-5), (name, rank)
            assert torch.allclose(got["in_place"], reference[name], rtol=0, atol=1e-5), (name, rank)
            assert got["again"], name  # the gathered weights were released and gathered again
            assert torch.allclose(got["bf16"], bf16[name], rtol=0, atol=2e-2 * bf16[name].abs().max()), name
            assert 0.4 * full[name] < got["bytes"] < 0.6 * full[name], (name, got["bytes"], full[name])
            assert 0.4 * full[name] < got["in_place_bytes"] < 0.6 * full[name], name
            assert "token ids must lie in [0," in got["bad_id"], name
        error = (results[0][name]["bf16"] - reference[name]).abs().max() / reference[name].abs().max()
        print(f"{name}: bf16 vs fp32 embeddings, max |difference| / max |value| = {error:.2e}")
        assert error < 5e-2, name


@pytest.mark.slow  # 2 workers
def test_grpo_set_up_encodes_in_the_compute_dtype_and_frees_the_encoders(tmp_path):
    from encoder_checks import trainer_embeddings
    from grpo_checks import tiny_config

    from dit_sp.zoo import build_tiny

    build_tiny("tiny-wan").save_pretrained(tmp_path / "tiny-wan")  # fp32 set-ups: tests/weights/test_scale.py
    config = tiny_config(model=str(tmp_path / "tiny-wan"), ulysses=2, mixed_precision="bfloat16")
    results = spawn(trainer_embeddings, 2, args=(config,), timeout=300)
    assert all(r == {"dtype": "torch.bfloat16", "text_encoder": False} for r in results), results
