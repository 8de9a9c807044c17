"""Every VAE the family table shows as "leader decode" says why it is not split (``dit_sp.vae.leader``), every audio
decoder it shows (whole on every rank) why it runs so, and the table prints those reasons under it."""

from __future__ import annotations

from dit_sp.families import supported_vaes
from dit_sp.vae.leader import AUDIO_DECODE_REASONS, LEADER_DECODE_REASONS
from dit_sp.zoo.table import TILES_SHARED, audio_decoders, family_table, leader_decode_vaes


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


def test_every_audio_decoder_is_shown_whole_on_every_rank_with_its_reason():
    """LTX-2's audio VAE and vocoders, Kandinsky 6's MMAudio VAE and vocoder and MiniMax-H3's audio VAE (read from the
    pipelines' annotations and the modular blocks' components) are decoded whole on every rank: the VAE column says
    so in their family's row, and each has its one-line reason under the table; no reason is kept for another."""
    shown = audio_decoders()
    expected = {"AutoencoderKLLTX2Audio", "LTX2Vocoder", "MMAudioVAE", "MMAudioVocoder", "AutoencoderKLMiniMaxH3Audio"}
    assert expected <= set(shown), shown
    assert set(AUDIO_DECODE_REASONS) == set(shown), "audio decoders shown and reasons kept differ"
    table = family_table()
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "audio: `AutoencoderKLLTX2Audio`, `LTX2Vocoder`" in rows["ltx2"]
    assert "audio: `MMAudioVAE`, `MMAudioVocoder` whole on every rank" in rows["kandinsky6"]
    # MiniMax-H3's video VAE shares whole decoder calls (tiles, clips) out: a video of one call decodes on one process
    assert f"`AutoencoderKLMiniMaxH3` {TILES_SHARED}, audio: `AutoencoderKLMiniMaxH3Audio` whole" in rows["minimax_h3"]
    assert "audio:" not in rows["wan"] and "Audio decoders, whole on every rank" in table
    for decoder in shown:
        reason = AUDIO_DECODE_REASONS[decoder]
        assert "\n" not in reason and "every rank" in reason and f"- `{decoder}`: {reason}." in table
