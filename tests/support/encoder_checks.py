"""Worker of the sharded text encoder tests (module level, so that ``spawn`` can pickle it)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from dit_sp.weights.encoder import load_sharded_text_encoder, shard_text_encoder

ENCODERS = {  # a smaller width stands in for the real ones: every matrix is large enough to be sharded
    "umt5": ("UMT5EncoderModel", "UMT5Config", {"vocab_size": 1001, "d_model": 64, "d_kv": 16, "d_ff": 128,
                                                "num_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8}),
    "llama": ("LlamaModel", "LlamaConfig", {"vocab_size": 999, "hidden_size": 64, "intermediate_size": 128,
                                            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                                            "max_position_embeddings": 64}),
    "clip": ("CLIPTextModel", "CLIPTextConfig", {"vocab_size": 1003, "hidden_size": 64, "intermediate_size": 128,
                                                 "num_hidden_layers": 2, "num_attention_heads": 4,
                                                 "max_position_embeddings": 16, "bos_token_id": 0, "eos_token_id": 1,
                                                 "pad_token_id": 1}),
}  # fmt: skip


def build(name: str) -> torch.nn.Module:
    import transformers

    model_class, config_class, config = ENCODERS[name]
    torch.manual_seed(0)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()


def token_ids(name: str) -> torch.Tensor:
    """Two prompts of 12 tokens spread over the whole vocabulary (every rank's rows), the last id included."""
    vocab = ENCODERS[name][2]["vocab_size"]
    ids = torch.linspace(0, vocab - 1, 24).round().long().view(2, 12)
    return ids[:, torch.randperm(12, generator=torch.Generator().manual_seed(1))]


def outputs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state.float()


def sharded_encoders(directories: dict[str, str]) -> dict:
    """Each encoder loaded sharded over the world (fp32 and bf16) and one sharded in place: outputs, the bytes
    this rank holds, and whether a second call still matches (the weights are released between calls)."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    group, result = dist.group.WORLD, {}
    for name, directory in directories.items():
        encoder = load_sharded_text_encoder(directory, group, "cpu", torch.float32)
        first, second = outputs(encoder, token_ids(name)), outputs(encoder, token_ids(name))
        half = load_sharded_text_encoder(directory, group, "cpu", torch.bfloat16)
        in_place = build(name)
        sharded = shard_text_encoder(in_place, group, "cpu")
        result[name] = {"fp32": first, "again": torch.equal(first, second), "bf16": outputs(half, token_ids(name)),
                        "bytes": encoder.sharded.local_bytes(encoder), "in_place": outputs(in_place, token_ids(name)),
                        "in_place_bytes": sharded.local_bytes(in_place)}  # fmt: skip
        try:
            encoder(input_ids=torch.tensor([[ENCODERS[name][2]["vocab_size"]]]))
        except IndexError as e:
            result[name]["bad_id"] = str(e)
    return result


def trainer_embeddings(config) -> dict:
    """A GRPO trainer's set-up from a checkpoint: the dtype of the prompt embeddings its sharded text encoders
    wrote, and whether the encoders are still held."""
    from dit_sp import GRPOTrainer

    trainer = GRPOTrainer(config)
    entry = torch.load(sorted(trainer.embeddings.directory.glob("*.pt"))[0], weights_only=True)
    return {"dtype": str(entry["cond"][0].dtype), "text_encoder": trainer.pipe.text_encoder is not None}
