"""Worker side of group B's pipeline checks: ``generate`` each job, recording how many video tokens the
sequence-parallel attention modules got (so a test sees that the sequence really was split)."""

from __future__ import annotations

import torch

from dit_sp import GenerateConfig, generate


def generate_recording(jobs: list[GenerateConfig]) -> list[dict]:
    """``generate`` per job; each report gains ``attention_lengths``: the sorted distinct ``hidden_states``
    lengths of the modules whose processor dit-sp made sequence-parallel."""
    reports = []
    for settings in jobs:
        seen: set[int] = set()

        def record(module, args, kwargs, output, seen=seen):
            if type(getattr(module, "processor", None)).__name__.startswith("SequenceParallel"):
                seen.add((args[0] if args else kwargs["hidden_states"]).shape[1])

        handle = torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)
        try:
            report = generate(settings, True)
        finally:
            handle.remove()
        reports.append(report | {"attention_lengths": sorted(seen)})
    return reports
