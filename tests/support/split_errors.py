"""The assertion every transformer-split test makes of ``check_transformer``-style error reports: real outputs,
outputs and gradients within the tolerance of one process, and ``unparallelize`` restoring the original."""

from __future__ import annotations

ERRORS = ("out", "input_grads", "param_grads")


def assert_matches_one_process(errors: dict, tol: float, label: str) -> None:
    """``errors``: one layout's report (``ref_scale``, ``out``, ``input_grads``, ``param_grads``, optional
    ``<key>_worst``, ``restored_bit_identical``); ``label`` names the model and layout in a failure."""
    assert errors["ref_scale"] > 0.1, f"{label}: the check compared near-zero outputs"
    for key in ERRORS:
        where = f" (worst: {errors[key + '_worst']})" if key + "_worst" in errors else ""
        assert errors[key] <= tol, f"{label}: {key} error {errors[key]:.2e} above {tol:.0e}{where}"
    assert errors["restored_bit_identical"] == 1.0, f"{label}: unparallelize must restore the original behaviour"
