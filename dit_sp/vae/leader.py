"""Why a video VAE is decoded by one process of a sample (the "leader decode" of the README's family table), and why
an audio decoder runs whole on every rank (``AUDIO_DECODE_REASONS``).

A VAE runs split (``dit_sp.vae.split``) when a family registers a ``VAEPlan`` for its class; every other VAE of a
supported pipeline is decoded whole by the sample's leader. Each such class has its reason here, read from its
diffusers code: ``dit_sp.zoo.table`` prints them under the table, and ``tests/zoo/test_vae_leader_reasons.py``
checks that every leader-decode VAE of the table has one (and that none is left for a VAE that runs split). Every
video VAE of the supported pipelines in diffusers 0.42.1 runs split now (the last, Kandinsky 6 SR's K-VAE, by rows:
``dit_sp.families.kandinsky6_sr``), so none is listed.
"""

from __future__ import annotations

LEADER_DECODE_REASONS: dict[str, str] = {}
"""The reason each leader-decode VAE class is not split, by class name (one line each)."""

_WHOLE = (
    "the transformer leaves the audio stream whole on every rank (short, and every audio token attends to every "
    "video token), so each rank decodes all of it itself, without communication"
)
AUDIO_DECODE_REASONS: dict[str, str] = {
    "AutoencoderKLLTX2Audio": f"LTX-2's mel-spectrogram VAE (about 25 latent frames a second); {_WHOLE}: small beside "
    "the video decode, and its causal time axis and mel bins give no frame rows to split",
    "LTX2Vocoder": f"LTX-2's 1D convolutional vocoder over time, from the mel spectrogram; {_WHOLE}: small beside the "
    "video decode",
    "LTX2VocoderWithBWE": f"LTX-2's vocoder with bandwidth extension, 1D over time; {_WHOLE}: small beside the video "
    "decode",
    "MMAudioVAE": f"Kandinsky 6's mel-spectrogram VAE (MMAudio, a latent per 1024 samples of 44.1 kHz audio); {_WHOLE}:"
    " 1D over time, small beside the video decode",
    "MMAudioVocoder": f"Kandinsky 6's BigVGAN-v2 vocoder, 1D over time, from the mel spectrogram; {_WHOLE}: small "
    "beside the video decode",
    "AutoencoderKLMiniMaxH3Audio": "MiniMax-H3's waveform VAE (a BigVGAN decoder, 40 latents a second at 32 kHz); "
    "its audio rows are gathered whole on every rank at the transformer's output head, so each rank decodes all of "
    "them itself, without communication: 1D over time, small beside the video decode",
}
"""Why each audio decoder class (a pipeline's ``audio_vae`` or ``vocoder``) runs whole on every rank of a sample, by
class name (one line each): the README's family table shows them in the VAE column and prints these under it."""

WHOLE_DECODE_REASONS: dict[str, str] = {
    "LTX2VideoDiffusionDecoderModel": "LTX-2.5's diffusion video decoder (LTX25ModularPipeline's decode stage): every "
    "rank of a sample runs it whole on the gathered latents, its pixel noise drawn from the generator every rank "
    "shares, so all decode the same frames; its 3D neighborhood attention (flex BlockMask windows of up to 11 cells a "
    "side) has no row-split adapter in dit_sp.vae",
}
"""Why each video decoder class that is not a pipeline's ``vae`` (a modular pipeline's ``diffusion_decoder``) runs
whole on every rank of a sample, by class name (one line each): the README's family table shows them in the VAE
column and prints these under it."""
