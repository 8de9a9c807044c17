"""``vlm_score``: a chat vision-language model's expected rating of the video, from a local checkpoint."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from dit_sp.errors import ConfigError, MissingFileError

Tensor = torch.Tensor


class VLMScore:
    """A vision-language model asked to rate each video (VideoAlign / UnifiedReward style): a local chat VLM
    checkpoint (e.g. Qwen2-VL / Qwen2.5-VL Instruct, with its tokenizer and image processor) sees ``frames``
    frames spread over the video and ``question`` (``{prompt}`` filled in); the reward is the expected rating
    under its next-token distribution over the ``scale`` tokens (``"1"`` ... ``"5"``), so it is smooth where
    a sampled answer would be a step function. Nothing is downloaded.
    """

    def __init__(self, path: str, frames: int = 4, scale: tuple[str, ...] = ("1", "2", "3", "4", "5"),
                 question: str = ("How well does this video show '{prompt}'? Rate it from 1 (not at all) to 5 "
                                  "(perfectly). Answer with one digit."), device: str | None = None):  # fmt: skip
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        if not Path(path, "config.json").is_file():
            raise MissingFileError(f"vlm_score: {path} holds no model (config.json missing)")
        self.model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.images = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        if device:
            self.model.to(device)
        self.frames, self.question = frames, question
        ids = [self.tokenizer.convert_tokens_to_ids(token) for token in scale]
        if any(i is None or i == self.tokenizer.unk_token_id for i in ids):
            raise ConfigError(f"vlm_score: the tokenizer of {path} has no single token for each of {list(scale)}")
        self.scale_ids = torch.tensor(ids)
        self.values = torch.arange(1, len(scale) + 1, dtype=torch.float32)
        config = self.model.config
        self.image_token = self.tokenizer.convert_ids_to_tokens(config.image_token_id)
        self.merge = getattr(self.images, "merge_size", 1) ** 2
        self.takes_token_types = "mm_token_type_ids" in inspect.signature(self.model.forward).parameters

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        return torch.stack([self._rate(video, prompt) for video, prompt in zip(videos, prompts)])

    def _rate(self, video: Tensor, prompt: str) -> Tensor:
        """``video`` ``(F, C, H, W)`` in [0, 1]: the expected rating."""
        from PIL import Image

        device = next(self.model.parameters()).device
        index = torch.linspace(0, video.shape[0] - 1, min(self.frames, video.shape[0])).round().long()
        frames = [Image.fromarray((f.permute(1, 2, 0).clamp(0, 1) * 255).round().byte().numpy()) for f in video[index]]
        content = [{"type": "image"} for _ in frames] + [{"type": "text", "text": self.question.format(prompt=prompt)}]
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                  tokenize=False)  # fmt: skip
        vision = self.images(images=frames, return_tensors="pt")
        counts = (vision["image_grid_thw"].prod(-1) // self.merge).tolist()  # the tokens each image becomes
        pieces = text.split(self.image_token)
        if len(pieces) != len(frames) + 1:
            raise ConfigError(f"vlm_score: the chat template placed {len(pieces) - 1} image tokens for {len(frames)} "
                              "frames; use the model's own chat template")  # fmt: skip
        text = pieces[0] + "".join(self.image_token * n + piece for n, piece in zip(counts, pieces[1:]))
        tokens = self.tokenizer([text], return_tensors="pt").to(device)
        inputs = dict(tokens, pixel_values=vision["pixel_values"].to(device),
                      image_grid_thw=vision["image_grid_thw"].to(device))  # fmt: skip
        if self.takes_token_types:  # which positions are image tokens (Qwen2-VL's M-RoPE), as its processor gives
            inputs["mm_token_type_ids"] = (tokens["input_ids"] == self.model.config.image_token_id).long()
        out = self.model(**inputs)
        probs = out.logits[0, -1, self.scale_ids.to(device)].float().softmax(-1).cpu()
        return (probs * self.values).sum()
