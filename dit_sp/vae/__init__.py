"""The parallel VAE: a diffusers video VAE's decode and encode with each frame's rows split over processes
(``split``: halo convolutions, whole-frame norms and attention), and tiled calls with whole tiles shared out
(``tiles``)."""

from dit_sp.vae.split import Padding, VAEPlan, split_forward
from dit_sp.vae.tiles import TileProtocol, share_tiles

__all__ = ["Padding", "TileProtocol", "VAEPlan", "share_tiles", "split_forward"]
