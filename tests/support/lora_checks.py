"""LoRA files (``dit_sp.train.lora_io``): random diffusers LoRAs of the tiny Wan, a LoRA run started from one
(in a spawned worker: the trainer builds a process group), and the stock pipeline's frames with LoRAs loaded."""

from __future__ import annotations

from pathlib import Path

import torch

TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
SAMPLE = {"prompt": "a red circle moving left", "num_frames": 5, "height": 32, "width": 48, "num_inference_steps": 2,
          "guidance_scale": 1.0, "max_sequence_length": 16}  # fmt: skip


def random_lora(directory: Path, rank: int = 4, alpha: float | None = None, targets=TARGETS, seed: int = 0,
                std: float = 0.05) -> Path:  # fmt: skip
    """A random LoRA of the tiny Wan's transformer (A and B both random), as ``save_lora_weights`` writes one."""
    from diffusers import WanPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from dit_sp.zoo import build_tiny

    transformer = build_tiny("tiny-wan", "transformer")
    config = LoraConfig(r=rank, lora_alpha=alpha or rank, target_modules=list(targets), init_lora_weights=False)
    transformer.add_adapter(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
    metadata = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    WanPipeline.save_lora_weights(directory, transformer_lora_layers=get_peft_model_state_dict(transformer),
                                  transformer_lora_adapter_metadata=metadata)  # fmt: skip
    return directory


def lora_file_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """A diffusers LoRA file's tensors by the trainer's parameter names (``...lora_A.default.weight``)."""
    from safetensors.torch import load_file

    state = load_file(Path(directory) / "pytorch_lora_weights.safetensors")
    return {k.removeprefix("transformer.").replace(".weight", ".default.weight"): v for k, v in state.items()}


def start_step_export(config, out: str) -> dict:
    """A LoRA run started from ``config.lora.init_from``: its adapters before the first step, then one step and
    the export to ``out``; returns the adapters before and after (full tensors)."""
    from dit_sp import GRPOTrainer

    trainer = GRPOTrainer(config)

    def adapters() -> dict[str, torch.Tensor]:
        return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for name, p in trainer.transformer.named_parameters() if "lora_" in name}  # fmt: skip

    before = adapters()
    trainer.step()
    after = adapters()
    trainer.export(out)
    return {"before": before, "after": after}


def frames(pipe, **overrides) -> torch.Tensor:
    """The pipeline's frames ``(F, H, W, 3)`` for ``SAMPLE`` (seed 0), as a float tensor."""
    result = pipe(**(SAMPLE | overrides), generator=torch.Generator("cpu").manual_seed(0), output_type="np")
    return torch.from_numpy(result.frames[0])
