"""The bundled generate configs of EasyAnimate V5.1 12B, Allegro, HunyuanVideo-1.5 480p, Helios 14B, the variant
pipelines' checkpoints (Lucy Edit Dev, SkyReels-V1 HunyuanVideo I2V, Kandinsky 5.0 I2V Pro), Kandinsky 6.0 Pro and
MiniMax-H3 (Modular Diffusers; its packed sequence counted with MiniMax-H3's 17 n + 5 -> 5 n + 2 frames), Motif-Video
2B (its decoder layers split), Kandinsky 6.0 VSR (planned by tile: tests/memory/test_kandinsky6_sr_plan.py) and
Wan-Animate-2 (Modular Diffusers; its reference KV cache: tests/memory/test_kv_caches.py): each loads as a generate
config, names its architecture for the planner (the longest key in its name: HunyuanVideo-1.5's holds HunyuanVideo's),
holds a transformer of the published size, and plans on its own layout."""

from __future__ import annotations

import pytest

from dit_sp.inference.config import GenerateConfig
from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
from dit_sp.memory.sampling import SamplingSettings, plan_sampling

# config: (published transformer parameters, heads)
CONFIGS = {"easyanimate-v5.1-12b": (12e9, 48), "allegro": (2.8e9, 24), "hunyuanvideo-1.5-480p-t2v": (8.3e9, 16),
           "helios-14b": (14e9, 40), "lucy-edit-dev": (5e9, 24), "skyreels-v1-hunyuan-i2v": (13e9, 24),
           "kandinsky5-i2v-pro": (19e9, 32), "minimax-h3": (33.1e9, 56), "kandinsky5-t2i-lite": (6e9, 20),
           "easyanimate-v5.1-12b-inp": (12e9, 48), "kandinsky5-i2i-lite": (6e9, 20),
           "kandinsky-6.0-pro": (29e9, 32), "motif-video-2b": (2e9, 12), "kandinsky-6.0-vsr": (1.4e9, 28),
           # named "14B", Wan 2.1 I2V 14B's shape (16.4e9, as SkyReels-V2 I2V 14B's): its research repository's 82.5 GB
           # are two such bf16 DiTs (base and distilled) and UMT5-XXL, CLIP ViT-H and the VAE (16.7 GB)
           "wan2.2-animate-2-14b": (16.4e9, 40)}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_names_its_architecture_of_the_published_size_and_plans(name):
    config = GenerateConfig.load(name)
    assert architecture_name(name) == name
    assert architecture_name(f"/models/{name.upper()}-Diffusers") == name
    published, heads = CONFIGS[name]
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert abs(shape.params - published) <= 0.05 * published, shape.params
    assert shape.heads == heads and heads % config.ulysses == 0
    video = {"frames": config.frames, "height": config.height, "width": config.width, "dtype": config.dtype}
    settings = SamplingSettings(name, **video, ring=config.ring, ulysses=config.ulysses,
                                guidance=config.guidance > 1, shard_weights=config.shard_weights)  # fmt: skip
    plan = plan_sampling(settings, config.ulysses * config.ring, 141)
    assert plan.fits, plan


def test_framepack_config_is_not_taken_for_hunyuanvideo():
    assert architecture_name("hunyuanvideo-framepack-i2v") == "hunyuanvideo-framepack-i2v"
    assert architecture_name("HunyuanVideo-Diffusers") == "hunyuanvideo"


def test_minimax_h3_counts_the_latent_frames_of_its_vae_clips():
    """MiniMax-H3's VAE encodes 17 n + 5 frames to 5 n + 2 latent frames (other counts are rounded up to that)."""
    from dit_sp.memory.planner import tokens

    spec = ARCHITECTURES["minimax-h3"]
    shape = TransformerShape.of(*spec["transformers"]["transformer"])
    per_frame = (768 // 16 // 2) * (1344 // 16 // 2)
    assert tokens(shape, 124, 768, 1344, spec["compression"]) == 37 * per_frame
    assert tokens(shape, 125, 768, 1344, spec["compression"]) == 42 * per_frame  # 141 frames
