"""LTX-2's DFR temporal refine round (``LTX2DFRTemporalRefinePipeline``, ``tiny-ltx2-dfr-refine``), which ``generate``
does not run, from Python as docs/families-variant-pipelines.md shows it: a DFR pass, then a refine round of its
latent output (a temporal latent upsampler doubles the canvas; each temporal tile is denoised with ancestral steps
over the pass's frozen audio), each under ``parallelize``. On Ulysses 2 and ring 2 both passes give the one-process
latents, keyframes and decoded frames within 1e-4, each rank's video self-attention holding half of every transformer
call's video tokens. The page's block runs as written (Ulysses 2), with ring 2 in its place, and without
``parallelize`` (the one-process reference): one spawn for the three."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # spawns worker processes

PAGE = Path(__file__).resolve().parents[2] / "docs" / "families-variant-pipelines.md"
WHERE = "docs/families-variant-pipelines.md"
LAYOUTS = ("1x2", "2x1")


def _page_code() -> str:
    from doc_blocks import blocks

    found = [block for block in blocks(PAGE.read_text(), "python") if "tiny-ltx2-dfr-refine" in block]
    assert len(found) == 1, f"{WHERE}: expected one Python block of tiny-ltx2-dfr-refine, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    """Per rank: {run: what ``ltx_refine_checks.refine_runs`` records}, runs "single" (no ``parallelize``), "1x2"
    (the page's block as written) and "2x1"."""
    from doc_blocks import substitute
    from ltx_refine_checks import refine_runs

    from dit_sp import spawn

    code = _page_code()
    layout = "init_parallel(ParallelConfig(ulysses=2))"
    single = substitute(code, [(f"parallel = {layout}", "parallel = None"),
                               ("with parallelize(dfr, parallel):", "if True:"),
                               ("with parallelize(refine, parallel):", "if True:")], WHERE)  # fmt: skip
    ring = substitute(code, [(layout, "init_parallel(ParallelConfig(ring=2))")], WHERE)
    tmp = tmp_path_factory.mktemp("ltx2_refine")
    return spawn(refine_runs, 2, args=({"single": single, "1x2": code, "2x1": ring}, str(tmp)), timeout=300)


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return (a.float() - b.float()).abs().max().item()


def test_the_chain_refines_the_dfr_pass(runs):
    """The one-process reference is a real refine round: the canvas doubled in time (4 latent frames -> 7), the
    carried keyframe joined by the round's generated slot, a decoded video not constant."""
    reference = runs[0]["single"]
    assert reference["dfr"].shape == (1, 4, 4, 8, 8)
    assert reference["latents"].shape == (1, 4, 7, 8, 8)
    assert reference["dfr_positions"] == [12]
    assert reference["positions"] == [12, 24]  # the seam (12 x 2) and the round's slot between 0 and it
    assert reference["keyframes"].shape == (1, 4, 2, 8, 8)
    assert reference["frames"].shape[2:] == (32, 32, 3) and reference["frames"].std() > 0.01
    assert _close(runs[1]["single"]["latents"], reference["latents"]) == 0  # the reference is the same everywhere


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_gives_the_one_process_latents_and_frames(runs, layout):
    for rank, by_run in enumerate(runs):
        reference, run = by_run["single"], by_run[layout]
        for key in ("dfr", "dfr_keyframes", "latents", "keyframes", "frames"):
            error = _close(run[key], reference[key])
            assert error <= 1e-4, f"rank {rank}, {layout}: {key} differ by {error:.2e} from one process"
        assert run["dfr_positions"] == reference["dfr_positions"] and run["positions"] == reference["positions"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_rank_attention_holds_half_of_every_calls_video_tokens(runs, layout):
    reference = runs[0]["single"]
    # one process: the self-attention runs on what the transformer gets. The DFR pass: 4 latent frames of 8 x 8 and
    # the generated slot's 64; the refine round's one tile: 7 latent frames, the pinned keyframe's 64 and the slot's
    assert reference["local"] == reference["full"] == [320, 576], reference
    half = sorted({math.ceil(length / 2) for length in reference["full"]})
    for rank, by_run in enumerate(runs):
        run = by_run[layout]
        assert run["full"] == reference["full"], f"rank {rank}, {layout}: other transformer calls {run['full']}"
        assert run["local"] == half, f"rank {rank}, {layout}: attention saw {run['local']} tokens, not {half}"


def test_generate_refuses_it_in_one_line_saying_to_call_it_from_python(tmp_path):
    """The CLI's refusal (tests/pipelines/test_bad_input.py runs it) is this check, before anything loads."""
    from dit_sp import GenerateConfig
    from dit_sp.errors import ConfigError
    from dit_sp.inference import check_before_loading

    config = GenerateConfig.load(overrides={"model": "tiny-ltx2-dfr-refine", "out": str(tmp_path / "v.mp4")})
    with pytest.raises(ConfigError) as error:
        check_before_loading(config)
    message = str(error.value)
    assert message.startswith("tiny-ltx2-dfr-refine (LTX2DFRTemporalRefinePipeline): generate does not run it: ")
    assert "\n" not in message and "from Python" in message and "families-variant-pipelines.md" in message
