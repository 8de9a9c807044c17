"""Comparisons that say what differed: the worst tensors by name, their error and the reference's scale."""

from __future__ import annotations

import torch


def max_errors(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max abs difference per name; the two must hold the same names."""
    missing, extra = sorted(expected.keys() - actual.keys()), sorted(actual.keys() - expected.keys())
    assert not missing and not extra, f"tensors missing: {missing[:5]}, unexpected: {extra[:5]}"
    return {name: (actual[name].double() - expected[name].double()).abs().max().item() for name in expected}


def describe(errors: dict[str, float], tol: float, scale: float | None = None, top: int = 3) -> str:
    """``"3 of 40 above 1e-05 (reference scale 0.8): blocks.0.attn1.to_q.weight 2.1e-04, ..."``."""
    bad = sorted(((err, name) for name, err in errors.items() if not err <= tol), reverse=True)
    scale_text = f" (reference scale {scale:.3g})" if scale is not None else ""
    worst = ", ".join(f"{name} {err:.2e}" for err, name in bad[:top])
    return f"{len(bad)} of {len(errors)} above {tol:.0e}{scale_text}: {worst}"


def assert_all_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tol: float, what: str) -> None:
    errors = max_errors(actual, expected)
    scale = max((t.abs().max().item() for t in expected.values()), default=0.0)
    assert all(err <= tol for err in errors.values()), f"{what}: {describe(errors, tol, scale)}"
