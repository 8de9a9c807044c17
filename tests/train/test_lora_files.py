"""LoRA in and out in diffusers' format (``dit_sp.train.lora_io``): a LoRA run's export holds its adapters as a
diffusers LoRA that stock diffusers loads onto the base model with the merged export's frames; a run starts from an
existing LoRA (``lora.init_from``), refusing a missing one, another rank or alpha and keys that match no module;
``generate --lora`` on Ulysses 2 gives the stock one-process pipeline's latents with the same adapters and scales."""

from __future__ import annotations

import pytest
import torch
from cli_run import run_cli
from grpo_checks import tiny_config
from lora_checks import SAMPLE, frames, lora_file_tensors, random_lora, start_step_export

from dit_sp import TrainConfig, spawn
from dit_sp.errors import ConfigError, MissingFileError


def test_init_from_refuses_what_it_cannot_start_from(tmp_path):
    """One line naming the setting to change: a missing LoRA, another rank or alpha, layers the run does not adapt
    (a feed-forward LoRA) or that the model does not have, and rank 0; a LoRA on a module where the sequence is
    split or gathered is refused for sampling."""
    from diffusers import WanPipeline
    from safetensors.torch import load_file, save_file

    from dit_sp.rl.preflight import check_before_loading
    from dit_sp.train.lora import add_lora
    from dit_sp.train.lora_io import init_adapters, load_adapters
    from dit_sp.zoo import build_tiny, load_pipeline

    missing = tmp_path / "nowhere"
    with pytest.raises(MissingFileError, match=r"lora.init_from .*nowhere: no LoRA there"):
        check_before_loading(tiny_config(lora_rank=4, **{"lora.init_from": str(missing)}), 1)
    with pytest.raises(ConfigError, match="lora.rank 0 trains all weights"):
        TrainConfig.from_dict({"lora": {"init_from": str(missing)}})

    model = build_tiny("tiny-wan", "transformer")
    add_lora(model, 4)
    cases = [
        (random_lora(tmp_path / "r8", rank=8), 4.0, "has rank 8 (layer blocks.0.attn1.to_k) and lora.rank is 4: "
                                                     "set lora.rank: 8"),
        (random_lora(tmp_path / "a2", alpha=2.0), 4.0, "has alpha 2 and this run's lora.alpha is 4: set lora.alpha: 2"),
        (random_lora(tmp_path / "ffn", targets=("net.0.proj",)), 4.0, "match no adapted module, e.g. "
         "blocks.0.ffn.net.0.proj is not adapted by lora training"),
    ]  # fmt: skip
    for path, alpha, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            init_adapters(model, WanPipeline, path, alpha)
    state = load_file(random_lora(tmp_path / "ok") / "pytorch_lora_weights.safetensors")
    renamed = tmp_path / "renamed.safetensors"  # a LoRA of another architecture's module names, as a bare file
    save_file({k.replace("blocks.", "layers."): v for k, v in state.items()}, renamed)
    with pytest.raises(ConfigError, match="e.g. layers.0.attn1.to_k matches no module of the transformer"):
        init_adapters(model, WanPipeline, renamed, 4.0)
    assert all(torch.count_nonzero(p) == 0 for n, p in model.named_parameters() if "lora_B" in n)  # left as it was

    pipe = load_pipeline("tiny-wan", torch.float32, "cpu")
    with pytest.raises(ConfigError, match="lora out adapts proj_out, where dit-sp splits or gathers the sequence"):
        load_adapters(pipe, [(str(random_lora(tmp_path / "out", targets=("proj_out",))), 1.0)], labels=["out"])
    assert not getattr(pipe.transformer, "peft_config", None)  # unloaded again


@pytest.mark.slow
def test_a_run_starts_from_a_lora_and_exports_one_that_stock_diffusers_loads(tmp_path):
    """``lora.init_from``: before the first step the adapters are the file's; after one step the export's
    ``final/lora`` holds the trained adapters alone (a small file), and the stock ``WanPipeline`` with it loaded
    (``load_lora_weights``) gives the merged export's frames within 1e-4."""
    from dit_sp.zoo import load_pipeline

    start = random_lora(tmp_path / "start", seed=1)
    config = tiny_config(lora_rank=4, max_steps=1, width=48, steps=2, prompts_per_step=1, guidance=1.0,
                         **{"lora.init_from": str(start), "optim.lr": 0.01})  # fmt: skip
    result = spawn(start_step_export, 1, args=(config, str(tmp_path / "final")), timeout=300)[0]
    expected = lora_file_tensors(start)
    assert result["before"].keys() == expected.keys() and len(expected) == 32
    assert all(torch.equal(result["before"][k], expected[k]) for k in expected)  # the first step's weights

    exported = lora_file_tensors(tmp_path / "final" / "lora")
    assert exported.keys() == expected.keys()
    assert all(torch.equal(exported[k], result["after"][k]) for k in exported)
    assert max((exported[k] - expected[k]).abs().max() for k in exported) > 1e-4  # the step moved them
    lora_bytes = (tmp_path / "final" / "lora" / "pytorch_lora_weights.safetensors").stat().st_size
    model_bytes = sum(p.stat().st_size for p in (tmp_path / "final" / "transformer").glob("*.safetensors"))
    assert lora_bytes * 4 < model_bytes

    merged = frames(load_pipeline(str(tmp_path / "final"), torch.float32, "cpu"))
    stock = load_pipeline("tiny-wan", torch.float32, "cpu")
    base = frames(stock)
    stock.load_lora_weights(str(tmp_path / "final" / "lora"))
    adapted = frames(stock)
    assert (adapted - base).abs().max() > 1e-3  # the adapters change the video
    assert (adapted - merged).abs().max() <= 1e-4


@pytest.mark.slow
def test_generate_with_two_loras_on_two_processes_equals_stock_one_process(tmp_path):
    """``generate --lora A:0.7 --lora B --ulysses 2``: the stock pipeline in one process with A and B loaded
    (``set_adapters`` at 0.7 and 1) gives the same final latents within 1e-4."""
    from dit_sp.zoo import load_pipeline

    a, b = random_lora(tmp_path / "a", seed=2), random_lora(tmp_path / "b", rank=2, seed=3)
    argv = ["--model", "tiny-wan", "--lora", f"{a}:0.7", "--lora", str(b), "--ulysses", "2", "--frames", "5",
            "--height", "32", "--width", "48", "--steps", "2", "--guidance", "2", "--max-sequence-length", "16",
            "--prompt", SAMPLE["prompt"],
            "--save-latents", str(tmp_path / "latents.pt"), "--out", str(tmp_path / "v.gif")]  # fmt: skip
    result = run_cli("pipelines.generate", argv, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    stock = load_pipeline("tiny-wan", torch.float32, "cpu")
    stock.load_lora_weights(str(a), adapter_name="style")
    stock.load_lora_weights(str(b), adapter_name="motion")
    stock.set_adapters(["style", "motion"], [0.7, 1.0])
    latents = stock(**(SAMPLE | {"guidance_scale": 2.0}), negative_prompt="", output_type="latent",
                    generator=torch.Generator("cpu").manual_seed(0)).frames  # fmt: skip
    stock.set_adapters(["style", "motion"], [0.0, 0.0])  # the adapters off: the run must have used them
    plain = stock(**(SAMPLE | {"guidance_scale": 2.0}), negative_prompt="", output_type="latent",
                  generator=torch.Generator("cpu").manual_seed(0)).frames  # fmt: skip
    ours = torch.load(tmp_path / "latents.pt")
    assert ours.shape == latents.shape
    assert (latents - plain).abs().max() > 1e-3
    assert (ours - latents).abs().max() <= 1e-4
