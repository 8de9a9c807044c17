"""usp_attention on every (dp, ring, ulysses) layout vs. single-process SDPA: outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from usp_checks import Case, check_layouts

from dit_sp import spawn

pytestmark = pytest.mark.slow  # spawns worlds of 2 and 4 worker processes

FP32_TOL = 1e-5
# bf16 inputs, fp32 merge: the error is that of rounding q/k/v/out to bf16; measured <= 0.6% of the
# largest reference value (outputs and gradients) on every layout. A single-process bf16 SDPA is as far.
BF16_REL_TOL = 1.5e-2

CASES = [
    Case(seq=64, heads=4),  # even
    Case(seq=61, heads=4),  # sequence not divisible by ring*ulysses: padded keys masked
    Case(seq=64, heads=3),  # heads not divisible by ulysses: padded heads
    Case(seq=61, heads=5, joint=7, position="front"),  # joint text tokens in front
    Case(seq=61, heads=5, joint=7, position="rear"),  # ... and behind
    Case(seq=5, heads=3, joint=2),  # shorter than the padding: some ranks hold only padding
    Case(seq=61, heads=4, joint=6, position="rear", joint_valid=(6, 2)),  # padded prompt, per sample
    Case(seq=64, heads=4, joint=6, joint_valid=(0, 3)),
    Case(seq=61, heads=5, joint=7, joint_valid=(4, 4)),  # the same padding for the whole batch: cut, not masked
    Case(seq=64, heads=4, kernel="math"),  # the ring on another kernel
    Case(seq=64, heads=4, dtype=torch.bfloat16),
    Case(seq=61, heads=5, joint=7, dtype=torch.bfloat16),
    # masks over the whole sequence (Ulysses applies them whole; a ring refuses them)
    Case(seq=61, heads=4, mask="block_causal", batch=1),  # SkyReels-V2's frames; shards cut the blocks
    Case(seq=61, heads=3, mask="per_head"),  # per sample and head, heads padded under Ulysses 2 and 4
    Case(seq=64, heads=4, mask="additive"),
    # two split streams side by side (Motif-Video's decoder layers): each shard padded, real keys first in a block
    Case(seq=61, heads=3, streams=2),
    Case(seq=5, heads=3, streams=2, kernel="math"),  # some ranks hold only padding of both
]
WORLD2 = [(1, 1, 2), (1, 2, 1)]
WORLD4 = [(1, 2, 2), (1, 1, 4), (1, 4, 1), (2, 1, 2)]


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, float]]:
    """Run all layouts of a world size in one spawn (several meshes in one process must coexist)."""
    out = spawn(check_layouts, 2, args=(WORLD2, CASES), timeout=300)[0]
    out |= spawn(check_layouts, 4, args=(WORLD4, CASES), timeout=300)[0]
    return out


@pytest.mark.parametrize("layout", WORLD2 + WORLD4, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_matches_single_process(results, layout, case):
    errors = dict(results["dp{}-r{}-u{}/{}".format(*layout, case.name)])
    if case.mask and layout[1] > 1:  # a ring holds one block of keys at a time
        assert errors["refusal"] == (
            "an attention mask over the whole sequence (other than a boolean padding mask) is exact under Ulysses "
            "alone, where every rank attends over the whole sequence of its heads; not with ring > 1: use ring 1 and "
            "the default kernel"
        )
        return
    scale = errors.pop("scale")
    expected = {"out", "dq", "dk", "dv"} | ({"out_joint", "dq_joint", "dk_joint", "dv_joint"} if case.joint else set())
    assert set(errors) == expected
    tol = FP32_TOL if case.dtype == torch.float32 else BF16_REL_TOL * scale
    bad = {name: err for name, err in errors.items() if not err <= tol}
    assert not bad, f"errors above {tol:.1e}: {bad}"
