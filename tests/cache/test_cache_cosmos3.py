"""Step caches on Cosmos 3, whose layers take one packed sequence without a batch dimension (``(S, C)``: the und prefix
and the gen tokens as two streams, ``und_seq`` and ``gen_seq``; ``ModelFamily.cache_token_dim`` 0).

One process (the tiny transformer, the video model and the omni one with sound and action tokens): a skipped call
equals a whole-stack cache built by hand (its base plus the residual of each stream), a computed one the model without
a cache. The decision reads the gen tokens along dimension 0 and leaves the last shard's padding out. Ulysses 2 (the
stock pipeline, in the family-cache spawn of tests/cache/test_family_caches.py): the same calls skipped as one
process, each branch in its own state, the reduced change one process's."""

from __future__ import annotations

import cosmos3_cache_checks as checks
import cosmos3_checks
import pytest
import torch

from dit_sp.cache import CacheSpec, enable_cache
from dit_sp.cache.decide import DecisionGroup, relative_change


@pytest.mark.parametrize("model", sorted(cosmos3_checks.MODELS))
def test_a_skipped_cosmos3_call_adds_the_whole_stack_residual_of_each_stream(model):
    make, make_inputs = cosmos3_checks.MODELS[model]
    transformer, calls = make().eval(), checks.two_calls(make_inputs())
    with torch.no_grad():
        plain = [checks.predictions(transformer(**call, return_dict=False)) for call in calls]
    for policy in ("first_block", "teacache"):
        reference = checks.whole_stack_reference(transformer, calls, policy)
        assert torch.equal(reference[0], plain[0])  # the computed call: the model as it is
        assert (reference[1] - plain[1]).abs().max() > 1e-3  # the skipped one: not what the layers would give
        outputs, computed = checks.cached_outputs(transformer, calls, CacheSpec(policy, 1e6))
        assert computed == [True, False], policy
        assert torch.equal(outputs[0], plain[0]), policy
        assert torch.equal(outputs[1], reference[1]), policy  # the residual reused, exactly
        assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in transformer.modules())


def test_cosmos3_calls_outside_a_cache_context_are_named_by_their_prompt_ids():
    """A call per guidance branch outside the pipeline's contexts: the run's first ``input_ids`` tensor names ``cond``,
    a second (another prompt, another packed length) ``uncond``, each with its own state (its first call decides on
    nothing); a call at a higher timestep starts a new schedule (every state reset)."""
    transformer = cosmos3_checks.build().eval()
    first, second = checks.two_calls(cosmos3_checks.transformer_inputs())
    und = cosmos3_checks.UND_TOKENS
    shorter = {"input_ids": first["input_ids"][:-2].clone(), "text_indexes": first["text_indexes"][:-2],
               "und_len": und - 2, "sequence_length": first["sequence_length"] - 2,
               "position_ids": torch.cat([first["position_ids"][:, : und - 2], first["position_ids"][:, und:]], 1),
               "vision_sequence_indexes": first["vision_sequence_indexes"] - 2,
               "vision_mse_loss_indexes": first["vision_mse_loss_indexes"] - 2}  # fmt: skip
    calls = [first, first | shorter, second, second | shorter, second | {"vision_timesteps": first["vision_timesteps"]}]
    cache = enable_cache(transformer, "first_block:1e6")
    try:
        with torch.no_grad():
            for call in calls:
                transformer(**call, return_dict=False)
    finally:
        cache.undo()
    records = cache.stats.records
    assert [r.context for r in records] == ["cond", "uncond", "cond", "uncond", "cond"]
    assert [r.change is None for r in records] == [True, True, False, False, True]  # the last: a new schedule
    assert [r.computed for r in records] == [True, True, False, False, True]


def test_the_decision_counts_the_real_tokens_along_the_packed_dimension():
    """``relative_change`` on ``(S_local, C)`` residuals: with 4 real tokens of 5 (the last shard's pad), the pad's
    values change nothing; along dimension 1 (a batched layout's tokens) the same tensors would count the pad."""
    g = torch.Generator().manual_seed(0)
    previous, current = (torch.randn(5, 8, generator=g) for _ in range(2))
    padded = current.clone()
    padded[4:] = 1e3  # what attention leaves on a padded query
    packed = DecisionGroup(real_tokens=lambda local: local - 1, token_dim=0)
    real, before = current[:4].double(), previous[:4].double()
    exact = ((real - before).abs().sum() / before.abs().sum()).item()
    assert relative_change(padded, previous, packed, per_token=True)[0] == pytest.approx(exact, rel=1e-12)
    batched = DecisionGroup(real_tokens=lambda local: local - 1)  # token_dim 1: would drop a channel, keep the pad
    assert relative_change(padded, previous, batched, per_token=True)[0] > 100 * exact
