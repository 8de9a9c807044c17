"""The Ulysses-only families (attention that is not softmax over the sequence, run whole on each rank's head group
by ``attend_whole_sequence``) on the 4-process layouts, in one 4-process spawn: Wan-Animate-2, AnyFlow FAR, Kandinsky
6 SR, Kandinsky 5 in NABLA mode and Sana-WM on dp 2 x Ulysses 2 (each dp replica on its own inputs, against one
process on them) and on Ulysses 4 (3 heads padded to 4: the last rank's head group is padding only; Sana-WM, which
refuses that, with 7 heads), their outputs and every gradient within 1e-5 of one process, through each family's own
checks; the sequence split: each rank's attention saw ``ceil(S / sp)`` tokens (uneven: 6 and 9 tokens of
Wan-Animate-2's two calls, AnyFlow FAR's 37, 11 and 9; Kandinsky 6 SR's 6 NABLA blocks of 64 and Kandinsky 5's 4
always split evenly, one whole block a rank at least; Sana-WM's whole frames, ``ceil(F / sp)`` a rank).
Flex attention has no backward on CPU: gradients through it are taken with each family's dense stand-in (the same
mask), in both runs; Sana-WM's softmax branches are kept fp32 (``sana_wm_checks.fp32_softmax``)."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

TOL = 1e-5
LAYOUTS = {"dp2-r1-u2": 2, "dp1-r1-u4": 4}
"""Each layout's Ulysses degree (its sequence-parallel degree)."""
RANKS = range(4)
# What the checks run (here, not imported: the check modules import diffusers' models, seconds in this process):
ANIMATE2_TOKENS, ANIMATE2_SEED = (6, 9), 11  # animate2_checks: REF_TOKENS, GEN_TOKENS; SEED
FAR_TOKENS = {"train": 37, "prefill": 11, "denoise": 9}  # anyflow_far_checks.TOKENS; seeds offset by dp_seed(0)
K6SR_TOKENS, K6SR_SEED = 384, 7  # kandinsky6_sr_checks.TOKENS; sr_inputs' seed
K5_TOKENS, K5_SEED, K5_DIM = 256, 7, 48  # kandinsky5_nabla_checks.TOKENS; nabla_inputs' seed; CONFIG's model_dim
SANA_WM_BRANCHES = ("SanaWMBidirectionalGDNAttention", "SanaWMBidirectionalGDNCamAttention", "SanaWMSoftmaxAttention",
                    "SanaWMSoftmaxCamAttention")  # fmt: skip
SANA_WM_TOKENS_PER_FRAME, SANA_WM_SEED = 6, 7  # latents of 2 x 3; sana_wm_inputs' seed


def ceil(tokens: int, sp: int) -> int:
    return -(-tokens // sp)


def group(heads: int, sp: int) -> int:
    """The heads a rank holds (its real ones and padding), the heads padded to a multiple of ``sp``."""
    return ceil(heads, sp)


@pytest.fixture(scope="module")
def results():
    from ulysses_only_layouts import check_all

    return spawn(check_all, 4, timeout=300)


def assert_seeds(seeds: list[int], layout: str, base: int) -> None:
    """dp 2: the two replicas ran their own inputs (seeds ``base`` and ``base + 1``, two ranks each); dp 1: one."""
    expected = [base, base, base + 1, base + 1] if layout.startswith("dp2") else [base] * 4
    assert sorted(seeds) == expected, f"{layout}: the ranks' input seeds {seeds}, not {expected}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_wan_animate_2(results, layout):
    """The extract call filling the key/value cache and the cached call over it (the flex block mask, dense)."""
    sp = LAYOUTS[layout]
    ref_tokens, gen_tokens = ANIMATE2_TOKENS
    for rank in RANKS:
        errors = results[rank]["wan_animate_2"][layout]
        assert_matches_one_process(errors, TOL, f"Wan-Animate-2 {layout} rank {rank}")
        assert errors["grads_compared"] > 100, errors["grads_compared"]  # every parameter and input of both calls
        assert errors["lengths"] == [ceil(ref_tokens, sp), ceil(gen_tokens, sp)], errors["lengths"]
        assert errors["cache"] == (2, ref_tokens, group(3, sp), 12), errors["cache"]  # this rank's head group
    assert_seeds([results[rank]["wan_animate_2"][layout]["seed"] for rank in RANKS], layout, ANIMATE2_SEED)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_anyflow_far(results, layout):
    """Training (block mask, clean context frames) and denoising over the prefilled cache; the prefill (flex
    attention) writing this rank's head group of the cache."""
    sp = LAYOUTS[layout]
    for rank in RANKS:
        far = results[rank]["anyflow_far"]
        assert far["dense_vs_flex"] <= 1e-6, "the dense stand-in must compute what flex attention computes"
        for mode in ("train", "denoise"):
            errors = far[layout][mode] | {"restored_bit_identical": far[layout]["restored_bit_identical"]}
            assert_matches_one_process(errors, TOL, f"AnyFlow FAR {mode} {layout} rank {rank}")
            assert errors["lengths"] == ([ceil(FAR_TOKENS[mode], sp)], ceil(FAR_TOKENS[mode], sp)), errors["lengths"]
        prefill = far[layout]["prefill"]
        assert prefill["cache"] <= TOL, prefill
        assert prefill["cache_shape"] == [2, 2, group(3, sp), 18, 12], prefill
        assert prefill["lengths"] == ([ceil(FAR_TOKENS["prefill"], sp)], ceil(FAR_TOKENS["prefill"], sp)), prefill
    assert_seeds([results[rank]["anyflow_far"][layout]["seed"] for rank in RANKS], layout, 0)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kandinsky6_sr(results, layout):
    """NABLA sparse attention: each rank's masks those of its heads, the flex output, the dense output and every
    gradient; 384 tokens (6 blocks of 64)."""
    sp = LAYOUTS[layout]
    for rank in RANKS:
        errors = results[rank]["kandinsky6_sr"][layout]
        assert_matches_one_process(errors, TOL, f"Kandinsky 6 SR {layout} rank {rank}")
        assert errors["flex"] <= TOL, f"flex attention output error {errors['flex']:.2e}"
        assert errors["grads_compared"] == errors["params"] + 1  # every parameter's and the latents'
        assert errors["masks"] == 2 and errors["masks_equal"], errors
        assert errors["seen"] == [ceil(K6SR_TOKENS, sp)], errors["seen"]
    assert_seeds([results[rank]["kandinsky6_sr"][layout]["seed"] for rank in RANKS], layout, K6SR_SEED)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kandinsky5_nabla(results, layout):
    """Kandinsky 5's NABLA mode (attention_type 'nabla'): each rank's masks those of its heads (Ulysses 4: 3 heads
    padded to 4, the last rank's group padding only), the flex output, the dense output and every gradient; each
    rank's tokens a contiguous run of whole NABLA blocks of the one-process fractal order; 256 tokens (4 blocks)."""
    sp = LAYOUTS[layout]
    for rank in RANKS:
        errors = results[rank]["kandinsky5_nabla"][layout]
        assert_matches_one_process(errors, TOL, f"Kandinsky 5 NABLA {layout} rank {rank}")
        assert errors["flex"] <= TOL, f"flex attention output error {errors['flex']:.2e}"
        assert errors["grads_compared"] == errors["params"] + 2  # every parameter's, the latents' and the text's
        assert errors["masks"] == 2 and errors["masks_equal"], errors
        assert 0.2 < errors["mask_density"] < 0.9, f"NABLA kept {errors['mask_density']:.0%} of the blocks"
        assert errors["taken"] == (2, K5_TOKENS // sp, K5_DIM) and errors["taken_error"] == 0.0, errors
        assert errors["left_stock"], "unparallelize left dit-sp's self-attention forward installed"
    assert_seeds([results[rank]["kandinsky5_nabla"][layout]["seed"] for rank in RANKS], layout, K5_SEED)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sana_wm(results, layout):
    """The gated-delta-rule and softmax branches with their camera branches: 7 heads on both layouts (over Ulysses
    4, 2 a rank and the last rank 1 and a padding head), the tiny model's 3 on dp 2 x Ulysses 2 and refused on
    Ulysses 4 in one line (the last rank would hold no head)."""
    from ulysses_only_layouts import SANA_WM_CASES

    sp = LAYOUTS[layout]
    exact = {"7heads": 7} | ({"tiny": 3} if sp == 2 else {})
    for case, heads in exact.items():
        frames = SANA_WM_CASES[case]["frames"]
        for rank in RANKS:
            errors = results[rank]["sana_wm"][f"{case}/{layout}"]
            label = f"Sana-WM {case} {layout} rank {rank}"
            assert errors["ref_scale"] > 0.1, label
            assert errors["out"] <= TOL, f"{label}: output error {errors['out']:.2e}"
            # above 1, a gradient's error relative to its size (fp32 rounds the final layer's 50 in steps of 4e-6)
            assert errors["grads_relative"] <= TOL, f"{label}: gradient error {errors['grads_relative']:.2e} ({errors})"
            assert errors["grad_count"] == errors["ref_grad_count"] and errors["restored_bit_identical"], label
            local = ceil(frames, sp) * SANA_WM_TOKENS_PER_FRAME  # whole frames a rank
            assert errors["branch_tokens"] == dict.fromkeys(SANA_WM_BRANCHES, [local]), errors["branch_tokens"]
        # each branch's own computation ran over every frame of a rank's real heads
        calls = sorted(call for rank in RANKS for call in results[rank]["sana_wm"][f"{case}/{layout}"]["whole_calls"]
                       [SANA_WM_BRANCHES[0]])  # fmt: skip
        real = [min(group(heads, sp), heads - group(heads, sp) * (rank % sp)) for rank in RANKS]
        assert calls == sorted((frames * SANA_WM_TOKENS_PER_FRAME, n) for n in real), calls
        for rank in RANKS:
            whole = results[rank]["sana_wm"][f"{case}/{layout}"]["whole_calls"]
            assert len({tuple(v) for v in whole.values()}) == 1 and set(whole) == set(SANA_WM_BRANCHES), whole
        assert_seeds([results[rank]["sana_wm"][f"{case}/{layout}"]["seed"] for rank in RANKS], layout, SANA_WM_SEED)
    if sp == 4:
        for rank in RANKS:
            refusal = results[rank]["sana_wm"][f"tiny/{layout}"]
            assert refusal.startswith("Ulysses 4 over SanaWMTransformer3DModel's 3 heads (1 a rank) leaves the last "
                                      "rank no head"), refusal  # fmt: skip
            assert "\n" not in refusal
