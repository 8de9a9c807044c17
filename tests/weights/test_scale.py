"""Real checkpoints at scale: models built empty and filled shard-wise from safetensors, weight-sharded
inference, the lean GRPO setup (prompt embeddings computed once, encoders freed) equal to the plain one."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from cli_run import run_python
from grpo_checks import tiny_config
from scale_checks import filled_shards, lean_and_whole_setup_and_step, setup_and_step, sharded_transformer

from dit_sp import spawn
from dit_sp.errors import MissingFileError
from dit_sp.rl.embeddings import PromptEmbeddings
from dit_sp.weights import SafetensorsCheckpoint, empty_model, load_shards, parameters_on_meta
from dit_sp.zoo import build_tiny, load_pipeline


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """tiny-wan saved with save_pretrained, its transformer in several safetensors files."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny-wan"
    pipe = build_tiny("tiny-wan")
    pipe.save_pretrained(path)
    pipe.transformer.save_pretrained(path / "transformer", max_shard_size="40KB")  # an index and shards
    return path


def test_empty_model_holds_no_weights_and_keeps_its_buffers(checkpoint):
    model = empty_model(checkpoint / "transformer", torch.float32)
    assert all(p.is_meta for p in model.parameters())
    reference = load_pipeline(str(checkpoint), torch.float32).transformer
    buffers = dict(reference.named_buffers())
    for name, buffer in model.named_buffers():  # rotary tables, computed in __init__
        assert not buffer.is_meta and torch.equal(buffer, buffers[name]), name
    with parameters_on_meta():
        pass
    assert not torch.nn.Linear(2, 2).weight.is_meta  # the patch is undone


def test_checkpoint_reads_rows_and_flat_ranges(checkpoint):
    files = list((checkpoint / "transformer").glob("*.safetensors"))
    assert len(files) > 1 and (checkpoint / "transformer" / "diffusion_pytorch_model.safetensors.index.json").exists()
    reader = SafetensorsCheckpoint(checkpoint / "transformer")
    state = load_pipeline(str(checkpoint), torch.float32).transformer.state_dict()
    assert reader.keys() == set(state)
    for name, tensor in state.items():
        rows = max(tensor.shape[0] // 2, 1) if tensor.dim() else 0
        last = (slice(len(tensor) - rows, len(tensor)),) if tensor.dim() else ()
        region = (*last, *(slice(0, n) for n in tensor.shape[1:]))  # the last half of the rows
        assert torch.equal(reader.read(name, region), tensor[region] if region else tensor), name
        flat = tensor.reshape(-1)
        assert torch.equal(reader.read_flat(name, 1, flat.numel() - 1), flat[1:]), name
    with pytest.raises(IndexError, match="elements"):
        reader.read_flat("proj_out.weight", 1, state["proj_out.weight"].numel())


def test_load_shards_in_one_process_equals_from_pretrained(checkpoint):
    model = empty_model(checkpoint / "transformer", torch.float32)
    load_shards(model, checkpoint / "transformer")
    reference = load_pipeline(str(checkpoint), torch.float32).transformer.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference[name]), name


def test_mismatched_or_missing_weights_are_named(checkpoint, tmp_path):
    from safetensors.torch import save_file

    directory = tmp_path / "transformer"
    directory.mkdir()
    (directory / "config.json").write_text((checkpoint / "transformer" / "config.json").read_text())
    with pytest.raises(MissingFileError, match="holds no .safetensors weights"):
        load_shards(empty_model(directory, torch.float32), directory)
    state = load_pipeline(str(checkpoint), torch.float32).transformer.state_dict()
    state.pop("proj_out.weight")
    state["extra.weight"] = torch.zeros(2)
    save_file(state, directory / "diffusion_pytorch_model.safetensors")
    with pytest.raises(MissingFileError, match=r"missing \['proj_out.weight'\], unexpected \['extra.weight'\]"):
        load_shards(empty_model(directory, torch.float32), directory)
    with pytest.raises(MissingFileError, match="not a diffusers model directory"):
        empty_model(tmp_path, torch.float32)


def test_prompt_embeddings_round_trip(tmp_path):
    pipe = build_tiny("tiny-wan")
    prompts = ["a red circle", "a blue square", "a red circle"]

    def encode(texts):
        return pipe.encode_prompt(prompt=texts, negative_prompt=[""] * len(texts), max_sequence_length=8)

    store = PromptEmbeddings(tmp_path, {"model": "tiny-wan", "max_sequence_length": 8})
    assert store.missing(prompts) == ["a red circle", "a blue square"]
    store.compute(store.missing(prompts), encode)
    assert store.missing(prompts) == [] and len(list(tmp_path.glob("*.pt"))) == 2
    positive, negative = store.read(prompts, torch.device("cpu"))
    direct_positive, direct_negative = encode(prompts)
    torch.testing.assert_close(positive, direct_positive, atol=1e-6, rtol=0)
    torch.testing.assert_close(negative, direct_negative, atol=1e-6, rtol=0)
    other = PromptEmbeddings(tmp_path, {"model": "tiny-wan", "max_sequence_length": 16})
    assert other.missing(prompts) == ["a red circle", "a blue square"]  # other settings, other keys


@pytest.mark.slow
def test_fsdp_shards_filled_from_the_checkpoint_equal_the_model(checkpoint):
    reference = load_pipeline(str(checkpoint), torch.float32).transformer.state_dict()
    total = sum(t.numel() for t in load_pipeline(str(checkpoint), torch.float32).transformer.parameters())
    results = spawn(filled_shards, 2, args=(str(checkpoint / "transformer"),), timeout=300)
    for result in results:
        assert result["real_before"] == []
        assert result["local"] <= total / 2 + 1000  # this rank's rows only (plus the rounding of odd dims)
        for name, tensor in result["weights"].items():
            assert torch.equal(tensor, reference[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("from_checkpoint", [True, False], ids=["read-shard-wise", "sharded-after-loading"])
def test_weight_sharded_transformer_equals_the_whole_one(checkpoint, from_checkpoint):
    pipe = load_pipeline(str(checkpoint), torch.float32)
    results = spawn(sharded_transformer, 2, args=(str(checkpoint), from_checkpoint), timeout=300)
    total = sum(p.numel() for p in pipe.transformer.parameters())
    for result in results:
        assert result["released"], "weights are gathered only while their module runs"
        assert result["held"] <= 0.55 * total
        for name, tensor in pipe.transformer.state_dict().items():  # undo() gathers them back
            assert torch.equal(result["weights"][name], tensor), name
    torch.testing.assert_close(results[0]["out"], results[1]["out"], atol=0, rtol=0)
    assert results[0]["out"].abs().max() > 0


def _generate(checkpoint, out, name: str, *extra: str) -> torch.Tensor:
    """``python -m pipelines.generate`` on the saved tiny-wan: its final latents."""
    cmd = [sys.executable, "-m", "pipelines.generate", "--model", str(checkpoint), "--steps", "3", "--frames", "5",
           "--height", "32", "--width", "48", "--max-sequence-length", "16", "--guidance", "4",
           "--out", str(out / f"{name}.mp4"), "--save-latents", str(out / f"{name}.pt"), *extra]  # fmt: skip
    result = run_python(cmd, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out / f"{name}.pt")


@pytest.fixture(scope="module")
def unsharded_latents(checkpoint, tmp_path_factory):
    return _generate(checkpoint, tmp_path_factory.mktemp("whole"), "whole")


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--ulysses", "2"], ["--ring", "2"], ["--ulysses", "2", "--cfg-parallel"]],
                         ids=["1x2", "2x1", "cfg2x(1x1)"])  # fmt: skip
def test_generate_shard_weights_gives_the_unsharded_video(checkpoint, unsharded_latents, tmp_path, flags):
    sharded = _generate(checkpoint, tmp_path, "sharded", *flags, "--shard-weights")
    assert (sharded - unsharded_latents).abs().max() <= 1e-4
    assert unsharded_latents.std() > 0.01


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"ulysses": 2}, {"ring": 2, "kl_coef": 0.1}, {"ulysses": 2, "lora_rank": 4,
                                      "kl_coef": 0.1}, {"ulysses": 2, "model": "toy-wan", "parallel_vae": False}],
                         ids=["full", "full-kl", "lora-kl", "toy-wan"])  # fmt: skip
def test_lean_setup_equals_the_whole_pipeline_setup(checkpoint, settings):
    """Built empty and filled shard-wise, embeddings from disk, encoders freed, no VAE on the ranks that do
    not decode (with the parallel VAE all do; toy-wan's VAE compresses unlike diffusers' defaults): the same
    step, exactly."""
    config = tiny_config(**{"model": str(checkpoint)} | settings)
    lean, whole = zip(*spawn(lean_and_whole_setup_and_step, 2, args=(config,), timeout=600))
    prompts = len(set(config.prompts and open_prompts(config.prompts)))
    for a, b in zip(lean, whole):
        assert torch.equal(a["rewards"], b["rewards"])
        assert a["grads"].keys() == b["grads"].keys() and len(a["grads"]) > 10
        for name in a["grads"]:
            torch.testing.assert_close(a["grads"][name], b["grads"][name], atol=1e-6, rtol=0, msg=name)
        assert not a["text_encoder"], "the text encoder is freed once the prompts are encoded"
        assert a["vae"] == (a["rank"] == 0 or config.parallel_vae), "the VAE is loaded only where videos are decoded"
        assert len(a["embeddings"]) == prompts


def open_prompts(name: str) -> list[str]:
    from dit_sp.io.prompts import read_prompts

    return read_prompts(name)


@pytest.mark.slow
def test_a_second_run_reuses_the_prompt_embeddings(checkpoint, tmp_path):
    config = tiny_config(model=str(checkpoint), ulysses=2, embedding_cache=str(tmp_path / "cache"))
    spawn(setup_and_step, 2, args=(config,), timeout=600)
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("*.pt")}
    assert stamps
    again = dataclasses.replace(config, output_dir=str(tmp_path / "again"))
    spawn(setup_and_step, 2, args=(again,), timeout=600)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("*.pt")} == stamps
