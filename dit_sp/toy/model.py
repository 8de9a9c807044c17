"""The tiny text-to-video model of the synthetic shape world (``dit_sp.toy.world``): its training (the
shipped ``toy-wan``) and its evaluation by prompt faithfulness.

Training uses the same classes as the real Wan models: an ``AutoencoderKLWan`` (4x spatial, 4x temporal
compression, 8 latent channels), a ``WanTransformer3DModel`` trained with rectified flow on pre-encoded
latents, and a frozen random ``UMT5EncoderModel`` behind a word-level tokenizer of the world's 16 words.
Deterministic: the same torch version and thread count reproduce the shipped weights.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dit_sp.toy import world as toyworld
from dit_sp.zoo import load_pipeline

WORDS = ["<pad>", "<unk>", "</s>", "a", "moving", *toyworld.COLORS, *toyworld.SHAPES, *toyworld.DIRECTIONS]
FRAMES, SIZE = 9, 32


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def build_components(seed: int) -> dict:
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(WORDS), d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                               num_heads=2, relative_attention_num_buckets=8)).eval()  # fmt: skip
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(base_dim=16, z_dim=8, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[True, True],
                           scale_factor_spatial=4, scale_factor_temporal=4, latents_mean=[0.0] * 8,
                           latents_std=[1.0] * 8)  # fmt: skip
    torch.manual_seed(seed + 2)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32,
                                        in_channels=8, out_channels=8, text_dim=32, freq_dim=64, ffn_dim=256,
                                        num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        rope_max_seq_len=64)  # fmt: skip
    return {"tokenizer": build_tokenizer(), "text_encoder": text_encoder, "vae": vae, "transformer": transformer,
            "scheduler": FlowMatchEulerDiscreteScheduler(shift=2.0)}  # fmt: skip


def clip_batch(step: int, batch: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    """``(B, 3, F, H, W)`` in [-1, 1] and captions; a fresh random batch per step."""
    attrs = toyworld.all_attributes()
    clips, captions = [], []
    for i in range(batch):
        a = attrs[toyworld.random.Random(f"{seed}-{step}-{i}").randrange(len(attrs))]
        clips.append(toyworld.render(a, seed=hash((seed, step, i)) % 2**31, frames=FRAMES, size=SIZE))
        captions.append(a.caption)
    return torch.stack(clips).permute(0, 2, 1, 3, 4) * 2 - 1, captions


def train_vae(vae, steps: int, seed: int, batch: int = 8, lr: float = 2e-3) -> None:
    # A fresh encoder's log-variance makes the latent pure noise and training stalls: start it near -6.
    with torch.no_grad():
        z = vae.config.z_dim
        vae.quant_conv.weight[z:].zero_()
        vae.quant_conv.bias[z:].fill_(-6.0)
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc="VAE")
    for step in bar:
        x, _ = clip_batch(step, batch, seed)
        posterior = vae.encode(x).latent_dist
        latent = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        recon = vae.decode(latent).sample
        kl = 0.5 * (posterior.mean**2 + posterior.var - 1 - posterior.logvar).mean()
        # Edges (spatial gradients) weigh in too: without them the decoder blurs every shape into a blob.
        edges = F.l1_loss(recon.diff(dim=-1), x.diff(dim=-1)) + F.l1_loss(recon.diff(dim=-2), x.diff(dim=-2))
        loss = F.mse_loss(recon, x) + 0.5 * F.l1_loss(recon, x) + edges + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 20 == 0:
            bar.set_postfix(mse=f"{F.mse_loss(recon, x).item():.4f}")


@torch.no_grad()
def encode_dataset(vae, seeds_per_caption: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    latents, captions = [], []
    attrs = toyworld.all_attributes()
    for k in tqdm(range(seeds_per_caption), desc="encode"):
        clips = torch.stack([toyworld.render(a, seed=10_000 + k * 1000 + i, frames=FRAMES, size=SIZE)
                             for i, a in enumerate(attrs)])  # fmt: skip
        latents.append(vae.encode(clips.permute(0, 2, 1, 3, 4) * 2 - 1).latent_dist.mean)
        captions += [a.caption for a in attrs]
    return torch.cat(latents), captions


def train_transformer(pipe, latents: torch.Tensor, captions: list[str], steps: int, seed: int, batch: int = 32,
                      lr: float = 7e-4) -> torch.nn.Module:  # fmt: skip
    transformer = pipe.transformer
    ema = copy.deepcopy(transformer).requires_grad_(False)
    with torch.no_grad():
        unique = sorted(set(captions))
        embeds, _ = pipe.encode_prompt(unique + [""], do_classifier_free_guidance=False, max_sequence_length=16)
    table = {c: i for i, c in enumerate(unique)}
    caption_index = torch.tensor([table[c] for c in captions])
    null = len(unique)
    opt = torch.optim.AdamW(transformer.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc="transformer")
    for step in bar:
        idx = torch.randint(len(latents), (batch,), generator=gen)
        x0 = latents[idx]
        text = caption_index[idx].clone()
        text[torch.rand(batch, generator=gen) < 0.1] = null  # unconditional for guidance
        s = torch.sigmoid(torch.randn(batch, generator=gen))  # logit-normal noise levels
        eps = torch.randn(x0.shape, generator=gen)
        xs = (1 - s.view(-1, 1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1, 1) * eps
        v = transformer(hidden_states=xs, timestep=s * 1000, encoder_hidden_states=embeds[text], return_dict=False)[0]
        loss = F.mse_loss(v, eps - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            decay = min(0.999, (1 + step) / (10 + step))
            for e, p in zip(ema.parameters(), transformer.parameters()):
                e.lerp_(p, 1 - decay)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return ema


def train_toy_model(out: str | Path, *, work_dir: str | Path = "outputs/toy",
                    stage: Literal["all", "vae", "transformer"] = "all", vae_steps: int = 1500,
                    transformer_steps: int = 2500, seeds_per_caption: int = 12, seed: int = 0) -> float:  # fmt: skip
    """Train the VAE (stage ``vae``: saved to ``work_dir/vae``), then the transformer on its latents, and
    write the pipeline to ``out``; returns the seconds it took."""
    from diffusers import AutoencoderKLWan, WanPipeline

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    parts = build_components(seed)
    began = time.perf_counter()
    if stage in ("all", "vae"):
        train_vae(parts["vae"], vae_steps, seed)
        parts["vae"].save_pretrained(work_dir / "vae")
    if stage == "vae":
        return time.perf_counter() - began
    parts["vae"] = AutoencoderKLWan.from_pretrained(work_dir / "vae").eval()
    latents, captions = encode_dataset(parts["vae"], seeds_per_caption, seed)
    # Normalise the latents per channel (the pipeline's latents_mean / latents_std).
    mean, std = latents.mean((0, 2, 3, 4)), latents.std((0, 2, 3, 4))
    parts["vae"].register_to_config(latents_mean=mean.tolist(), latents_std=std.tolist())
    latents = (latents - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1)
    pipe = WanPipeline(**parts)
    pipe.transformer = train_transformer(pipe, latents, captions, transformer_steps, seed)
    pipe.save_pretrained(out, safe_serialization=True)
    return time.perf_counter() - began


ATTRIBUTES = ("color", "shape", "direction")


@torch.no_grad()
def sample_scores(model: str | Path, prompts: list[str], seeds: int, steps: int = 20, guidance: float = 4.0,
                  frames: int = 9, size: int = 32) -> list[dict[str, bool]]:  # fmt: skip
    """Per sample (seed-major, then prompt): which attributes the generated video shows as asked."""
    pipe = load_pipeline(str(model), torch.float32)
    return _scores(pipe, Path(model).name, prompts, seeds, steps, guidance, frames, size)


def cached_sample_scores(model: str | Path, prompts: list[str], seeds: int, cache: Any, steps: int = 20,
                         guidance: float = 4.0, frames: int = 9, size: int = 32) -> tuple[list, float]:  # fmt: skip
    """``sample_scores`` with step caching (``dit_sp.cache.enable_cache(pipe, cache)``), and the fraction of
    transformer block evaluations it skipped."""
    from dit_sp.cache import enable_cache

    pipe = load_pipeline(str(model), torch.float32)
    step_cache = enable_cache(pipe, cache)
    scores = _scores(pipe, f"{Path(model).name} {cache}", prompts, seeds, steps, guidance, frames, size)
    return scores, step_cache.stats.saved_fraction


def _scores(pipe: Any, name: str, prompts: list[str], seeds: int, steps: int, guidance: float, frames: int,
            size: int) -> list[dict[str, bool]]:  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    scores = []
    for seed in tqdm(range(seeds), desc=f"eval {name}", leave=False):
        videos = pipe(prompt=prompts, negative_prompt=[""] * len(prompts), height=size, width=size, num_frames=frames,
                      num_inference_steps=steps, guidance_scale=guidance, max_sequence_length=16,
                      generator=torch.Generator().manual_seed(seed), output_type="pt").frames  # fmt: skip
        for video, prompt in zip(videos, prompts):
            scores.append(dict(zip(ATTRIBUTES, toyworld.matches(video, toyworld.Attributes.parse(prompt)))))
    return scores


def summarize(scores: list[dict[str, bool]]) -> dict[str, float]:
    accuracy = {key: sum(s[key] for s in scores) / len(scores) for key in ATTRIBUTES}
    return accuracy | {"faithfulness": sum(accuracy.values()) / 3, "samples": len(scores)}


def paired_gain(scores: list[dict[str, bool]], baseline: list[dict[str, bool]]) -> dict[str, float]:
    """Mean per-sample faithfulness difference and its 95% confidence interval (normal approximation)."""
    diffs = [sum(a.values()) / 3 - sum(b.values()) / 3 for a, b in zip(scores, baseline)]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1))
    half = 1.96 * sd / math.sqrt(len(diffs))
    return {"gain": mean, "gain_ci95": [mean - half, mean + half]}
