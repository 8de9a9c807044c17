"""CLIP-family rewards from local checkpoints (nothing is downloaded), frames subsampled: ``clip_score``
(text-video cosine similarity, ``ClipScore``), ``pickscore`` (a preference-tuned CLIP's scaled similarity),
``hps`` (an open_clip HPS checkpoint converted into the transformers CLIP architecture) and ``aesthetic``
(an aesthetic head on CLIP image features)."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F

from dit_sp.errors import ConfigError, MissingFileError

Tensor = torch.Tensor


class ClipScore:
    """Cosine similarity of CLIP text and (frame-averaged) image embeddings, from a local checkpoint
    directory holding a ``CLIPModel`` and its tokenizer. Nothing is downloaded."""

    def __init__(self, path: str, frames: int = 4, device: str | None = None):
        from transformers import AutoTokenizer, CLIPModel

        if not Path(path, "config.json").is_file():
            raise MissingFileError(f"clip_score: {path} holds no CLIP checkpoint (config.json missing)")
        self.model = CLIPModel.from_pretrained(path, local_files_only=True).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.frames = frames
        if device:
            self.model.to(device)
        size = self.model.config.vision_config.image_size
        self.size = (size, size)
        self.mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
        self.std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)

    def frame_embeddings(self, videos: Tensor) -> Tensor:
        """``(B, frames, D)``: unit CLIP image embeddings of ``frames`` frames spread over each video."""
        device = next(self.model.parameters()).device
        b, f = videos.shape[:2]
        index = torch.linspace(0, f - 1, min(self.frames, f)).round().long()
        frames = videos[:, index].flatten(0, 1).float().to(device)
        frames = F.interpolate(frames, size=self.size, mode="bilinear", align_corners=False)
        frames = (frames - self.mean.to(device)) / self.std.to(device)
        image = self.model.get_image_features(pixel_values=frames)
        image = getattr(image, "pooler_output", image)  # transformers versions differ
        return F.normalize(image, dim=-1).view(b, len(index), -1)

    def text_embeddings(self, prompts: list[str]) -> Tensor:
        """``(B, D)``: unit CLIP text embeddings."""
        device = next(self.model.parameters()).device
        tokens = self.tokenizer(prompts, padding=True, truncation=True, return_tensors="pt").to(device)
        text = self.model.get_text_features(**tokens)
        return F.normalize(getattr(text, "pooler_output", text), dim=-1)

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        image = F.normalize(self.frame_embeddings(videos).mean(1), dim=-1)
        return (image * self.text_embeddings(prompts)).sum(-1).cpu()


class PickScore(ClipScore):
    """PickScore-style preference: a preference-tuned ``CLIPModel`` checkpoint (e.g. yuvalkirstain/PickScore_v1
    with its processor's tokenizer, downloaded beforehand) scores ``logit_scale * cos(text, image)`` per
    frame, averaged over the frames."""

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        per_frame = (self.frame_embeddings(videos) * self.text_embeddings(prompts).unsqueeze(1)).sum(-1)
        return (self.model.logit_scale.exp() * per_frame).mean(1).cpu()


def open_clip_to_transformers(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An open_clip CLIP state dict (e.g. an HPS checkpoint) as the state dict of transformers'
    ``CLIPModel``: the fused ``in_proj`` attention weights split into q, k, v, and the projections
    transposed. Raises ``ConfigError`` naming any key it does not know."""
    block = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
             "attn.out_proj": "self_attn.out_proj"}  # fmt: skip
    fixed = {"logit_scale": "logit_scale", "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
             "positional_embedding": "text_model.embeddings.position_embedding.weight",
             "visual.class_embedding": "vision_model.embeddings.class_embedding",
             "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
             "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight"}  # fmt: skip
    norms = {"ln_final": "text_model.final_layer_norm", "visual.ln_pre": "vision_model.pre_layrnorm",
             "visual.ln_post": "vision_model.post_layernorm"}  # fmt: skip
    fixed |= {f"{a}.{kind}": f"{b}.{kind}" for a, b in norms.items() for kind in ("weight", "bias")}
    resblock = re.compile(r"(visual\.)?transformer\.resblocks\.(\d+)\.(.+)\.(weight|bias|in_proj_weight|in_proj_bias)")
    out, unknown = {}, []
    for key, value in state.items():
        match = resblock.fullmatch(key)
        if key in fixed:
            out[fixed[key]] = value
        elif key in ("text_projection", "visual.proj"):
            out["text_projection.weight" if key == "text_projection" else "visual_projection.weight"] = value.t()
        elif key == "attn_mask":
            continue  # a buffer (the causal mask)
        elif match:
            tower = "vision_model" if match.group(1) else "text_model"
            prefix, name, kind = f"{tower}.encoder.layers.{match.group(2)}", match.group(3), match.group(4)
            if kind.startswith("in_proj"):
                for part, chunk in zip("qkv", value.chunk(3)):
                    out[f"{prefix}.self_attn.{part}_proj.{kind.removeprefix('in_proj_')}"] = chunk
            elif name in block:
                out[f"{prefix}.{block[name]}.{kind}"] = value
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(f"not an open_clip CLIP state dict: unknown keys {unknown[:5]}")
    return out


class HPSScore(ClipScore):
    """HPS-style preference (HPSv2): an open_clip CLIP checkpoint (e.g. ``HPS_v2_compressed.pt``) loaded
    into the transformers CLIP architecture at ``path`` (its ``config.json`` and tokenizer, e.g.
    CLIP-ViT-H-14 for HPSv2); the reward is the text-image cosine similarity per frame, averaged."""

    def __init__(self, path: str, weights: str, frames: int = 4, device: str | None = None):
        super().__init__(path, frames, None)
        if not Path(weights).is_file():
            raise MissingFileError(f"hps: weights {weights} do not exist (an open_clip checkpoint)")
        state = torch.load(weights, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        state = {k.removeprefix("module."): v for k, v in state.items()}
        missing, unexpected = self.model.load_state_dict(open_clip_to_transformers(state), strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise ConfigError(f"hps: {weights} does not fit the CLIP architecture at {path}: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")  # fmt: skip
        if device:
            self.model.to(device)

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        return (self.frame_embeddings(videos) * self.text_embeddings(prompts).unsqueeze(1)).sum(-1).mean(1).cpu()


class AestheticScore(ClipScore):
    """An aesthetic head on CLIP image features (the LAION aesthetic predictor's format: a stack of linear
    layers over unit CLIP ViT-L/14 image embeddings, e.g. ``sac+logos+ava1-l14-linearMSE.pth``): the mean
    predicted score of the video's frames. ``path``: the CLIP checkpoint directory; ``head``: the head's
    state dict (``.pth``/``.pt`` read without pickle, or ``.safetensors``)."""

    def __init__(self, path: str, head: str, frames: int = 4, device: str | None = None):
        super().__init__(path, frames, device)
        if not Path(head).is_file():
            raise MissingFileError(f"aesthetic: head {head} does not exist (the aesthetic MLP's state dict)")
        if head.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(head)
        else:
            state = torch.load(head, map_location="cpu", weights_only=True)
        weights = sorted((k for k, v in state.items() if k.endswith("weight") and v.dim() == 2),
                         key=lambda k: [int(part) if part.isdigit() else part for part in k.split(".")])  # fmt: skip
        if not weights:
            raise ConfigError(f"aesthetic: {head} holds no linear layers")
        device = next(self.model.parameters()).device
        self.layers = [(state[k].float().to(device), state[k[: -len("weight")] + "bias"].float().to(device))
                       for k in weights]  # fmt: skip
        if self.layers[0][0].shape[1] != self.model.config.projection_dim:
            width, clip = self.layers[0][0].shape[1], self.model.config.projection_dim
            raise ConfigError(f"aesthetic: the head takes {width}-dim features, the CLIP model gives {clip}; pair "
                              "the head with its CLIP model")  # fmt: skip

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        x = self.frame_embeddings(videos)
        for weight, bias in self.layers:  # the LAION head has no nonlinearity (its dropouts are off in eval)
            x = F.linear(x, weight, bias)
        return x.squeeze(-1).mean(1).cpu()
