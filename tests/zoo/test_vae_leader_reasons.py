"""Every VAE the family table shows as "leader decode" says why it is not split (``dit_sp.vae.leader``), and the
table prints those reasons under it."""

from __future__ import annotations

from dit_sp.families import supported_vaes
from dit_sp.vae.leader import LEADER_DECODE_REASONS
from dit_sp.zoo.table import family_table, leader_decode_vaes


def test_every_leader_decode_vae_has_a_one_line_reason_and_the_table_shows_it():
    shown = leader_decode_vaes()
    # every video VAE of diffusers 0.42.1's supported pipelines runs split: Wan's, Cosmos 1's wavelet VAE, MiniMax-H3's
    # (its calls shared out), Kandinsky 6 SR's K-VAE (by rows)
    assert not {"AutoencoderKLWan", "AutoencoderKLCosmos", "AutoencoderKLMiniMaxH3", "Kandinsky6SRVAE"} & set(shown)
    missing = [vae for vae in shown if vae not in LEADER_DECODE_REASONS]
    assert not missing, f"leader-decode VAEs without a reason in dit_sp/vae/leader.py: {missing}"
    table = family_table()
    # the heading and the cells only where a VAE is decoded by the leader (none in diffusers 0.42.1)
    assert ("Leader decode, and why" in table) == ("` leader decode |" in table) == bool(shown), shown
    for vae in shown:
        reason = LEADER_DECODE_REASONS[vae]
        assert "\n" not in reason and len(reason) > 40
        assert f"- `{vae}`: {reason}." in table


def test_no_reason_is_kept_for_a_vae_that_runs_split_or_is_not_shown():
    stale = set(LEADER_DECODE_REASONS) - set(leader_decode_vaes())
    assert not stale, f"reasons for VAEs the table does not show as leader decode: {sorted(stale)}"
    assert not set(LEADER_DECODE_REASONS) & set(supported_vaes())
