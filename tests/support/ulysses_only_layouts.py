"""Worker side of the Ulysses-only families on 4-process layouts: Wan-Animate-2, AnyFlow FAR, Kandinsky 6 SR,
Kandinsky 5 in NABLA mode and Sana-WM, each run by its own checks (``animate2_checks``, ``anyflow_far_checks``,
``kandinsky6_sr_checks``, ``kandinsky5_nabla_checks``, ``sana_wm_checks``) on dp 2 x Ulysses 2 (each dp replica on
its own inputs, ``dp_seed``) and on Ulysses 4, against one process."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

LAYOUTS = [(2, 1, 2), (1, 1, 4)]
"""(dp, ring, ulysses)."""

SANA_WM_CASES = {
    "tiny": {"frames": 5},  # tiny-sana-wm's 3 heads: Ulysses 4 would leave the last rank none (refused)
    "7heads": {"frames": 10, "config": {"hidden_size": 112, "linear_head_dim": 16, "num_attention_heads": 7}},
}
"""Sana-WM's cases: the built-in tiny model, and one of 7 heads (2 a rank over Ulysses 4, the last rank's second a
padding head) over 10 latent frames (3 a rank over 4 ranks, the short convolution's reach; the last rank's 1 real)."""


def check_all() -> dict[str, Any]:
    """Every family's results per layout (``"dp2-r1-u2"``, ``"dp1-r1-u4"``; Sana-WM's per case too, as
    ``"<case>/<layout>"``) and the seconds (wall and CPU) each family took."""
    from animate2_checks import check_animate2
    from anyflow_far_checks import check_far
    from kandinsky5_nabla_checks import check_nabla_transformer
    from kandinsky6_sr_checks import check_sr_transformer
    from sana_wm_checks import check_sana_wm, fp32_softmax
    from torch.nn.attention import flex_attention

    def sana_wm() -> dict[str, Any]:
        with fp32_softmax():
            return check_sana_wm(LAYOUTS, SANA_WM_CASES, refusals=False)

    checks = {
        "wan_animate_2": lambda: check_animate2(LAYOUTS),
        "anyflow_far": lambda: check_far(LAYOUTS),
        "kandinsky6_sr": lambda: {
            "dp{}-r{}-u{}".format(*layout): check_sr_transformer(layout, extras=False) for layout in LAYOUTS
        },
        "kandinsky5_nabla": lambda: {
            "dp{}-r{}-u{}".format(*layout): check_nabla_transformer(layout, extras=False) for layout in LAYOUTS
        },
        "sana_wm": sana_wm,
    }
    results: dict[str, Any] = {"seconds": {}, "cpu_seconds": {}}
    # flex attention (forward only here) run as its eager implementation, without tracing it with dynamo for every
    # new shape (seconds each; the same ops, the same results)
    with mock.patch.object(flex_attention, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True):
        for name, check in checks.items():
            start, cpu = time.perf_counter(), time.process_time()
            results[name] = check()
            results["seconds"][name] = round(time.perf_counter() - start, 2)
            results["cpu_seconds"][name] = round(time.process_time() - cpu, 2)
    return results
