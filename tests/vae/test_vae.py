"""The parallel VAE: decode and encode split over 2 and 4 processes equal one process, for every family's VAE,
untiled and tiled (the tiles shared out), on odd latent heights and widths and several frame counts."""

from __future__ import annotations

import pytest
import torch
from vae_checks import CASES, TILED_ONLY, VAES, check_vaes

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
        frames, height, width = CASES[0]
        own = RowSplit.even(height, ranks).sizes[rank]
        if family not in TILED_ONLY:
            assert own <= result["rows"]["decoder"][0] <= own + 2 < height + 2, result["rows"]["decoder"][:3]
        assert result["undone"] == 0.0
    # tiled, the tiles are shared out: every part call of the one-process run ran once, on one of the ranks
    for part in ("decoder", "encoder"):
        one = per_rank[0][family]["one_process_tiled_calls"][part]
        ran = [r[family]["tiled_calls"][part] for r in per_rank]
        assert sum(ran) == one and max(ran) < one, (part, ran, one)


def test_unsupported_vae_is_a_clear_error():
    from diffusers import AutoencoderKL

    with pytest.raises(TypeError, match="no parallel VAE plan; supported VAEs: AutoencoderKLWan"):
        parallelize_vae(AutoencoderKL(), None)


def test_split_vae_misuse_is_a_clear_error():
    for errors in spawn(_misuse, 2, timeout=120):
        assert "inference-only: run it under torch.no_grad()" in errors["grad"], errors
        assert "inference-only: run it under torch.no_grad()" in errors["tiled grad"], errors
        assert "already split" in errors["twice"], errors


def _misuse() -> dict[str, str]:
    """A decode of a latent that requires grad, and splitting a VAE twice: the errors raised."""
    import os

    from vae_checks import build

    from dit_sp import ParallelConfig, init_parallel

    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    vae = build("wan2.1")
    parallelize_vae(vae, parallel)
    errors = {}

    def tiled_grad():
        vae.enable_tiling(32, 32, 24, 24)  # 4-row latent tiles: a 6 x 6 latent is tiled
        try:
            vae.decode(torch.randn(1, 4, 1, 6, 6, requires_grad=True))
        finally:
            vae.disable_tiling()

    for name, call in {"grad": lambda: vae.decode(torch.randn(1, 4, 1, 4, 4, requires_grad=True)),
                       "tiled grad": tiled_grad, "twice": lambda: parallelize_vae(vae, parallel)}.items():  # fmt: skip
        try:
            call()
            errors[name] = "no error"
        except (RuntimeError, ValueError) as e:
            errors[name] = str(e)
    return errors
