"""User rewards named as ``module:function`` in the tests."""

import torch


def red(videos, prompts):
    return videos[:, :, 0].flatten(1).mean(1)


def fails_on_blue(videos, prompts):
    if any("blue" in p for p in prompts):
        raise RuntimeError("cannot score blue")
    return videos.flatten(1).mean(1)


def nan_reward(videos, prompts):
    return torch.full((videos.shape[0],), float("nan"))


def slow_brightness(videos, prompts):
    """Brightness after a pause: a reward server that is slow."""
    import time

    time.sleep(3)
    return videos.flatten(1).mean(1)


def tiny_clip(path) -> None:
    """A random tiny ``CLIPModel`` and a word-level tokenizer, saved to ``path`` (as a real checkpoint)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPConfig, CLIPModel, PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "a", "red", "blue", "circle", "square", "green", "triangle"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>").save_pretrained(path)
    config = CLIPConfig(
        text_config={"vocab_size": 16, "eos_token_id": 2, "bos_token_id": 0, "pad_token_id": 0,
                     "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 16},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 8},
        projection_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(path)
