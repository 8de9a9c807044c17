"""Step caches on the families with work between their blocks (``dit_sp.cache.between``): modules added to the hidden
states (``ModelFamily.cache_between_blocks``: Wan Animate's face adapters and ConsisID's identity perceiver
cross-attention, in both tiny models after the first block, inside the cached residual, and after the last, outside
it), and Latte's last (temporal) block of another layout than its first (spatial) one (``ModelFamily.cache_layout``),
with its temporal position embedding added inline between them.

One process: a skipped step equals a whole-stack cache built by hand from plain forward hooks (its base plus the
residual the last block's output held over the first block's output or input at the computed step, in the first
block's layout), and a computed step equals the model without a cache; diffusers' hooks alone do not (the modules run
on a skipped step too, as before; Latte's residual mixes its layouts). Ulysses 2, CFG parallelism (2 x 1) and a ring
of 2 (one spawn): each stock pipeline, cached, skips the same steps as one process (some, not all) and gives its
frames and last latents within 1e-4."""

from __future__ import annotations

import cache_between_checks as checks
import pytest
import torch

from dit_sp import spawn
from dit_sp.cache import CacheSpec
from dit_sp.errors import ConfigError
from dit_sp.families import family_of
from dit_sp.zoo import build_tiny

LAYOUTS = {"tiny-latte": checks.latte_layouts(1, 5, 15)}  # its last block temporal, its first spatial


@pytest.mark.parametrize("model", checks.MODELS)
def test_a_skipped_step_adds_the_whole_stack_residual_once(model):
    transformer, calls = checks.transformer_calls(model)
    family = family_of(transformer)
    assert family.cache_between_blocks or family.cache_layout  # the family declares what it does between blocks
    with torch.no_grad():
        plain = [transformer(**call, return_dict=False)[0] for call in calls]
    for policy in ("first_block", "teacache"):
        reference = checks.whole_stack_reference(transformer, calls, policy, LAYOUTS.get(model))
        assert (reference[0] - plain[0]).abs().max() == 0  # the computed call: the model as it is
        assert (reference[1] - plain[1]).abs().max() > 1e-3  # the skipped one: not what the blocks would give
        outputs, computed = checks.cached_outputs(transformer, calls, CacheSpec(policy, 1e6))  # skips all it can
        assert computed == [True, False], policy
        assert (outputs[0] - plain[0]).abs().max() <= 1e-6, policy
        assert (outputs[1] - reference[1]).abs().max() <= 1e-6, policy
        assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in transformer.modules())
    # diffusers' hooks alone: the modules between the blocks run on the skipped step too, their effect counted twice;
    # Latte's residual, its temporal last block's (B S, F, C) output minus its spatial first block's (B F, S, C), fails
    if model == "tiny-latte":
        with pytest.raises(RuntimeError, match=r"size of tensor a \(5\) must match the size of tensor b \(15\)"):
            checks.hooks_alone_outputs(transformer, calls)
    else:
        old = checks.hooks_alone_outputs(transformer, calls)
        assert (old[1] - checks.whole_stack_reference(transformer, calls, "first_block")[1]).abs().max() > 1e-2


def test_a_cached_latte_call_without_its_temporal_blocks_is_refused():
    """``enable_temporal_attentions=False``: Latte's last block (temporal) never runs, so no residual reaches it; the
    first call is refused in one line, not left to fail at the next skip."""
    transformer, calls = checks.transformer_calls("tiny-latte")
    with pytest.raises(ConfigError, match=r"^step caching: LatteTransformer3DModel's last block did not run in this "
                                          r"call \(e.g. Latte with enable_temporal_attentions=False\)"):  # fmt: skip
        checks.cached_outputs(transformer, [calls[0] | {"enable_temporal_attentions": False}], "first_block:0.1")
    with torch.no_grad():  # the hooks are gone
        transformer(**calls[0], return_dict=False)


def _expected(whole: dict, layout: str, model: str, cfg_rank: int) -> tuple[list, list]:
    """What a split run on ``layout`` must give on a rank: the one-process run's records of the calls this rank runs
    (CFG parallelism, sequential guidance, Wan Animate: its branch's alone, cond on cfg rank 0, uncond on 1; else all),
    and the shapes its first block gets (Ulysses and ring: half of the tokens; CFG parallelism: the whole tokens, a
    batched family's guidance batch halved)."""
    if layout != "cfg2":
        return whole["records"], [(batch, -(-tokens // 2)) for batch, tokens in whole["shapes"]]
    if family_of(build_tiny(model, "transformer")).cfg_mode == "batched":
        return whole["records"], [(batch // 2, tokens) for batch, tokens in whole["shapes"]]
    branch = ("cond", "uncond")[cfg_rank]
    return [r for r in whole["records"] if r[0] == branch], whole["shapes"]


@pytest.mark.slow  # spawns worker processes
def test_cached_pipelines_skip_as_one_process_and_match_it_on_ulysses_cfg_and_ring():
    """Each stock pipeline, cached, on Ulysses 2, CFG parallelism (cfg 2 x 1: Wan Animate's two guidance calls a step
    one a rank, ConsisID's and Latte's guidance batch halved) and a ring of 2 (one spawn): on every call it runs, the
    same decision as one process, from the same change (within 1e-5: reduced over the ranks that share the call's
    tokens, both halves of a guidance batch), some steps skipped and not all; frames and last latents within 1e-4."""
    by_rank = spawn(checks.between_runs, 2, timeout=300)
    for cfg_rank, rank in enumerate(by_rank):  # (2 processes: on CFG parallelism, the rank is the cfg rank)
        assert set(rank) == {(model, spec) for model, specs in checks.SPECS.items() for spec in specs}
        for (model, spec), runs in rank.items():
            whole = runs["whole"]
            computed = [c for _, c, _ in whole["records"]]
            assert any(computed) and not all(computed), (model, spec)  # some steps skipped, not all
            assert whole["frames"].float().std() > 0.01, (model, spec)
            assert set(runs) == {"whole", *checks.LAYOUTS}
            for layout in checks.LAYOUTS:
                key, split = (model, spec, layout), runs[layout]
                records, shapes = _expected(whole, layout, model, cfg_rank)
                assert [r[:2] for r in split["records"]] == [r[:2] for r in records], key
                assert any(not r[1] for r in records), key
                for (*_, change), (*_, expected) in zip(split["records"], records, strict=True):
                    assert (change is None) == (expected is None), key
                    assert change is None or abs(change - expected) <= 1e-5, (key, change, expected)
                assert split["shapes"] == shapes, key
                assert (split["frames"] - whole["frames"]).abs().max() <= 1e-4, key
                assert (split["latents"] - whole["latents"]).abs().max() <= 1e-4, key
    for key in by_rank[0]:  # every rank ran the same one-process run
        assert (by_rank[0][key]["whole"]["frames"] - by_rank[1][key]["whole"]["frames"]).abs().max() == 0, key
