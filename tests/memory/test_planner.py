"""The memory planner: exact model sizes from meta-device builds of the real configs, an activation model
that matches measured peaks, layouts chosen to fit, and its CLI."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from cli_run import run_python
from scale_checks import activation_peak

from dit_sp import TrainConfig, spawn
from dit_sp.memory.planner import ARCHITECTURES, TEXT_ENCODER, TransformerShape, activation_bytes, plan_training

WIDE = {"patch_size": (1, 2, 2), "num_attention_heads": 3, "attention_head_dim": 128, "in_channels": 4,
        "out_channels": 4, "text_dim": 16, "freq_dim": 256, "ffn_dim": 1536, "num_layers": 4,
        "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 64}  # fmt: skip


@pytest.mark.parametrize(("name", "low", "high", "blocks"), [
    ("wan2.1-t2v-1.3b", 1.3e9, 1.5e9, 30), ("wan2.1-t2v-14b", 13e9, 15e9, 40), ("wan2.2-ti2v-5b", 4.5e9, 5.5e9, 30),
    ("hunyuanvideo", 12e9, 13.5e9, 60), ("cogvideox-5b", 5e9, 6e9, 42)])  # fmt: skip
def test_real_architectures_have_their_published_sizes(name, low, high, blocks):
    class_name, config = ARCHITECTURES[name]["transformers"]["transformer"]
    shape = TransformerShape.of(class_name, config)
    assert low <= shape.params <= high, shape.params
    assert shape.layers == blocks and shape.block_params < shape.params / 10


# architecture: (low, high, blocks) of every transformer it holds (both experts of a Wan 2.2 A14B), and where the
# number comes from: the model card's size as known offline, the configs of diffusers' conversion scripts, a meta count
PUBLISHED = {
    "cogvideox-5b-i2v": (5e9, 6e9, 42),  # CogVideoX-5B-I2V: "5B"; CogVideoX-5B's transformer, 32 input channels
    "skyreels-v2-t2v-14b-540p": (13e9, 15e9, 40),  # "14B": Wan 2.1 T2V 14B's config (14.29e9 counted)
    "skyreels-v2-df-14b-720p": (13e9, 15e9, 40),  # "14B"; convert_skyreelsv2_to_diffusers.py: inject_sample_info off
    # "14B" and VACE: T2V 14B (14.29e9) and 8 VACE blocks (convert_wan_to_diffusers.py vace_layers 0, 5, ..., 35),
    # 17.34e9 counted on meta
    "wan2.1-vace-14b": (17.2e9, 17.5e9, 40),
    # Wan 2.1 I2V 14B (ChronoEdit-14B is fine-tuned from its 720P model; FLF2V 14B adds 2 x 257 CLIP positions): the
    # "14B" of T2V plus the CLIP image tokens' key/value projections in every block, 16.39e9 counted on meta
    "wan2.1-i2v-14b": (16.3e9, 16.5e9, 40), "chronoedit-14b": (16.3e9, 16.5e9, 40),
    "wan2.1-flf2v-14b": (16.3e9, 16.5e9, 40),
    "hunyuanvideo-framepack-i2v": (12.5e9, 13.5e9, 60),  # FramePack: HunyuanVideo's 13B, its history embedders
    "motif-video-2b-i2v": (1.9e9, 2.1e9, 36),  # Motif-Video 2B: "2B" (2.04e9 counted)
    "hunyuanvideo-1.5-480p_i2v": (8.2e9, 8.4e9, 54),  # HunyuanVideo-1.5: "8.3B parameters"
    # Wan 2.2 A14B: "27B total, 14B active per step": two experts of 14.29e9 each (28.6e9 counted)
    "wan2.2-t2v-a14b": (13e9, 15e9, 40), "wan2.2-i2v-a14b": (13e9, 15e9, 40),
    # ConsisID-preview: no parameter count published (its paper: built on CogVideoX-5B); CogVideoX-5B-I2V's 5.57e9
    # and its face adapters (LocalFacialExtractor, 21 perceiver cross-attentions) at their released sizes: 6.16e9
    # counted on meta
    "consisid-preview": (6.1e9, 6.2e9, 42),
    # Kandinsky 6.0 VSR: "1.4B" SR DiT, diffusers' default Kandinsky6SRTransformer3DModel (1.41e9 counted on meta)
    "kandinsky-6.0-vsr": (1.40e9, 1.42e9, 32),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_more_architectures_have_their_published_sizes(name):
    low, high, blocks = PUBLISHED[name]
    transformers = ARCHITECTURES[name]["transformers"]
    assert len(transformers) == (2 if "a14b" in name else 1)
    for class_name, config in transformers.values():
        shape = TransformerShape.of(class_name, config)
        assert low <= shape.params <= high, (name, shape.params)
        assert shape.layers == blocks and shape.block_params < shape.params / 10


@pytest.mark.parametrize(("model", "arch"), [
    ("Lightricks/LTX-2", "ltx-2-19b"), ("ltx-2-distilled", "ltx-2-19b"), ("LTX-2-19b-dev", "ltx-2-19b"),
    ("Wan-AI/Wan2.2-I2V-A14B-Diffusers", "wan2.2-i2v-a14b"), ("Wan2.2-T2V-A14B-Diffusers", "wan2.2-t2v-a14b"),
    ("Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers", "wan2.1-flf2v-14b"), ("Wan2.1-FLF2V-14B-720P", "wan2.1-flf2v-14b"),
    ("/models/Wan2.1-I2V-14B-720P-Diffusers", "wan2.1-i2v-14b"),
    ("Skywork/SkyReels-V2-DF-14B-720P", "skyreels-v2-df-14b-720p"),
    ("SkyReels-V2-DF-1.3B-540P-Diffusers", "skyreels-v2-df-1.3b-540p"),
    ("BestWishYsh/ConsisID-preview", "consisid-preview"), ("ConsisID", "consisid-preview"),
    ("kandinskylab/Kandinsky-6.0-VSR-distilled2steps-5s-Diffusers", "kandinsky-6.0-vsr")])  # fmt: skip
def test_published_repository_names_resolve_to_their_architectures(model, arch):
    """Offline, from the name alone (the longest key in it, or an architecture's whole ``names``: ``LTX-2``)."""
    from dit_sp.memory.planner import architecture_name

    assert architecture_name(model) == arch
    assert architecture_name("LTX-2.3") is None  # a whole name only, not a prefix of another model's


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "frames", "size", "batch", "checkpointing"), [
    (WIDE, 3, 48, 2, False), (WIDE | {"num_attention_heads": 6, "ffn_dim": 3072}, 3, 32, 2, False),
    (WIDE | {"num_layers": 8}, 3, 32, 2, True)], ids=["384-wide", "768-wide", "checkpointed"])  # fmt: skip
def test_activation_estimate_is_within_25_percent_of_the_measured_peak(spec, frames, size, batch, checkpointing):
    measured = spawn(activation_peak, 1, args=(spec, frames, size, batch, checkpointing), timeout=600)[0]
    shape = TransformerShape.of("WanTransformer3DModel", spec)
    estimate = activation_bytes(shape, frames * (size // 2) ** 2, batch, 4, checkpointing)
    print(f"activations: estimated {estimate / 2**20:.0f} MiB, measured {measured / 2**20:.0f} MiB")
    assert 0.75 * measured <= estimate <= 1.25 * measured


def test_the_plan_picks_more_sequence_parallelism_when_memory_is_short():
    config = TrainConfig.load("grpo_hunyuanvideo", {"activation_checkpointing": False, "grpo.micro_batch": 1})
    roomy = plan_training(config, 32, 80)
    tight = plan_training(config, 32, 40)
    assert roomy.fits and tight.fits
    assert roomy.layout["ring"] * roomy.layout["ulysses"] < tight.layout["ring"] * tight.layout["ulysses"]
    crowded = plan_training(TrainConfig.load("grpo_hunyuanvideo"), 8, 64, ulysses=8)  # 48 samples per forward
    assert not crowded.fits and "to lower the training peak (activations)" in crowded.report()


def test_a_two_expert_plan_holds_both_experts_and_the_trained_ones_state():
    both = plan_training(TrainConfig.load("grpo_wan2.2_a14b", {"lora.rank": 0}), 16, 80, ulysses=8)
    low_only = plan_training(TrainConfig.load("grpo_wan2.2_a14b", {"lora.rank": 0, "experts": ["transformer_2"]}),
                             16, 80, ulysses=8)  # fmt: skip
    one = TransformerShape.of(*ARCHITECTURES["wan2.2-t2v-a14b"]["transformers"]["transformer"])
    weights = "transformer + transformer_2 weights (fp32, 1/16)"
    assert both.components[weights] == low_only.components[weights] == 2 * one.params * 4 // 16
    for part in ("gradients (fp32)", "AdamW state (2 x fp32)", "KL reference (fp32, sharded)"):
        assert both.components[part] == 2 * low_only.components[part] > 0, part


@pytest.mark.slow
def test_plan_cli(tmp_path):
    ok = run_python(
        [sys.executable, "-m", "pipelines.plan", "--config", "grpo_hunyuanvideo", "--gpus", "32"], timeout=300
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    for part in ("weights (fp32, 1/32)", "AdamW state", "activations", "gathered block", "text encoder", "fits"):
        assert part in ok.stdout, ok.stdout
    (tmp_path / "c.yaml").write_text("model: /somewhere/my-model\n")
    bad = run_python(
        [sys.executable, "-m", "pipelines.plan", "--config", str(tmp_path / "c.yaml"), "--gpus", "8"], timeout=300
    )
    assert bad.returncode == 2 and "cannot tell the architecture" in bad.stderr and "Traceback" not in bad.stderr


def test_a_text_encoder_peak_is_named_and_gets_advice_that_lowers_it():
    encoder = ARCHITECTURES["wan2.1-t2v-1.3b"]["text_encoders"]
    config = TrainConfig.load("grpo_wan2.1_1.3b")  # on 8 x 24 GiB: UMT5-XXL in bf16, sharded over the 8 GPUs
    eight = plan_training(config, 8, 24)
    assert eight.fits and eight.peak_phase == "training" and eight.advice == []
    assert eight.setup["text encoder(s) (bf16, 1/8, freed after encoding)"] == int(encoder * 2) // 8
    config = TrainConfig.load("grpo_wan2.1_1.3b", {"mixed_precision": None, "grpo.micro_batch": 1})
    plan = plan_training(config, 1, 20)  # in fp32 on one 20 GiB GPU: the whole fp32 UMT5-XXL at set-up
    name = "text encoder(s) (fp32, 1/1, freed after encoding)"
    assert name.startswith(TEXT_ENCODER) and plan.setup[name] == int(encoder * 4) and encoder * 4 > 20 * 2**30
    assert not plan.fits and (plan.peak_phase, plan.peak_component) == ("set-up", name)
    assert sum(plan.components.values()) < 0.9 * plan.gpu_bytes  # training itself fits: the layout is not the issue
    report = plan.report()
    assert "peak 21.6 GiB at set-up, mostly the text encoder(s) (21.2 GiB)" in report, report
    cached, bf16, more, note = plan.advice
    assert "embedding_cache" in cached and cached.endswith("peak 9.2 GiB at training: fits"), cached
    assert bf16.startswith("mixed_precision: bfloat16") and bf16.endswith("peak 11.1 GiB at set-up: fits"), bf16
    assert more.startswith("2 GPUs (the text encoders shard") and more.endswith("peak 11.1 GiB at set-up: fits")
    assert "do not change the set-up peak" in note and not any("micro_batch: 1" in line for line in plan.advice)
    halves = plan_training(config, 2, 20)  # what the third advice plans: half the encoder on each GPU
    assert halves.setup["text encoder(s) (fp32, 1/2, freed after encoding)"] == int(encoder * 4) // 2
    cached = plan_training(config, 1, 20, embeddings_cached=True)  # what the first advice plans
    assert sum(plan.setup.values()) - sum(cached.setup.values()) == int(encoder * 4)
    assert not any(part.startswith(TEXT_ENCODER) for part in cached.setup) and cached.fits and cached.advice == []
    assert cached.components == plan.components and cached.layout == plan.layout


def test_an_activation_peak_gets_activation_advice_each_with_a_lower_peak():
    config = TrainConfig.load("grpo_hunyuanvideo", {"activation_checkpointing": False, "mixed_precision": None})
    plan = plan_training(config, 8, 80, ulysses=8)
    assert plan.peak_phase == "training" and plan.peak_component.startswith("activations")
    advised = {line.split(":")[0]: line for line in plan.advice}
    assert {"grpo.micro_batch", "activation_checkpointing", "mixed_precision"} <= set(advised), plan.advice
    for line in plan.advice:  # each option names the peak it gives, below this one
        assert float(line.rsplit("peak ", 1)[1].split(" GiB")[0]) < plan.peak / 2**30, line
    micro = plan_training(dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, micro_batch=1)), 8, 80,
                          ulysses=8)  # fmt: skip
    assert f"peak {micro.peak / 2**30:.1f} GiB" in advised["grpo.micro_batch"]
    assert not any("embedding_cache" in line for line in plan.advice)


@pytest.mark.slow
def test_plan_cli_names_the_set_up_peak_and_takes_set():
    base = [sys.executable, "-m", "pipelines.plan", "--config", "grpo_wan2.1_1.3b", "--gpus", "1", "--gpu-memory", "20",
            "--set", "mixed_precision=null", "--set", "grpo.micro_batch=1"]  # fmt: skip
    plain = run_python(base, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "at set-up, mostly the text encoder(s)" in plain.stdout and "embedding_cache" in plain.stdout
    assert "activations (2 seq x 3510 tokens)" in plain.stdout, plain.stdout
    changed = run_python([*base, "--set", "sample.height=480", "--set", "sample.width=832", "--embeddings-cached"],
                         timeout=300)  # fmt: skip
    assert changed.returncode == 0, changed.stderr[-2000:]
    assert "text encoder" not in changed.stdout and "tokens)" in changed.stdout
    assert "activations (2 seq x 3510 tokens)" not in changed.stdout, changed.stdout
    for flags, words in [(["--set", "grpo"], "expected KEY=VALUE"), (["--set", "grpo.gruop_size=4"], "group_size")]:
        bad = run_python([*base, *flags], timeout=300)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]


MOTIF = {"in_channels": 4, "out_channels": 4, "num_attention_heads": 3, "attention_head_dim": 64, "num_layers": 1,
         "num_single_layers": 4, "num_decoder_layers": 3, "mlp_ratio": 4.0, "patch_size": 2, "patch_size_t": 1,
         "text_embed_dim": 16, "rope_axes_dim": [16, 24, 24], "enable_text_cross_attention_dual": False,
         "enable_text_cross_attention_single": True}  # fmt: skip


def test_motif_video_decoder_layers_count_two_streams_of_the_video():
    """Motif-Video's decoder layers attend over the decoder's copy of the video and the encoder's video (two split
    streams, no text): a forward + backward of a tiny model with 3 decoder layers of 5 blocks, measured in live tensor
    bytes, is within 25% of the plan that counts 2 x the video's tokens in them, and not of one stream's count."""
    from diffusers import MotifVideoTransformer3DModel
    from live_bytes import LiveBytes

    from dit_sp.memory.planner import stream_tokens

    torch.manual_seed(0)
    model = MotifVideoTransformer3DModel(**MOTIF)
    hidden, text = torch.randn(1, 4, 3, 24, 24), torch.randn(1, 16, 16)

    def step() -> None:
        out = model(hidden_states=hidden, timestep=torch.tensor([500.0]), encoder_hidden_states=text,
                    return_dict=False)[0]  # fmt: skip
        out.square().mean().backward()

    step()  # the gradients allocated
    with LiveBytes() as live:
        step()
    shape = TransformerShape.of("MotifVideoTransformer3DModel", MOTIF)
    assert (shape.layers, shape.stream_blocks, shape.streams) == (5, 3, 2)
    video = 3 * 12 * 12
    estimate = activation_bytes(shape, video + 16, 1, 4, False, streamed=stream_tokens(shape, video))
    one_stream = activation_bytes(shape, video + 16, 1, 4, False)  # every block at the video and the text
    print(f"Motif-Video activations: estimated {estimate / 2**20:.0f} MiB (one stream {one_stream / 2**20:.0f}), "
          f"measured {live.peak / 2**20:.0f} MiB")  # fmt: skip
    assert 0.75 * live.peak <= estimate <= 1.25 * live.peak and one_stream < 0.75 * live.peak
    # the released 2B (49 x 480 x 832: 20280 video tokens and 512 text tokens, 4 sequences a rank on dp 8): 8 of its 36
    # blocks hold two streams of the video, 22% more activations than one stream's count, checkpointed or not
    real = TransformerShape.of(*ARCHITECTURES["motif-video-2b"]["transformers"]["transformer"])
    assert (real.layers, real.stream_blocks, real.streams) == (36, 8, 2)
    for checkpointing in (False, True):
        config = TrainConfig.load("grpo_motif_video_2b", {"activation_checkpointing": checkpointing})
        planned = plan_training(config, 8, 80, ulysses=1).components["activations (4 seq x 20792 tokens)"]
        assert planned == activation_bytes(real, 20792, 4, 2, checkpointing, streamed=2 * 20280)
        ratio = planned / activation_bytes(real, 20792, 4, 2, checkpointing)
        assert 1.2 < ratio < (1.25 if not checkpointing else 1.6), ratio
