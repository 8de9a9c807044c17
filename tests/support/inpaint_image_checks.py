"""Worker side of tests/pipelines/test_generate_inpaint_image_transfer.py: its ``generate`` jobs and its transformer
checks in one spawn."""

from __future__ import annotations

from typing import Any

from dit_sp import GenerateConfig, spawn


def _generate_and_check(jobs: list[GenerateConfig], names: list[str], layouts: list[tuple[int, int, int]]) -> dict:
    from kandinsky_cosmos_checks import check_families
    from variant_generate_checks import generate_recording

    return {"videos": generate_recording(jobs), "transformers": check_families(names, layouts)}


def reports_and_checks(jobs: list[tuple[Any, GenerateConfig]], names: list[str],
                       layouts: list[tuple[int, int, int]]) -> tuple[dict[Any, dict], dict]:  # fmt: skip
    """On 2 workers (one spawn): each ``(key, settings)`` job's report from the rank that wrote the output, with
    every rank's attention lengths under ``"lengths"`` (as ``variant_generate_checks.layout_reports``), and rank 0's
    ``kandinsky_cosmos_checks.check_families(names, layouts)``."""
    by_rank = spawn(_generate_and_check, 2, args=([settings for _, settings in jobs], names, layouts), timeout=300)
    reports = {}
    for i, (key, _) in enumerate(jobs):
        leaders = [rank["videos"][i] for rank in by_rank if "out" in rank["videos"][i]]
        assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
        reports[key] = leaders[0] | {"lengths": [rank["videos"][i]["attention_lengths"] for rank in by_rank]}
    return reports, by_rank[0]["transformers"]
