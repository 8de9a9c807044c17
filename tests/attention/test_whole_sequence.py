"""attend_whole_sequence: any per-head attention (here a decayed recurrent scan with a per-head parameter) over the
whole sequence under Ulysses, equal to one process in output and every gradient; a ring refuses it."""

from __future__ import annotations

import pytest
from whole_sequence_checks import check

from dit_sp import spawn

pytestmark = pytest.mark.slow  # spawns a world of 4 worker processes

LAYOUTS = [(1, 1, 4), (2, 1, 2), (1, 2, 2)]  # 6 heads: padded to 8 under Ulysses 4; 61 tokens: the shards padded


@pytest.fixture(scope="module")
def results():
    return spawn(check, 4, args=(LAYOUTS,), timeout=300)[0]


@pytest.mark.parametrize("layout", ["dp1-r1-u4", "dp2-r1-u2"])
def test_ulysses_matches_one_process(results, layout):
    errors = results[layout]
    assert set(errors) == {"out", "dq", "dk", "dv", "decay"}
    assert max(errors.values()) < 1e-10, errors  # float64 throughout


def test_ring_refuses(results):
    assert results["dp1-r2-u2"] == (
        "this attention (not plain softmax attention over the sequence) is exact under Ulysses alone, where every "
        "rank holds the whole sequence of its heads; use ring 1 (got ring 2)"
    )


def test_bad_inputs_are_told_what_is_wrong():
    """No tensors, or an ``attend`` that returns something else than the whole sequence of the heads it was given."""
    import torch

    from dit_sp import ParallelConfig, init_parallel
    from dit_sp.attention import attend_whole_sequence

    parallel = init_parallel(ParallelConfig())
    with pytest.raises(ValueError, match=r"^attend_whole_sequence takes one or more \(B, S_local, H, D\) tensors"):
        attend_whole_sequence(lambda: None, [], parallel)
    q = torch.randn(2, 5, 3, 4)
    with pytest.raises(
        ValueError, match=r"attend must return \(B, S, h, D_out\) with \(B, S, h\) = \(2, 5, 3\).*got \(2, 4, 3, 4\)"
    ):
        attend_whole_sequence(lambda q, k: q[:, :4], [q, q], parallel)
    assert torch.equal(attend_whole_sequence(lambda q, k: q + k, [q, q], parallel), 2 * q)
