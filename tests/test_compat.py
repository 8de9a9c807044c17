"""dit-sp fails loudly, not silently: private torch/diffusers APIs (dit_sp._compat), attention that
bypasses USP, the cfg placeholder, forgotten sequence lengths."""

from __future__ import annotations

import ast
import dataclasses
import re
import types
from datetime import timedelta
from pathlib import Path

import diffusers
import pytest
import torch
import torch.distributed as dist
from compat_checks import check_loud_failures, wan_inputs, with_manual_attention
from diffusers.models import _modeling_parallel
from torch.distributed.device_mesh import DeviceMesh

from dit_sp import ParallelConfig, gather_sequence, init_parallel, parallelize, spawn, usp_attention
from dit_sp import _compat as compat
from dit_sp.attention import get_kernel
from dit_sp.parallel import single_process_state
from dit_sp.sp.guidance import GuidancePair
from dit_sp.zoo import build_tiny

CPU = torch.device("cpu")


def test_every_private_api_resolves():
    report = compat.check_environment()
    failed = {what: status for what, status in report.items() if status.startswith("FAILED")}
    assert not failed
    checked = ("ContextParallelInput", "_cp_plan", "_attention_backend", "_Options", "_flatten", "all_gather",
               "_diffusers_hook", "_padding", "_conv_forward", "_base")  # fmt: skip
    for name in checked:
        assert any(name in what for what in report), f"check_environment does not check {name}"
    assert sum(what.startswith("torch aten.") for what in report) == len(compat.ATEN_ATTENTION_OPS)


@pytest.mark.parametrize(
    ("remove", "call", "package", "named"),
    [
        (lambda mp: mp.delattr(_modeling_parallel, "ContextParallelInput"), compat.context_parallel_types,
         "diffusers", "diffusers.models._modeling_parallel.ContextParallelInput"),
        (lambda mp: mp.setattr(diffusers.WanTransformer3DModel, "_cp_plan", None),
         lambda: compat.model_cp_plan(build_tiny("tiny-wan", "transformer")), "diffusers",
         "WanTransformer3DModel._cp_plan"),
        (lambda mp: mp.delattr(diffusers.ModelMixin, "_parallel_config"),
         lambda: compat.model_parallel_config(torch.nn.Linear(1, 1)), "diffusers", "ModelMixin._parallel_config"),
        (lambda mp: mp.delattr(dist.ProcessGroupGloo, "_Options"),
         lambda: compat.group_options("gloo", timedelta(seconds=5)), "torch",
         "torch.distributed.ProcessGroupGloo._Options"),
        (lambda mp: mp.delattr(DeviceMesh, "_flatten"), lambda: compat.flatten_mesh(None, "sp"), "torch",
         "DeviceMesh._flatten"),
        (lambda mp: [mp.delattr(dist, name) for name in ("all_gather_single", "all_gather_into_tensor")],
         lambda: compat.all_gather_single(torch.zeros(2), torch.zeros(1), None), "torch",
         "torch.distributed.all_gather_single"),
        (lambda mp: None, lambda: compat.aten_op("_scaled_dot_product_gone"), "torch",
         "torch.ops.aten._scaled_dot_product_gone"),
    ],
    ids=["ContextParallelInput", "_cp_plan", "model._parallel_config", "gloo _Options", "_flatten",
         "all_gather_single", "aten op"],
)  # fmt: skip
def test_a_missing_private_api_is_named(monkeypatch, remove, call, package, named):
    remove(monkeypatch)
    version = diffusers.__version__ if package == "diffusers" else torch.__version__
    with pytest.raises(compat.CompatibilityError) as info:
        call()
    message = str(info.value)
    assert named in message and f"your {package} {version} lacks it" in message
    assert f"({package} {compat.TESTED[package]} tested)" in message and "install a supported version" in message
    if "aten" not in named:  # the report names it too, and raising lists it
        report = compat.check_environment(raise_on_error=False)
        assert any(status.startswith("FAILED") and named in status for status in report.values())
        with pytest.raises(compat.CompatibilityError, match="cannot run on this environment"):
            compat.check_environment()


PRIVATE_ATTRIBUTES = {
    "_attention_backend", "_base", "_cache_config", "_conv_forward", "_context", "_cp_plan", "_diffusers_hook",
    "_flatten", "_get_child_registries", "_get_parameter_from_args_kwargs", "_init_fn", "_keep_in_fp32_modules",
    "_Options", "_padding", "_parallel_config", "_should_compute_remaining_blocks", "_timeout",
}  # fmt: skip
"""Private attributes of torch / diffusers objects (modules, processors, hooks, tensors) that dit-sp reaches
through ``dit_sp._compat``; none of them is a name of dit-sp's own."""

_PRIVATE_PATH = re.compile(r"^(torch|diffusers)(\.\w+)*\._\w*")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_api_uses(source: str) -> list[str]:
    """Where ``source`` reaches a private torch / diffusers name: an import of a private module or name of
    theirs (``from torch._x import``, ``from diffusers.y import _z``), a private attribute on a name bound
    from them (``torch._x``, ``dist.ProcessGroupGloo._Options``), one of ``PRIVATE_ATTRIBUTES`` on any
    object or as a string (``getattr(m, "_cp_plan")``), or a private module path as a string
    (``"torch._tensor"``). Private names of dit-sp's own (``self._undo``, ``dit_sp._compat``) are not."""
    tree, bound, found = ast.parse(source), set(), []

    def ours(module: str | None) -> bool:
        return module is not None and module.split(".")[0] in ("torch", "diffusers")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if ours(a.name)):
                bound.add((alias.asname or alias.name).split(".")[0])
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and ours(node.module):
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import")
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, root = [node.attr], node.value
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound and any(_private(part) for part in chain):
                found.append(f"{node.lineno}: {'.'.join([root.id, *reversed(chain)])}")
            elif node.attr in PRIVATE_ATTRIBUTES:
                found.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (node.value in PRIVATE_ATTRIBUTES or _PRIVATE_PATH.match(node.value))
        ):
            found.append(f"{node.lineno}: {node.value!r}")
    return sorted(set(found))


def private_api_uses_in(package: Path) -> dict[str, list[str]]:
    """``private_api_uses`` of every module of ``package`` (a ``dit_sp`` directory) but ``_compat``."""
    uses = {}
    for path in sorted(package.rglob("*.py")):
        if package / "_compat" not in path.parents:
            found = private_api_uses(path.read_text())
            if found:
                uses[str(path.relative_to(package.parent))] = found
    return uses


def test_private_apis_are_reached_only_through_compat():
    import dit_sp

    uses = private_api_uses_in(Path(dit_sp.__file__).parent)
    assert not uses, f"private torch/diffusers names outside dit_sp._compat (add a function there): {uses}"


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("import torch\ntorch._dynamo.reset()", True),
        ("import torch.distributed as dist\ndist.ProcessGroupGloo._Options()", True),
        ("from torch.distributed.tensor._utils import f", True),
        ("import diffusers.models._modeling_parallel", True),
        ("from diffusers.hooks.hooks import _set_cache_context", True),
        ("from diffusers import models\nmodels.x._y", True),
        ("meta._get_parameter_from_args_kwargs('temb', a, k)", True),
        ("pad = module._padding[2]", True),
        ("getattr(model, '_diffusers_hook', None)", True),
        ("f.__module__ == 'torch._tensor'", True),
        ("importlib.import_module('diffusers.hooks._common')", True),
        ("from dit_sp import _compat\n_compat.block_argument(m, 'x', a, k)", False),
        ("from dit_sp._compat import hook_registry", False),
        ("self._undo.append(1)\nctx._mask_cache.clear()\nos._exit(0)", False),
        ("import torch\nx = torch.zeros(1).__class__.__name__", False),
        ("d = {'_class_name': 'WanPipeline'}", False),
    ],
)  # fmt: skip
def test_the_private_api_scan_is_precise(source, flagged):
    assert bool(private_api_uses(source)) == flagged, private_api_uses(source)


def test_parallelize_names_a_missing_plan_type(monkeypatch):
    """Not an AttributeError deep in a hook: parallelize itself says what diffusers lacks."""
    monkeypatch.delattr(_modeling_parallel, "ContextParallelOutput")
    model = build_tiny("tiny-wan", "transformer")
    with pytest.raises(compat.CompatibilityError, match=r"_modeling_parallel\.ContextParallelOutput"):
        parallelize(model, single_process_state(CPU))
    assert not hasattr(model, "_dit_sp_parallel")  # and nothing was left half applied


def test_plan_entries_of_an_unknown_kind_are_refused(monkeypatch):
    plan = dict(compat.model_cp_plan(diffusers.WanTransformer3DModel))
    plan["proj_out"] = ("gather along dim", 1)  # what a future diffusers could put there
    monkeypatch.setattr(diffusers.WanTransformer3DModel, "_cp_plan", plan)
    with pytest.raises(compat.CompatibilityError, match=r"entry for 'proj_out' holds \['gather along dim', 1\]"):
        parallelize(build_tiny("tiny-wan", "transformer"), single_process_state(CPU))


def test_a_missing_attention_kernel_is_named_and_skipped(monkeypatch):
    monkeypatch.setattr(torch.ops, "aten", types.SimpleNamespace())
    with pytest.raises(ValueError, match=r"'cpu_flash' cannot be used: dit-sp needs .*aten\._scaled_dot_product_flash"):
        get_kernel("cpu_flash", CPU, torch.float32, 8)
    assert get_kernel(None, CPU, torch.float32, 8).name == "math"


# --- attention that does not go through USP -------------------------------------------------------
def test_unrouted_attention_raises_in_one_process():
    model = with_manual_attention(build_tiny("tiny-wan", "transformer").float())
    with torch.no_grad():
        model(**wan_inputs())  # fine unparallelized
        with parallelize(model, single_process_state(CPU)), pytest.raises(RuntimeError) as info:
            model(**wan_inputs())
    assert "SequenceParallel" not in str(info.value)
    assert "ManualSoftmaxProcessor of the WanAttention module 'blocks.0.attn1'" in str(info.value)
    assert "without torch's scaled_dot_product_attention" in str(info.value)


@pytest.fixture(scope="module")
def two_rank_results() -> list[dict]:
    return spawn(check_loud_failures, 2, timeout=300)


def test_unrouted_attention_raises_on_two_ranks(two_rank_results):
    for results in two_rank_results:
        message = results["unrouted"]
        assert message.startswith("RuntimeError: ManualSoftmaxProcessor of the WanAttention module 'blocks.0.attn1'")
        assert "attended over this rank's shard of the sequence only" in message
        assert "native attention backend" in message


# --- the cfg placeholder --------------------------------------------------------------------------
def test_guidance_placeholder_is_nan_until_the_second_call(monkeypatch):
    """Single process: the pair's exchange is stubbed (cfg rank 0 computes the conditional branch)."""
    parallel = dataclasses.replace(single_process_state(CPU), config=ParallelConfig(cfg=2))
    model = types.SimpleNamespace(config={"out_channels": 3})
    guidance = GuidancePair(parallel, family=None)  # the sequential mode does not use the family
    monkeypatch.setattr(guidance, "_exchange", lambda mine: [mine, mine + 1])
    forward = lambda hidden_states, return_dict=True: (hidden_states[:, :3] * 2,)
    hidden = torch.randn(2, 4, 5)
    (placeholder,) = guidance.sequential(model, forward, (), {"hidden_states": hidden, "return_dict": False})
    assert placeholder.shape == (2, 3, 5) and placeholder.isnan().all()
    (uncond,) = guidance.sequential(model, forward, (), {"hidden_states": hidden + 10, "return_dict": False})
    torch.testing.assert_close(placeholder, hidden[:, :3] * 2)  # filled in place with the conditional output
    torch.testing.assert_close(uncond, hidden[:, :3] * 2 + 1)


def test_guidance_placeholder_is_nan_on_two_ranks(two_rank_results):
    for results in two_rank_results:
        assert results["placeholder_all_nan"]
        assert results["cond_error"] < 1e-6 and results["uncond_error"] < 1e-6


# --- forgotten or wrong sequence lengths ----------------------------------------------------------
@pytest.fixture
def two_shards():
    """A layout of 2 SP ranks without process groups: the length checks run before any communication."""
    return dataclasses.replace(single_process_state(CPU), config=ParallelConfig(ulysses=2))


def test_seq_len_is_required_with_several_ranks(two_shards):
    q = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match=r"usp_attention over 2 sequence-parallel ranks needs seq_len=S"):
        usp_attention(q, q, q, two_shards)
    with pytest.raises(ValueError, match=r"gather_sequence over 2 sequence-parallel ranks needs seq_len=S"):
        gather_sequence(q, two_shards)


@pytest.mark.parametrize("seq_len", [1, 3, 4, 7, 0])
def test_seq_len_must_match_the_shards(two_shards, seq_len):
    """Shards of 3 tokens on 2 ranks hold 5 or 6 tokens: anything else (e.g. the shard's own length) raises."""
    q = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match=rf"seq_len={seq_len} does not fit 2 shards of 3 tokens.*\[5, 6\]"):
        usp_attention(q, q, q, two_shards, seq_len=seq_len)
    with pytest.raises(ValueError, match=rf"seq_len={seq_len} does not fit 2 shards of 3 tokens"):
        gather_sequence(q, two_shards, seq_len=seq_len)


def test_seq_len_mistakes_raise_on_two_ranks(two_rank_results):
    for results in two_rank_results:
        assert "needs seq_len=S" in results["no_seq_len"]
        assert "seq_len=3 does not fit 2 shards of 3 tokens" in results["shard_len_as_seq_len"]
        assert "not of one shard" in results["shard_len_as_seq_len"]
        assert "needs seq_len=S" in results["gather_no_seq_len"]
        assert results["padded_error"] < 1e-6


def test_one_process_needs_no_seq_len():
    parallel = init_parallel(ParallelConfig())
    q = torch.randn(1, 6, 2, 4)
    assert usp_attention(q, q, q, parallel).shape == q.shape
    assert gather_sequence(q, parallel) is q
