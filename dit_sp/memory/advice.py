"""What to change when a plan does not fit: advice for the component that makes the peak, in the phase where
it happens, each option with the peak it would give (the plan made again with the change).

Advice that does not touch the peak misleads: Wan 2.1 1.3B in fp32 on one 20 GiB GPU peaks at set-up on the
fp32 UMT5-XXL text encoder (21 GiB), and neither micro-batches nor activation checkpointing change that number.
So the text encoder gets text-encoder options (prompt embeddings computed beforehand; bf16, which mixed
precision gives it; more GPUs, over which it shards), activations get micro-batches, checkpointing and sequence
parallelism, and weights and optimizer state get LoRA and more GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

GiB = 2**30


def with_setting(config: Any, key: str, value: Any) -> Any:
    """``config`` (a frozen dataclass tree) with the dotted ``key`` set to ``value`` (checked again on
    construction, as a loaded config is)."""
    head, _, rest = key.partition(".")
    if rest:
        return dataclasses.replace(config, **{head: with_setting(getattr(config, head), rest, value)})
    return dataclasses.replace(config, **{head: value})


def _outcome(plan: Any) -> str:
    verdict = "fits" if plan.fits else "still does not fit"
    notes = "".join(f" ({note})" for note in plan.notes)  # the heads its layout pads, and what that costs
    return f"peak {plan.peak / GiB:.1f} GiB at {plan.peak_phase}: {verdict}{notes}"


def _tried(text: str, replan: Callable[[], Any]) -> tuple[str, Any] | None:
    """``(text, the plan with the change)``, or None where the change is not a valid config."""
    try:
        return text, replan()
    except (ValueError, TypeError):  # ConfigError is a ValueError: a change this config cannot take
        return None


def _text_encoder(plan: Any, config: Any, gpus: int, replan: Callable[..., Any]) -> list:
    options = [
        _tried("every prompt's embedding computed beforehand: the trainer already encodes each prompt once and "
               "frees the encoder, but loads it to do so; with every embedding already in `embedding_cache: DIR` "
               "(an earlier run's, same model, prompts and text settings) it never loads (plan: --embeddings-cached)",
               lambda: replan(config, embeddings_cached=True)),
    ]  # fmt: skip
    if config.mixed_precision is None:
        half = "mixed_precision: bfloat16 (the text encoders load in the compute dtype: half the bytes)"
        options.append(_tried(half, lambda: replan(with_setting(config, "mixed_precision", "bfloat16"))))
    options.append(_tried(f"{2 * gpus} GPUs (the text encoders shard over every GPU of the run)",
                          lambda: replan(config, gpus=2 * gpus)))  # fmt: skip
    options.append("(grpo.micro_batch, activation_checkpointing or more ring/ulysses do not change the set-up peak)")
    return options


def _activations(plan: Any, config: Any, gpus: int, replan: Callable[..., Any], fixed_layout: bool) -> list:
    options = []
    samples = config.grpo.prompts_per_step * config.grpo.group_size
    micro = config.grpo.micro_batch or max(samples // plan.layout["dp"], 1)
    if micro > 1:
        options.append(_tried(f"grpo.micro_batch: 1 (now {micro} samples per forward)",
                              lambda: replan(with_setting(config, "grpo.micro_batch", 1))))  # fmt: skip
    if not config.activation_checkpointing:
        options.append(_tried("activation_checkpointing: true",
                              lambda: replan(with_setting(config, "activation_checkpointing", True))))  # fmt: skip
    if config.mixed_precision is None:
        options.append(_tried("mixed_precision: bfloat16 (GPUs)",
                              lambda: replan(with_setting(config, "mixed_precision", "bfloat16"))))  # fmt: skip
    if fixed_layout:
        options.append(_tried("more sequence parallelism (drop --ring/--ulysses: the planner picks the degree)",
                              lambda: replan(config, ring=None, ulysses=None)))  # fmt: skip
    options.append(_tried(f"{2 * gpus} GPUs (fewer samples or tokens per GPU)",
                          lambda: replan(config, gpus=2 * gpus)))  # fmt: skip
    return options


def _state(config: Any, gpus: int, replan: Callable[..., Any]) -> list:
    options = []
    if not config.lora.rank:
        options.append(_tried("LoRA (lora.rank: 32): a few trained weights, no full gradients, AdamW state or KL "
                              "reference", lambda: replan(with_setting(config, "lora.rank", 32))))  # fmt: skip
    if config.hsdp:
        options.append(_tried("hsdp: false (shard over every GPU, not a sample's)",
                              lambda: replan(with_setting(config, "hsdp", False))))  # fmt: skip
    options.append(_tried(f"{2 * gpus} GPUs (the weights and optimizer state shard over them)",
                          lambda: replan(config, gpus=2 * gpus)))  # fmt: skip
    return options


def advise_plan(plan: Any, config: Any, text_encoder: str, gpus: int, replan: Callable[..., Any],
                fixed_layout: bool) -> list[str]:  # fmt: skip
    """Options that lower ``plan``'s peak (a ``Plan`` that does not fit), for its phase and component.

    ``text_encoder``: how the set-up component name of the text encoders starts; ``replan(config, **changes)``: the
    plan again for a changed config (or ``gpus=``, ``ring=``, ``ulysses=``, ``embeddings_cached=``)."""
    component = plan.peak_component
    if plan.peak_phase == "set-up":
        if component.startswith(text_encoder):
            options = _text_encoder(plan, config, gpus, replan)
        else:
            options = [f"{component}: nothing in the config lowers it; GPUs with more memory"]
    elif component.startswith(("activations", "all-to-all")):  # one block's working set, Ulysses' buffers
        options = _activations(plan, config, gpus, replan, fixed_layout)
    elif component.startswith("gathered block") and config.mixed_precision is None:
        options = [_tried("mixed_precision: bfloat16 (GPUs)",
                          lambda: replan(with_setting(config, "mixed_precision", "bfloat16")))]  # fmt: skip
    else:  # the weights, their gradients, AdamW state, the KL reference (or the decoding ranks' VAE)
        options = _state(config, gpus, replan)
    lines = []
    for option in options:
        if isinstance(option, str):
            lines.append(option)
        elif option is not None and option[1].peak < plan.peak:  # only what lowers the peak
            lines.append(f"{option[0]}: {_outcome(option[1])}")
    return lines
