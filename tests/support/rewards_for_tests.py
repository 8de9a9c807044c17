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


def tiny_qwen2_vl(path) -> None:
    """A random tiny Qwen2-VL chat model with a word-level tokenizer, its chat template and image processor,
    saved to ``path`` as a real checkpoint directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
               "<|video_pad|>"]  # fmt: skip
    words = [*special, "<unk>", "1", "2", "3", "4", "5", "user", "assistant", "how", "well", "does", "this", "video",
             "show", "a", "red", "blue", "circle", "square", "rate", "it"]  # fmt: skip
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<|endoftext|>",
                                        eos_token="<|im_end|>", additional_special_tokens=special[1:])  # fmt: skip
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {% for c in m['content'] %}{% if c['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|> {% else %}{{ c['text'] }} {% endif %}{% endfor %}<|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessor(min_pixels=16 * 16, max_pixels=64 * 64, patch_size=8, merge_size=2,
                          temporal_patch_size=2).save_pretrained(path)  # fmt: skip
    config = Qwen2VLConfig(
        text_config={"vocab_size": len(words), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 16, "hidden_size": 32, "num_heads": 2, "patch_size": 8,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3, "mlp_ratio": 2},
        image_token_id=words.index("<|image_pad|>"), video_token_id=words.index("<|video_pad|>"),
        vision_start_token_id=words.index("<|vision_start|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(config).save_pretrained(path)


def as_open_clip(state: dict) -> dict:
    """A transformers ``CLIPModel`` state dict in open_clip's layout (fused attention, (D, P) projections):
    what an HPS checkpoint holds."""
    out = {"logit_scale": state["logit_scale"], "attn_mask": torch.zeros(1)}
    towers = {"text_model": "", "vision_model": "visual."}
    for key, value in state.items():
        if key.endswith("position_ids") or key == "logit_scale":
            continue
        if key in ("text_projection.weight", "visual_projection.weight"):
            out["text_projection" if key.startswith("text") else "visual.proj"] = value.t()
            continue
        tower, rest = key.split(".", 1)
        head = towers[tower]
        rest = (rest.replace("embeddings.token_embedding", "token_embedding")
                .replace("embeddings.position_embedding.weight", "positional_embedding")
                .replace("embeddings.class_embedding", "class_embedding")
                .replace("embeddings.patch_embedding", "conv1").replace("pre_layrnorm", "ln_pre")
                .replace("post_layernorm", "ln_post").replace("final_layer_norm", "ln_final")
                .replace("encoder.layers", "transformer.resblocks").replace("layer_norm1", "ln_1")
                .replace("layer_norm2", "ln_2").replace("mlp.fc1", "mlp.c_fc").replace("mlp.fc2", "mlp.c_proj")
                .replace("self_attn.out_proj", "attn.out_proj"))  # fmt: skip
        if ".self_attn.q_proj." in rest:
            kind = rest.rsplit(".", 1)[1]
            base = rest.split(".self_attn.")[0]
            parts = [state[key.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            out[f"{head}{base}.attn.in_proj_{kind}"] = torch.cat(parts)
        elif ".self_attn." not in rest:
            out[f"{head}{rest}"] = value
    return out
