"""Row-split plans (``dit_sp.vae``) for diffusers' image VAEs that video families' pipelines take, input and output
``(B, C, H, W)`` (a video's frames folded into the batch by the pipeline).

- ``AutoencoderKL`` (Stable Diffusion's and FLUX.1's; Latte decodes its video with it, the frames in the batch, in
  chunks of ``decode_chunk_size``, and Kandinsky 5's image pipelines decode their one frame): its 3x3 convolutions with
  halos (the encoder's downsamplers pad one zero row below before their strided convolution), its group norms with the
  whole frame's statistics, the mid-block's attention on the gathered frame; the nearest upsampling is local to each
  rank's rows.
- ``AutoencoderDC`` (deep compression, x32; Sana-Video's pipelines accept it): its convolutions with halos, its
  multiscale linear attention (``SanaMultiscaleLinearAttention``: the 5x5 projections and the sums over the frame, or
  a quadratic attention on a small frame) on the gathered frame; its RMS norms are per pixel and its batch norms (in
  eval mode) per channel, so local; its pixel-unshuffle downsamplers (``DCDownBlock2d``) pair rows within each rank's
  rows (the split's rows are whole blocks of the part's downsampling), its pixel-shuffle upsamplers double each row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp.vae import Padding, TileProtocol, VAEPlan

if TYPE_CHECKING:
    import torch


def _kl_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    # Downsample2D with padding 0 pads (0, 1, 0, 1) with zeros before its stride-2 convolution: one row below
    return {module.conv: (0, 1, "constant") for module in part.modules()
            if type(module).__name__ == "Downsample2D" and module.use_conv and module.padding == 0}  # fmt: skip


def _kl_attentions(part: torch.nn.Module) -> list[torch.nn.Module]:
    # UNetMidBlock2D's attentions (None where the VAE has none) flatten the frame's rows and columns
    mid_block = getattr(part, "mid_block", None)
    return [attention for attention in getattr(mid_block, "attentions", ()) if attention is not None]


def _image_tile(kwargs: dict, out: torch.Tensor) -> torch.Tensor:
    # a call that did not run answers with an image, (B, C, 1, 1), where the tiled methods apply a 1x1 convolution
    return out.squeeze(2) if out.dim() == 5 else out


def _image_tiles(encode: str) -> TileProtocol:
    """An image VAE's tiled methods (``tiled_decode`` and the tiled encode named ``encode``): each part call is one
    tile."""
    return TileProtocol(starts_tile=lambda kwargs: True, answer=_image_tile,
                        methods=(("decoder", "tiled_decode"), ("encoder", encode)))  # fmt: skip


AUTOENCODER_KL_VAE = VAEPlan(
    class_names=("AutoencoderKL",),
    padded_inputs=_kl_padded_inputs,
    whole_frame_of=_kl_attentions,
    tiles=_image_tiles("_tiled_encode"),  # what its _encode calls (its tiled_encode is the deprecated twin)
)
"""The 2D image VAE split by rows (the module docstring); tiled, its tiles are shared out whole."""


def _dc_downsampling(part: torch.nn.Module) -> int:
    # each pixel-unshuffle downsampler halves the rows by a reshape (its convolution has stride 1)
    factor = 1
    for module in part.modules():
        if type(module).__name__ == "DCDownBlock2d" and module.downsample:
            factor *= module.factor
    return factor


AUTOENCODER_DC_VAE = VAEPlan(
    class_names=("AutoencoderDC",),
    whole_frame=("SanaMultiscaleLinearAttention",),
    downsampling=_dc_downsampling,
    tiles=_image_tiles("tiled_encode"),
)
"""The deep-compression autoencoder split by rows (the module docstring); tiled, its tiles are shared out whole."""
