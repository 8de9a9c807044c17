"""Worker-side checks of the GRPO policies of CogVideoX, LTX-2, LTX-Video, SkyReels-V2, HunyuanVideo-1.5, Cosmos 2.5,
Kandinsky 5, Mochi, EasyAnimate, Motif-Video, Kandinsky 6, Sana-Video and the image-conditioned pipelines (ChronoEdit,
..., Sana-Video, Kandinsky 5 and SkyReels-V1 I2V): the gradients and log-probs of one training step through the
library's ``GRPOTrainer``, and a tiny HunyuanVideo-1.5 text-to-video pipeline (the zoo's ``tiny-hunyuanvideo15`` is a
transformer only) built offline, as diffusers' fast tests build theirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from grpo_checks import tiny_config

from dit_sp import GRPOTrainer, TrainConfig
from dit_sp.errors import ConfigError

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2.5-VL's chat format, which the pipeline's ``apply_chat_template`` call needs."""


def tiny_hunyuanvideo15(path: str) -> str:
    """A tiny ``HunyuanVideo15Pipeline`` saved at ``path``: the zoo's tiny transformer (4 latent channels, text-to-video
    inputs), a 3-layer Qwen2.5-VL text model (16 wide) with a byte-level tokenizer, a ByT5 encoder (8 wide), a VAE of
    x4 in time and x8 in space."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import format_text_input
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import (
        ByT5Tokenizer,
        PreTrainedTokenizerFast,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    from dit_sp.zoo import build_tiny

    torch.manual_seed(0)
    transformer = build_tiny("tiny-hunyuanvideo15", "transformer")
    glyph_encoder = T5EncoderModel(T5Config(vocab_size=384, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2,
                                            relative_attention_num_buckets=8))  # fmt: skip
    vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
                                      spatial_compression_ratio=8, temporal_compression_ratio=4)  # fmt: skip
    scheduler, guider = FlowMatchEulerDiscreteScheduler(shift=5.0), ClassifierFreeGuidance(guidance_scale=4.0)
    pipe = HunyuanVideo15Pipeline(text_encoder=None, tokenizer=None, transformer=transformer, vae=vae,
                                  scheduler=scheduler, text_encoder_2=glyph_encoder, tokenizer_2=ByT5Tokenizer(),
                                  guider=guider)  # fmt: skip
    # Byte-level BPE whose vocabulary also holds the words of the pipeline's system prompt, so that the chat
    # header before the prompt is exactly the pipeline's crop_start (108) tokens, as with Qwen's tokenizer: every
    # word one token but "color" (6 bytes, so 5 tokens more: 103 + 5).
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    header = f"system\n{pipe.system_message}\nuser\n"
    words = [word for word, _ in pre.pre_tokenize_str(header) if word != "\u0120color"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*alphabet, *words]))}
    bpe = Tokenizer(BPE(vocab=vocab, merges=[], ignore_merges=True))
    bpe.pre_tokenizer, bpe.decoder = pre, decoders.ByteLevel()
    bpe.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                        padding_side="right", chat_template=CHAT_TEMPLATE)  # fmt: skip
    text_config = Qwen2_5_VLTextConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                       num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                                       rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
                                       bos_token_id=None, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    pipe.register_modules(text_encoder=Qwen2_5_VLTextModel(text_config), tokenizer=tokenizer)
    crop = pipe.prompt_template_encode_start_idx
    ids = tokenizer.apply_chat_template(format_text_input(["x"], pipe.system_message), add_generation_prompt=True,
                                        return_dict=True)["input_ids"][0]  # fmt: skip
    assert tokenizer.decode(ids[crop:]).startswith("x<|im_end|>"), (len(ids), tokenizer.convert_ids_to_tokens(ids))
    pipe.save_pretrained(path)
    return path


def unrounded_dpm_solver(scheduler: Any) -> Any:
    """The pipeline's scheduler at first order (a DPM-solver++ step of a flow velocity is then its Euler step), its
    timesteps ``1000 s`` as the policy's: the stock scheduler rounds them down to integers (999 for 0.99987)."""
    from diffusers import DPMSolverMultistepScheduler

    class Unrounded(DPMSolverMultistepScheduler):
        def set_timesteps(self, *args, **kwargs):
            super().set_timesteps(*args, **kwargs)
            self.timesteps = self.sigmas[:-1] * self.config.num_train_timesteps

    return Unrounded.from_config(scheduler.config, solver_order=1)


def image_prompt_file(folder: Path) -> str:
    """A JSONL prompt file in ``folder``: two prompts, each with its own random 32x32 image (paths relative to it)."""
    from PIL import Image

    lines = []
    for seed, prompt in enumerate(["a red circle moving left", "a blue square moving up"]):
        pixels = (np.random.RandomState(seed).rand(32, 32, 3) * 255).astype("uint8")
        Image.fromarray(pixels).save(folder / f"image{seed}.png")
        lines.append(json.dumps({"prompt": prompt, "image": f"image{seed}.png"}) + "\n")
    (folder / "prompts.jsonl").write_text("".join(lines))
    return str(folder / "prompts.jsonl")


def family_configs(hunyuanvideo15: str, images: str, **layout) -> list:
    """One small GRPO run per family (a group of 2 samples, guided, 2 steps, both trained), on ``layout``; the
    image-conditioned pipelines read ``images`` (a JSONL prompt file with an image per prompt)."""
    common = {"steps": 2, "group_size": 2, "prompts_per_step": 1, "frames": 5, "guidance": 2.0, **layout}
    with_images = common | {"prompts": images, "height": 32, "width": 32}  # square: see image_prompt_file
    return [
        tiny_config(model="tiny-cogvideox", height=32, width=32, **{"sample.max_sequence_length": 8}, **common),
        tiny_config(model="tiny-ltx2", height=16, width=16, parallel_vae=False, **common),
        tiny_config(model="tiny-ltx", height=32, width=32, **{"sample.max_sequence_length": 16}, **common),
        tiny_config(model="tiny-skyreels-v2", height=48, width=32, **{"sample.max_sequence_length": 16}, **common),
        # its VAE decodes split by rows on 1x2 and 2x1 (4 latent rows)
        tiny_config(model=hunyuanvideo15, height=32, width=48, **{"sample.max_sequence_length": 32}, **common),
        # the chat template takes ~110 of the 160 text tokens; Wan's VAE decodes split by rows
        tiny_config(model="tiny-cosmos2.5", height=32, width=32, **{"sample.max_sequence_length": 160}, **common),
        # prompt and negative prompt lengths differ (two transformer calls a guided step); its VAE (HunyuanVideo's)
        # decodes split by rows
        tiny_config(model="tiny-kandinsky5", height=48, width=32, **{"sample.max_sequence_length": 64}, **common),
        # Mochi's VAE takes 6k+1 frames (2 latent frames); its VAE decodes split by rows
        tiny_config(
            model="tiny-mochi", height=32, width=32, **{"sample.max_sequence_length": 32}, **common | {"frames": 7}
        ),
        # the pipeline's 256 unmasked text tokens; MagVit's VAE decodes split by rows
        tiny_config(model="tiny-easyanimate", height=32, width=32, **{"sample.max_sequence_length": 256}, **common),
        # Wan's VAE decodes split by rows
        tiny_config(model="tiny-motif-video", height=32, width=32, **{"sample.max_sequence_length": 32}, **common),
        # audio off; HunyuanVideo's VAE decodes split by rows
        tiny_config(model="tiny-kandinsky6", height=32, width=32, **{"sample.max_sequence_length": 32}, **common),
        # Gemma 2 text behind the pipeline's complex-human instruction; Wan's VAE decodes split by rows
        tiny_config(model="tiny-sana-video", height=32, width=32, **{"sample.max_sequence_length": 16}, **common),
        # image edit: the image's latents in channels and CLIP tokens in cross-attention; Wan's VAE decodes split
        tiny_config(model="tiny-chronoedit", **{"sample.max_sequence_length": 16}, **with_images),
        # the image's latents in channels; CogVideoX's VAE decodes split by rows
        tiny_config(model="tiny-cogvideox-i2v", **{"sample.max_sequence_length": 8}, **with_images),
        # SigLIP tokens and the image's latents and mask (its 32x32 bucket); 32 text tokens of the byte-level template
        # (system-prompt bytes: the same text on every layout; test_family_policies_image.py runs the real prompt)
        tiny_config(model="tiny-hunyuanvideo15-i2v", **{"sample.max_sequence_length": 32}, **with_images),
        # the image's latents are the clean first frame (timestep 0 on its tokens): the policy's latents are the rest
        tiny_config(model="tiny-ltx-i2v", **{"sample.max_sequence_length": 16}, **with_images),
        # the image's latents (the VAE's mode) are the clean first frame (timestep 0 on its tokens); Wan's VAE split
        tiny_config(model="tiny-sana-video-i2v", **{"sample.max_sequence_length": 16}, **with_images),
        # Wan 2.1 I2V's conditioning: the image's latents and mask in channels, CLIP tokens in cross-attention
        tiny_config(model="tiny-skyreels-v2-i2v", **{"sample.max_sequence_length": 16}, **with_images),
        # the image's latents are the clean first frame (the step's timestep on its tokens, the visual_cond mask on it);
        # 5 latent frames (its first-frame normalization needs them); the template cuts the prompt at 64 tokens
        tiny_config(model="tiny-kandinsky5-i2v", **{"sample.max_sequence_length": 64}, **with_images | {"frames": 17}),
        # SkyReels-V1 (HunyuanVideo): the image's latents in channels, true guidance and the embedded guidance 1.0
        tiny_config(model="tiny-hunyuanvideo-skyreels-i2v", **{"sample.max_sequence_length": 32}, **with_images),
        # text-to-video: the pipeline's zero VACE context through the VACE blocks (split like the video)
        tiny_config(model="tiny-wan-vace", height=32, width=32, **{"sample.max_sequence_length": 16}, **common),
        # LTX-2 I2V, audio isolated: the image's latents (re-compressed, the VAE's mode) are the clean first frame
        tiny_config(model="tiny-ltx2-i2v", **{"sample.max_sequence_length": 32}, **with_images),
        # EasyAnimate inpaint as image-to-video: the mask's and the masked video's latents in channels (the pipeline's
        # 256 unmasked text tokens); MagVit's VAE decodes split by rows
        tiny_config(model="tiny-easyanimate-inpaint", **{"sample.max_sequence_length": 256}, **with_images),
        # Motif-Video I2V: the image's latents and mask in channels, its SigLIP tokens (computed with the prompts'
        # embeddings, read from their files) in front of the text; Wan's VAE decodes split by rows
        tiny_config(model="tiny-motif-video-i2v", **{"sample.max_sequence_length": 32}, **with_images),
        # Kandinsky 5 text-to-image: one frame at the tiny pipeline's one resolution; its image VAE decodes split
        tiny_config(
            model="tiny-kandinsky5-t2i",
            height=64,
            width=64,
            **{"sample.max_sequence_length": 64},
            **common | {"frames": 1},
        ),  # fmt: skip
        # SkyReels-V2 diffusion forcing, synchronous in one chunk: per-frame timesteps (per-token modulation, split
        # with the tokens); image-to-video: the image's latents the clean first frame at timestep 0
        tiny_config(model="tiny-skyreels-v2-df", height=48, width=32, **{"sample.max_sequence_length": 16}, **common),
        tiny_config(model="tiny-skyreels-v2-df-i2v", **{"sample.max_sequence_length": 16}, **with_images),
        # LTX-2 condition: LTX-2 I2V with the image as one condition at the first frame (the pipeline's own encoding)
        tiny_config(model="tiny-ltx2-condition", **{"sample.max_sequence_length": 32}, **with_images),
        # Cosmos 3 (sound and action off): one packed sequence per sample and branch, the templated prompt's ~200 ids
        # of the byte-level tokenizer; 32 x 48 (at 32 x 32 the group's two rewards are within 1e-5 of each other, so
        # their normalised advantages amplify a ring's 1e-7 rounding past the tolerance); Wan's VAE decodes split
        tiny_config(model="tiny-cosmos3", height=32, width=48, **{"sample.max_sequence_length": 256}, **common),
        # image-to-video: the image's latents (the VAE's mode) are the clean first frame (no timestep, no prediction)
        tiny_config(model="tiny-cosmos3", **{"sample.max_sequence_length": 256}, **with_images),
        # Kandinsky 5 image editing: the source image's latents and mask in channels, the prompt and the negative
        # prompt each encoded with the image (its 64 tokens in ~250 text tokens); one frame at the tiny's one size
        tiny_config(
            model="tiny-kandinsky5-i2i",
            **{"sample.max_sequence_length": 512},
            **with_images | {"frames": 1, "height": 64, "width": 64},
        ),
    ]


def family_steps(configs: list) -> list[dict]:
    """For each run: the full gradients of step 0's update (of the parameters that got one) and every trained
    parameter's name, the rollout's log-probabilities and rewards, the ratio range (exactly on-policy: 1), and the
    most rows the VAE decoder's first convolution took on this rank (a split decode: its own rows and a halo)."""
    from dit_sp import GRPOTrainer
    from dit_sp.rl.batch import seed_for
    from dit_sp.rl.update import accumulate_gradients

    results = []
    for cfg in configs:
        trainer = GRPOTrainer(cfg)
        rows = [0]
        if getattr(trainer.pipe, "vae", None) is not None:
            convs = (m for m in trainer.pipe.vae.decoder.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)))
            next(convs).register_forward_pre_hook(lambda m, args, rows=rows: rows.append(args[0].shape[-2]))
        data = trainer.collect(0)
        trainer.optimizer.zero_grad(set_to_none=True)
        stats = accumulate_gradients(trainer.policy, data.traj, data.cond, data.advantages, cfg.grpo,
                                     seed_for(cfg.seed, 0, 1))  # fmt: skip
        grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                 for name, p in trainer.transformer.named_parameters() if p.grad is not None}  # fmt: skip
        names = [name for name, _ in trainer.transformer.named_parameters()]
        results.append({"policy": type(trainer.policy).__name__, "grads": grads, "log_probs": data.traj.log_probs,
                        "parameters": names, "decoder_rows": max(rows),
                        "rewards": data.rewards, "ratio": (stats["ratio_min"], stats["ratio_max"])})  # fmt: skip
    return results


def refusal_when_built(config: TrainConfig) -> str:
    """The one-line ``ConfigError`` that building a ``GRPOTrainer`` of ``config`` raises ("" where it builds)."""
    try:
        GRPOTrainer(config)
    except ConfigError as e:
        return str(e)
    return ""


def refusal_when_built_elsewhere(config: TrainConfig, other_image: str | None) -> str:
    """``refusal_when_built`` with rank 1 as a machine without the shared disk, where the run's image paths hold
    another image (every PNG's bytes read there are ``other_image``'s) or, with ``other_image`` None, no image."""
    import os

    if os.environ["RANK"] == "1" and other_image is not None:
        read = Path.read_bytes
        Path.read_bytes = lambda self: read(Path(other_image) if self.suffix == ".png" else self)
    elif os.environ["RANK"] == "1":
        is_file = Path.is_file
        Path.is_file = lambda self: self.suffix != ".png" and is_file(self)
    return refusal_when_built(config)


def image_tokens_through_runs(configs: list[TrainConfig]) -> list[dict]:
    """Trainers of ``configs`` built in turn (a checkpoint directory: Motif-Video I2V, Kandinsky 5 I2I), each after the
    one before saved its checkpoint at step 0 and was dropped (the later ones resume): for each, the images whose
    text-encoder parts it encoded (Motif's SigLIP tokens) and the (prompt, image) pairs whose text it encoded (a prompt
    encoder that reads the image), whether its pipeline still holds a text encoder and how many of their text encoders
    (T5Gemma2's encoder, Qwen2.5-VL) are alive, and the conditioning its policy gives each prompt with its image."""
    import gc
    import warnings

    from transformers import Qwen2_5_VLForConditionalGeneration, T5Gemma2Encoder

    from dit_sp.rl.embeddings import PromptEmbeddings

    pairs, stock_compute = [], PromptEmbeddings.compute_pairs

    def compute_pairs(self, todo, *args, **kwargs):
        pairs.extend((prompt, Path(image).name) for prompt, image in todo)
        return stock_compute(self, todo, *args, **kwargs)

    PromptEmbeddings.compute_pairs = compute_pairs
    results = []
    for config in configs:
        pairs.clear()
        trainer = GRPOTrainer(config)
        gc.collect()
        with warnings.catch_warnings():  # looking at every object touches deprecated torch attributes
            warnings.simplefilter("ignore")
            encoders = (T5Gemma2Encoder, Qwen2_5_VLForConditionalGeneration)
            alive = sum(isinstance(thing, encoders) for thing in gc.get_objects())
        cond = [trainer.policy.encode([prompt], [image]) for prompt, image in zip(trainer.prompts, trainer.images)]
        results.append({"encoded": [Path(image).name for image in trainer._missing_images], "alive": alive,
                        "pairs": list(pairs), "text_encoder": trainer.pipe.text_encoder is not None,
                        "cond": cond})  # fmt: skip
        trainer.save_checkpoint()
        del trainer
        gc.collect()
    PromptEmbeddings.compute_pairs = stock_compute
    return results
