"""The parallel VAE: decode and encode split over 2 and 4 processes equal one process, for every family's VAE,
untiled and tiled (the tiles shared out), on odd latent heights and widths and several frame counts (each rank's
decoder and encoder rows counted); MiniMax-H3's, whose ViT decoder attends over a whole clip, with its clips and tiles
shared out; Kandinsky 6 SR's K-VAE, untiled (its pipeline tiles), over its own causal segments."""

from __future__ import annotations

import pytest
import torch
from vae_checks import CALLS_SHARED, PATCH, SPATIAL, TILED_ONLY, TILES_SPLIT, UNTILED, VAES, cases, check_vaes

from dit_sp import parallelize_vae, spawn
from dit_sp.parallel.rows import RowSplit


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n} processes")
def results(request):
    return request.param, spawn(check_vaes, request.param, args=(list(VAES),), timeout=600)


@pytest.mark.parametrize("family", list(VAES))
def test_split_vae_equals_one_process(results, family):
    ranks, per_rank = results
    for rank, result in enumerate(r[family] for r in per_rank):
        assert all(result["shapes"].values()), f"rank {rank}: shapes differ {result['shapes']}"
        worst = max(result["errors"], key=result["errors"].get)
        assert result["errors"][worst] <= 1e-4, f"rank {rank}: {worst} differs by {result['errors'][worst]:.2e}"
        # each rank ran its own rows (plus at most a halo of a few), not the whole frame
        frames, height, width = cases(family)[0]
        own = RowSplit.even(height, ranks).sizes[rank]
        if family not in TILED_ONLY | CALLS_SHARED:
            assert own <= result["rows"]["decoder"][0] <= own + 2 < height + 2, result["rows"]["decoder"][:3]
            # the encoder's first convolution: this rank's pixel rows (after any patchify), plus at most its padding
            pixels = own * SPATIAL[family] // PATCH.get(family, 1)
            assert pixels <= result["rows"]["encoder"][0] <= pixels + 2, (pixels, result["rows"]["encoder"][:3])
        assert result["undone"] == 0.0
    # tiled, the tiles are shared out: every part call of the one-process run ran once, on one of the ranks
    # (or, split by rows, on every rank)
    for part in ("decoder", "encoder") if family not in UNTILED else ():
        one = per_rank[0][family]["one_process_tiled_calls"][part]
        ran = [r[family]["tiled_calls"][part] for r in per_rank]
        if part in TILES_SPLIT.get(family, ()):
            assert ran == [one] * ranks, (part, ran, one)
        else:
            assert sum(ran) == one and max(ran) < one, (part, ran, one)
    # MiniMax-H3's untiled clips too: each clip's one call ran once, on one of the ranks
    for part in ("decoder", "encoder") if family in CALLS_SHARED else ():
        one = per_rank[0][family]["one_process_untiled_calls"][part]
        ran = [r[family]["untiled_calls"][part] for r in per_rank]
        assert sum(ran) == one and max(ran) < one, (part, ran, one)


def test_unsupported_vae_is_a_clear_error():
    from diffusers import AutoencoderTiny

    with pytest.raises(TypeError, match="no parallel VAE plan; supported VAEs: AutoencoderKLWan"):
        parallelize_vae(AutoencoderTiny(), None)


def test_cosmos_vae_gathers_only_its_attention_over_the_frame():
    """Cosmos 1's VAE attends over a frame's pixels and over a pixel's frames with one class: only the first runs on
    gathered frames, the second on each rank's own rows."""
    from diffusers.models.autoencoders.autoencoder_kl_cosmos import CosmosSpatialAttentionProcessor2_0
    from vae_checks import build

    from dit_sp.families import vae_plan_of

    vae = build("cosmos")
    plan = vae_plan_of(vae)
    for part in (vae.encoder, vae.decoder):
        whole = plan.whole_frame_of(part)
        attentions = [module for module in part.modules() if type(module).__name__ == "CosmosCausalAttention"]
        # the mid-block's and a block's (or two: the decoder's blocks have a layer more), each spatial and temporal
        assert len(whole) >= 2 and len(attentions) == 2 * len(whole)
        assert all(isinstance(module.processor, CosmosSpatialAttentionProcessor2_0) for module in whole)


def test_split_vae_misuse_is_a_clear_error():
    for errors in spawn(_misuse, 2, timeout=120):
        assert "inference-only: run it under torch.no_grad()" in errors["grad"], errors
        assert "inference-only: run it under torch.no_grad()" in errors["tiled grad"], errors
        assert "already split" in errors["twice"], errors
        assert "BatchNorm2d in training mode" in errors["batch norm"] and "vae.eval()" in errors["batch norm"], errors


def _misuse() -> dict[str, str]:
    """A decode of a latent that requires grad, splitting a VAE twice, and a decode through batch norms in training
    mode (the deep-compression AE's, which normalise with their input's statistics): the errors raised."""
    import os

    from vae_checks import build

    from dit_sp import ParallelConfig, init_parallel

    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    vae = build("wan2.1")
    parallelize_vae(vae, parallel)
    dc = build("dc").train()
    parallelize_vae(dc, parallel)
    errors = {}

    def tiled_grad():
        vae.enable_tiling(32, 32, 24, 24)  # 4-row latent tiles: a 6 x 6 latent is tiled
        try:
            vae.decode(torch.randn(1, 4, 1, 6, 6, requires_grad=True))
        finally:
            vae.disable_tiling()

    for name, call in {"grad": lambda: vae.decode(torch.randn(1, 4, 1, 4, 4, requires_grad=True)),
                       "tiled grad": tiled_grad, "twice": lambda: parallelize_vae(vae, parallel),
                       "batch norm": lambda: dc.decode(torch.randn(1, 4, 4, 4))}.items():  # fmt: skip
        try:
            call()
            errors[name] = "no error"
        except (RuntimeError, ValueError) as e:
            errors[name] = str(e)
    return errors


@pytest.mark.slow
def test_split_vae_noise_is_group_rank_0s():
    """A decoder that injects noise (LTX-Video 0.9.1's) draws it from each rank's global generator: split, the
    ranks' generators seeded apart, every rank gets group rank 0's one-process decode, and every generator
    advances as one process's does."""
    for rank, result in enumerate(spawn(_noise_from_rank_0, 2, timeout=120)):
        assert result["error"] <= 1e-4, (rank, result)
        assert result["generator"], rank


def _noise_from_rank_0() -> dict:
    """One-process decodes from seeds 0 and 1, then the split decode with rank r seeded r: its difference from
    seed 0's decode (also for a latent of one row, which runs whole), and whether its generator then continues
    as seed r's one-process decode left it."""
    import os

    from vae_checks import build, decode

    from dit_sp import ParallelConfig, init_parallel

    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    vae = build("ltx0.9.1")
    latents = torch.randn(1, 4, 2, 6, 5, generator=torch.Generator().manual_seed(1))
    decoded, after = [], []
    with torch.no_grad():
        for seed in range(2):
            torch.manual_seed(seed)
            decoded.append(decode(vae, "ltx0.9.1", latents))
            after.append(torch.randn(4))
        torch.manual_seed(0)
        one_row = decode(vae, "ltx0.9.1", latents[..., :1, :])  # too few rows to split: run whole on every rank
        parallelize_vae(vae, parallel)
        torch.manual_seed(parallel.rank)
        split = decode(vae, "ltx0.9.1", latents)
        generator = torch.equal(torch.randn(4), after[parallel.rank])
        torch.manual_seed(parallel.rank)
        whole = decode(vae, "ltx0.9.1", latents[..., :1, :])
    assert (decoded[1] - decoded[0]).abs().max() > 1e-2, "the seeds' noise does not change the decode"
    return {"error": max((split - decoded[0]).abs().max().item(), (whole - one_row).abs().max().item()),
            "generator": generator}  # fmt: skip
