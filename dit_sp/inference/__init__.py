"""Sampling: ``GenerateConfig`` and ``generate`` (what ``pipelines.generate`` runs on each rank), checks before
anything loads, and batches of prompts with one loaded model.

    from dit_sp import GenerateConfig, generate, spawn

    report = generate(GenerateConfig.load(overrides={"model": "tiny-wan", "steps": 2}))  # this process
    reports = spawn(generate, 2, args=(GenerateConfig.load(overrides={"ulysses": 2}),))  # two local workers

Modules: ``config`` (``GenerateConfig``), ``checks`` (before loading; image inputs; guidance arguments),
``run`` (setup, sampling, ``generate``), ``batch`` (prompt files, the manifest, ``generate_batch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._lazy import lazy_exports

if TYPE_CHECKING:
    from dit_sp.inference.batch import PER_PROMPT, batch_layout, generate_batch, read_batch
    from dit_sp.inference.checks import check_before_loading, check_image_inputs, guidance_arguments
    from dit_sp.inference.config import GenerateConfig
    from dit_sp.inference.run import generate
    from dit_sp.inference.session import cache_report

_WHERE = {
    "GenerateConfig": "dit_sp.inference.config",
    "PER_PROMPT": "dit_sp.inference.batch",
    "batch_layout": "dit_sp.inference.batch",
    "cache_report": "dit_sp.inference.session",
    "check_before_loading": "dit_sp.inference.checks",
    "check_image_inputs": "dit_sp.inference.checks",
    "generate": "dit_sp.inference.run",
    "generate_batch": "dit_sp.inference.batch",
    "guidance_arguments": "dit_sp.inference.checks",
    "read_batch": "dit_sp.inference.batch",
}
"""Each name and its module, imported on first use (PEP 562): importing the package alone imports no torch."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


__all__ = ["PER_PROMPT", "GenerateConfig", "batch_layout", "cache_report", "check_before_loading",
           "check_image_inputs", "generate", "generate_batch", "guidance_arguments", "read_batch"]  # fmt: skip
