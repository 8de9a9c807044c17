"""Tokenizers of the built-in tiny models, built in code (nothing to download)."""

from __future__ import annotations

import functools
from typing import Any

# Llama 3's pre-tokenizer (words with their leading space, up to 3 digits, punctuation runs, newlines).
_LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)


def llama3_byte_tokenizer(config: dict[str, Any], image_to_video: bool = False) -> Any:
    """A Llama 3 style byte-level BPE tokenizer, built here (nothing to download): every byte, and as one
    token each word of HunyuanVideo's stock prompt template (as in Llama 3's vocabulary), so the stock
    template's ``crop_start`` (95 tokens before the prompt; image-to-video: 103, with ``<image>``) is exact
    for it too."""
    import re

    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    if image_to_video:
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import DEFAULT_PROMPT_TEMPLATE
    else:
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    template = DEFAULT_PROMPT_TEMPLATE["template"]
    bos, eos = config["bos_token"], config["eos_token"]
    specials = list(dict.fromkeys([bos, eos, *re.findall(r"<\|[a-z_]+\|>|<image>", template)]))
    split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    parts = re.split("|".join(map(re.escape, specials)), template)
    words = [word for part in parts for word, _ in pre.pre_tokenize_str(part)]
    tokens = dict.fromkeys([*sorted(pre_tokenizers.ByteLevel.alphabet()), *words])
    tokenizer = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], ignore_merges=True))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre, decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **config)


def clip_byte_vocab() -> dict[str, Any]:
    """``CLIPTokenizer`` arguments for byte-level BPE without merges: every byte a token (also as the
    end of a word)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = ["<|startoftext|>", "<|endoftext|>", *alphabet, *(c + "</w>" for c in alphabet)]
    return {"vocab": {t: i for i, t in enumerate(tokens)}, "merges": []}


# Qwen2-VL's chat template for text messages (its images and videos left out: the pipelines send text only).
_QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Qwen-VL's vision markers, ids 259-262 of ``qwen_byte_tokenizer(vision=True)`` (a tiny Qwen3-VL config names them)."""


def qwen_byte_tokenizer(config: dict[str, Any], vision: bool = False) -> Any:
    """A Qwen2 style byte-level tokenizer with Qwen2-VL's chat template (text messages), built here (nothing to
    download): every byte a token (ids 0-255), then ``<|endoftext|>`` (the padding), ``<|im_start|>`` and
    ``<|im_end|>``; so its ids fit a tiny text encoder's vocabulary of 259 or more. ``vision``: then Qwen-VL's
    vision markers (``QWEN_VISION_TOKENS``, ids 259-262), as a Qwen3-VL processor looks them up."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(BPE(vocab={t: i for i, t in enumerate(alphabet)}, merges=[], ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *(QWEN_VISION_TOKENS * vision)])
    settings = {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>", "chat_template": _QWEN_CHAT_TEMPLATE} | config
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **settings)


def qwen3_vl_processor(config: dict[str, Any]) -> Any:
    """A ``Qwen3VLProcessor`` over ``qwen_byte_tokenizer(config, vision=True)`` and Qwen2-VL's PIL image processor
    (its defaults), built here: nothing to download. It has no video processor (``without_video``): transformers'
    video processors need torchvision, which dit-sp does not install; MiniMax-H3 uses one only for video references
    (``ref2va``)."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    settings = dict(config)  # an image_processor table: the image processor's settings (a tiny vision tower's patches)
    image_processor = Qwen2VLImageProcessorPil(**settings.pop("image_processor", {}))
    tokenizer = qwen_byte_tokenizer(settings, vision=True)
    return without_video(Qwen3VLProcessor)(image_processor=image_processor, tokenizer=tokenizer)


@functools.cache
def without_video(cls: type) -> type:
    """The transformers processor class ``cls`` (a Qwen-VL processor) without its video processor: its image
    processor and tokenizer only (``video_processor`` is None), so that it is built, saved and loaded
    (``from_pretrained`` of a processor directory, whose video processor's files it leaves alone) without torchvision,
    which transformers' video processors need and dit-sp does not install. Text and image inputs only."""

    parts = [name for name in cls.get_attributes() if name != "video_processor"]  # read off cls's __init__

    class TextImageProcessor(cls):
        @classmethod
        def get_attributes(cls) -> list[str]:
            return list(parts)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("video_processor", None)
            super().__init__(*args, **kwargs)
            self.video_processor = None

    TextImageProcessor.__name__ = TextImageProcessor.__qualname__ = f"TextImage{cls.__name__}"
    return TextImageProcessor


def qwen2_5_vl_processor(config: dict[str, Any]) -> Any:
    """A Qwen2.5-VL processor for images (Kandinsky 5 I2I), built here (nothing to download):
    ``qwen_byte_tokenizer(vision=True)`` and a PIL image processor whose patches fit a tiny vision tower
    (``config``: its ``patch_size``, ``merge_size``, ``temporal_patch_size``, ``min_pixels``, ``max_pixels``). Images
    only: transformers' video processor needs torchvision, which this toolkit does not install."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil

    class ImageQwenVLProcessor(Qwen2_5_VLProcessor):
        @classmethod
        def get_attributes(cls) -> list[str]:
            return ["image_processor", "tokenizer"]  # no video processor

    tokenizer = qwen_byte_tokenizer({}, vision=True)
    return ImageQwenVLProcessor(image_processor=Qwen2VLImageProcessorPil(**config), tokenizer=tokenizer)
