"""The sampling planner: generate's per-GPU memory by phase and component, what --shard-weights, Ulysses and
the parallel VAE change, advice for the peak's component that lowers it, the VAE decode estimate against a
real decode, and the CLI's --generate."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from cli_run import run_cli

from dit_sp.memory.planner import ARCHITECTURES, TransformerShape
from dit_sp.memory.sampling import DECODING, DENOISING, ENCODING, SamplingSettings, plan_sampling, vae_decode_bytes

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]
WAN_1_3B = ARCHITECTURES["wan2.1-t2v-1.3b"]


def _peak_in(line: str) -> float:
    return float(re.search(r"peak ([0-9.]+) GiB", line).group(1))


def test_the_phases_add_up_from_the_resident_weights_and_each_working_set():
    settings = SamplingSettings("wan2.1-t2v-1.3b", frames=33, height=480, width=832, ulysses=2)
    plan = plan_sampling(settings, 4, 80)
    shape = TransformerShape.of(*WAN_1_3B["transformers"]["transformer"])
    encoding, denoising, decoding = plan.phases[ENCODING], plan.phases[DENOISING], plan.phases[DECODING]
    resident = {
        "transformer weights (bfloat16, whole)": shape.params * 2,
        "VAE weights (bfloat16)": int(WAN_1_3B["vae"] * 2),
    }
    encoder = "text encoder(s) (bfloat16, whole, freed before denoising)"
    assert encoding == resident | {encoder: int(WAN_1_3B["text_encoders"] * 2)}
    tokens = 9 * 30 * 52 // 2  # 33 frames -> 9 latent frames of 60 x 104 latents, 2 x 2 patches, over ulysses 2
    activations = f"activations (one block, 2 seq x {tokens} tokens)"
    exchange = "all-to-all buffers (Ulysses, 12 heads)"  # q, k, v and the output, one attention's
    assert denoising == resident | {activations: denoising[activations], exchange: 10 * 1536 * tokens * 2 * 2}
    assert denoising[activations] > denoising[exchange]
    decode = vae_decode_bytes(33, 480, 832, 2, 2, frames_at_once=6)  # Wan's VAE: a latent frame at a time
    assert decoding == resident | {"VAE decode activations (6 frames at once, rows 1/2)": decode}
    assert plan.peak == max(sum(phase.values()) for phase in (encoding, denoising, decoding))
    assert (plan.peak_phase, plan.peak_component) == (ENCODING, encoder)
    assert plan.fits and plan.advice == []
    report = plan.report()
    assert f"peak {plan.peak / GiB:.1f} GiB at prompt encoding, mostly the text encoder(s) (10.6 GiB)" in report
    # kept through sampling (--no-free-text-encoders), the encoders sit under every phase
    kept = plan_sampling(dataclasses.replace(settings, free_text_encoders=False), 4, 80)
    held = {"text encoder(s) (bfloat16, whole, kept through sampling)": int(WAN_1_3B["text_encoders"] * 2)}
    for phase in (ENCODING, DENOISING, DECODING):
        assert (
            kept.phases[phase] == plan.phases[phase] | held
            if phase != ENCODING
            else kept.phases[phase] == (resident | held)
        )
    assert (kept.peak_phase, kept.peak) == (DECODING, sum(decoding.values()) + sum(held.values()))


def test_shard_weights_ulysses_and_the_parallel_vae_lower_what_they_should():
    base = SamplingSettings("hunyuanvideo", frames=61, height=544, width=960, ulysses=2, guidance=False)
    whole, sharded = plan_sampling(base, 2, 80), plan_sampling(dataclasses.replace(base, shard_weights=True), 2, 80)
    for part in ("transformer weights", "text encoder(s)"):
        (before,) = (v for k, v in whole.phases[ENCODING].items() if k.startswith(part))
        (after,) = (v for k, v in sharded.phases[ENCODING].items() if k.startswith(part))
        assert after == before // 2, part  # 1/N over a sample's two processes
    assert "gathered block (one at a time)" in sharded.phases[DENOISING] and sharded.peak < whole.peak
    wider = plan_sampling(dataclasses.replace(base, ulysses=4), 4, 80)
    (narrow,) = (v for k, v in whole.phases[DENOISING].items() if k.startswith("activations"))
    (wide,) = (v for k, v in wider.phases[DENOISING].items() if k.startswith("activations"))
    assert 0.45 * narrow <= wide <= 0.55 * narrow  # half the tokens per process (the text tokens round up)
    rows = whole.phases[DECODING]["VAE decode activations (all frames at once, rows 1/2)"]
    assert wider.phases[DECODING]["VAE decode activations (all frames at once, rows 1/4)"] < rows
    one = plan_sampling(dataclasses.replace(base, parallel_vae=False), 2, 80)
    assert one.phases[DECODING]["VAE decode activations (all frames at once, rows 1/1)"] > rows
    assert not any(k.startswith("activations") and "2 seq" in k for k in whole.phases[DENOISING])  # no guidance


def test_a_vae_decode_peak_gets_vae_advice_that_lowers_it():
    settings = SamplingSettings("hunyuanvideo", frames=129, ulysses=8, guidance=False, parallel_vae=False,
                                free_text_encoders=False)  # fmt: skip
    plan = plan_sampling(settings, 8, 80)  # HunyuanVideo's VAE decodes the whole 720p video at once
    component = "VAE decode activations (all frames at once, rows 1/1)"
    assert not plan.fits and (plan.peak_phase, plan.peak_component) == (DECODING, component)
    (parallel,) = plan.advice
    split = plan_sampling(dataclasses.replace(settings, parallel_vae=True), 8, 80)
    assert parallel.startswith("the parallel VAE (drop --no-parallel-vae")
    assert _peak_in(parallel) == round(split.peak / 2**30, 1) and split.peak < plan.peak / 4
    assert "to lower the VAE decode peak (VAE decode activations)" in plan.report()
    assert split.peak_component == "VAE decode activations (all frames at once, rows 1/8)" and not split.fits
    ring, padded = split.advice  # Ulysses 16 does not divide the 24 heads: more ring first, then padded Ulysses
    assert ring.startswith("--ring 2 (more processes per sample)") and "on 16 GPUs" in ring and ring.endswith("fits")
    note = "ulysses 16 pads 24 heads to 32 (2 a rank): 33% more attention work, and 4 of its ranks hold padding only"
    assert padded.startswith(f"--ulysses 16 (more processes per sample; {note})"), padded
    wider = plan_sampling(dataclasses.replace(split.settings, ulysses=16), 16, 80)
    assert _peak_in(padded) == round(wider.peak / GiB, 1) and wider.notes == [note] and f"  ({note})" in wider.report()
    assert _peak_in(ring) == round(plan_sampling(dataclasses.replace(split.settings, ring=2), 16, 80).peak / GiB, 1)
    freed = plan_sampling(dataclasses.replace(split.settings, free_text_encoders=True), 8, 80)
    assert freed.fits  # the encoders (8B Llama and CLIP) freed before denoising leave room for the decode


def test_wan_decodes_a_latent_frame_at_a_time():
    wan = plan_sampling(SamplingSettings("wan2.1-t2v-1.3b", frames=81, height=480, width=832), 1, 80)
    assert wan.phases[DECODING]["VAE decode activations (6 frames at once, rows 1/1)"] == vae_decode_bytes(
        81, 480, 832, 2, 1, frames_at_once=6
    )


def test_a_text_encoder_peak_gets_shard_weights_and_bf16():
    settings = SamplingSettings("wan2.1-t2v-1.3b", frames=17, height=256, width=256, dtype="float32", ulysses=2)
    plan = plan_sampling(settings, 2, 20)  # the fp32 UMT5-XXL (21 GiB) on each of two 20 GiB GPUs
    assert not plan.fits and plan.peak_component.startswith("text encoder(s) (float32, whole")
    shard, bf16 = plan.advice
    assert shard.startswith("--shard-weights") and shard.endswith(": fits")
    sharded = plan_sampling(dataclasses.replace(settings, shard_weights=True), 2, 20)
    assert _peak_in(shard) == round(sharded.peak / GiB, 1)
    assert bf16.startswith("--dtype bfloat16") and _peak_in(bf16) < plan.peak / GiB


def test_an_activation_peak_gets_more_sequence_parallelism():
    # 75600 tokens x 2 guidance branches on one 80 GiB GPU, the text encoder kept (freed, it fits: 10.6 GiB less)
    settings = SamplingSettings("wan2.1-t2v-14b", free_text_encoders=False)
    plan = plan_sampling(settings, 1, 80)
    assert not plan.fits and (plan.peak_phase, plan.peak_component) == (
        DENOISING,
        "activations (one block, 2 seq x 75600 tokens)",
    )
    ulysses, ring = plan.advice
    assert ulysses.startswith("--ulysses 2") and ring.startswith("--ring 2") and "on 2 GPUs" in ring
    halved = plan_sampling(dataclasses.replace(settings, ulysses=2), 2, 80)
    assert _peak_in(ulysses) == round(halved.peak / GiB, 1) < plan.peak / GiB
    assert (
        halved.phases[DENOISING]["activations (one block, 2 seq x 37800 tokens)"] * 2
        == (plan.phases[DENOISING]["activations (one block, 2 seq x 75600 tokens)"])
    )


@pytest.mark.slow
def test_the_vae_decode_estimate_is_within_25_percent_of_a_real_decode():
    import torch
    from diffusers import AutoencoderKLHunyuanVideo
    from live_bytes import LiveBytes

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(layers_per_block=1).eval()  # HunyuanVideo's widths, one ResNet per stage
    latents = torch.randn(1, 16, 2, 8, 8)
    with torch.no_grad(), LiveBytes() as live:
        frames = vae.decode(latents).sample
    assert frames.shape == (1, 3, 5, 64, 64)
    estimate = vae_decode_bytes(5, 64, 64, 4, 1)
    print(f"VAE decode: estimated {estimate / 2**20:.0f} MiB, measured {live.peak / 2**20:.0f} MiB")
    assert 0.75 * live.peak <= estimate <= 1.25 * live.peak


@pytest.mark.slow
def test_plan_generate_cli():
    ok = run_cli("pipelines.plan", ["--generate", "--config", "wan2.1-t2v-14b", "--gpus", "8", "--gpu-memory", "40"],
                 cwd=ROOT)  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]
    for words in ("Sampling (wan2.1-t2v-14b): 81 x 720 x 1280, bfloat16, ring 1 x ulysses 8", "while denoising",
                  "while VAE decode", "does NOT fit", "--shard-weights"):  # fmt: skip
        assert words in ok.stdout, ok.stdout
    flags = ["--generate", "--arch", "hunyuanvideo", "--gpus", "2", "--ulysses", "2", "--frames", "61"]
    sharded = run_cli("pipelines.plan", [*flags, "--shard-weights", "--no-parallel-vae"], cwd=ROOT)
    assert sharded.returncode == 0, sharded.stderr[-2000:]
    assert "61 x 720 x 1280" in sharded.stdout and "(bfloat16, 1/2)" in sharded.stdout
    assert "VAE decode activations (all frames at once, rows 1/1)" in sharded.stdout, sharded.stdout
    for argv, words in [
        (["--gpus", "2", "--frames", "9"], "--frames plans sampling: add --generate"),
        (["--generate", "--gpus", "2"], "cannot tell the architecture"),
        ([*flags[:4], "3", "--ulysses", "2"], "use a multiple of 2"),
        ([*flags, "--dtype", "fp8"], "dtype"),
        ([*flags, "--embeddings-cached"], "drop them with --generate"),
    ]:
        bad = run_cli("pipelines.plan", argv, cwd=ROOT)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize(
    ("arch", "frames", "call"), [("allegro", 88, (24, 320, 320)), ("minimax-h3", 73, (28, 256, 256))]
)
def test_a_vae_whose_calls_are_shared_out_whole_holds_one_call_per_rank_not_rows(arch, frames, call):
    # Allegro's 3D tiles and MiniMax-H3's clips and tiles go whole to one rank each (VAEPlan parts=(), tiles): a rank's
    # decode peak is one call plus the decoded video, the same on 1, 2 or 4 processes (no rows split)
    extent = "x".join(map(str, call))
    label = f"VAE decode activations (one call of {extent} frames x rows x columns at a time, whole on a rank)"
    figures = set()
    for ulysses in (1, 2, 4):
        plan = plan_sampling(SamplingSettings(arch, frames=frames, ulysses=ulysses, guidance=False), ulysses, 80)
        figures.add(plan.phases[DECODING][label])
    assert figures == {vae_decode_bytes(frames, 720, 1280, 2, 4, call=call)}
    rows = vae_decode_bytes(frames, 720, 1280, 2, 4)  # the row split's 1/4 of every frame at once
    assert figures != {rows} and vae_decode_bytes(frames, 720, 1280, 2, 1, call=call) == figures.pop()


def test_vae_call_is_given_exactly_for_the_vaes_whose_calls_are_shared_out_whole():
    from dit_sp.families import FAMILIES

    for family in FAMILIES:
        whole = family.vae is not None and family.vae.tiles is not None and not family.vae.parts
        for name, spec in family.architectures.items():
            assert ("vae_call" in spec) == whole, name
