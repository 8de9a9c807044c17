"""Sampling: ``GenerateConfig`` and ``generate`` (what ``pipelines.generate`` runs on each rank), checks before
anything loads, and batches of prompts with one loaded model."""

from dit_sp.inference.run import (
    GenerateConfig,
    batch_layout,
    check_before_loading,
    generate,
    generate_batch,
    guidance_arguments,
    read_batch,
)

__all__ = ["GenerateConfig", "batch_layout", "check_before_loading", "generate", "generate_batch",
           "guidance_arguments", "read_batch"]  # fmt: skip
