"""Split and gather hooks from a diffusers-style context-parallel plan.

A plan maps module names to what is sharded at that module (diffusers' ``_cp_plan`` format, so the
plans diffusers ships are used as they are): ``{"name": {"arg" or output index: ContextParallelInput}}``
splits a forward argument (or, with ``split_output``, an output) along the sequence (a size-1 dimension,
once a longer sequence was split in the forward, broadcasts over every token and is left whole; an argument
``"name.i"`` is element ``i`` of a tuple argument), and
``{"name": ContextParallelOutput}`` gathers the module's output (of a module returning a tuple, a list of one
``ContextParallelOutput`` or None per output). The empty name is the model itself.
We implement the hooks ourselves: padding of uneven lengths, our gradient semantics, no accelerator
assumption.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from dit_sp._compat import check_cp_plan
from dit_sp.families.family import Plan
from dit_sp.parallel.comm import gather_sequence, shard_sequence
from dit_sp.sp.context import SequenceContext

InputSpec = Any
"""A diffusers ``ContextParallelInput`` (``dit_sp._compat.context_parallel_types``)."""
OutputSpec = Any
"""A diffusers ``ContextParallelOutput``."""


def _as_list(spec) -> list:
    return list(spec) if isinstance(spec, (list, tuple)) else [spec]


def _split(x: Any, spec: InputSpec, ctx: SequenceContext) -> Any:
    """Shard a tensor (or each tensor of a tuple, list or dict) whose rank matches ``expected_dims``."""
    if isinstance(x, (tuple, list)):
        return type(x)(_split(item, spec, ctx) for item in x)
    if isinstance(x, dict):  # e.g. AnyFlow's rotary tables {"query": ..., "key": ...}
        return {key: _split(item, spec, ctx) for key, item in x.items()}
    if not isinstance(x, torch.Tensor) or (spec.expected_dims is not None and x.dim() != spec.expected_dims):
        return x
    if x.shape[spec.split_dim] == 1 and ctx.in_forward and ctx.seq_len not in (None, 1):
        return x  # one value broadcast over every token (LTX's per-token timestep without conditioning: (B, 1))
    ctx.record_seq_len(x.shape[spec.split_dim])
    return shard_sequence(x, ctx.parallel, dim=spec.split_dim)


def _gather(x: Any, spec: OutputSpec, ctx: SequenceContext) -> Any:
    if not isinstance(x, torch.Tensor) or (spec.expected_dims is not None and x.dim() != spec.expected_dims):
        return x
    return gather_sequence(x, ctx.parallel, dim=spec.gather_dim, seq_len=ctx.seq_len, grad=ctx.gather_grad)


def _at(value: Any, path: list[int], spec: InputSpec, ctx: SequenceContext) -> Any:
    """``value`` with its element at ``path`` (indices into nested tuples) split."""
    if not path or value is None:
        return _split(value, spec, ctx) if value is not None else value
    items = list(value)
    items[path[0]] = _at(items[path[0]], path[1:], spec, ctx)
    return type(value)(items)


def _input_hook(module: torch.nn.Module, specs: dict, ctx: SequenceContext, is_root: bool) -> Callable:
    names = list(inspect.signature(module.forward).parameters)

    def hook(mod, args, kwargs):
        if is_root:
            ctx.begin()
        args = list(args)
        for key, spec in specs.items():
            # "name.1": element 1 of a tuple argument (Allegro's rotary positions, beside their whole tables)
            name, *path = str(key).split(".")
            for item in _as_list(spec):
                if name in kwargs:
                    kwargs[name] = _at(kwargs[name], [int(i) for i in path], item, ctx)
                elif name in names and names.index(name) < len(args):
                    index = names.index(name)
                    args[index] = _at(args[index], [int(i) for i in path], item, ctx)
        return tuple(args), kwargs

    return hook


def _output_hook(specs: dict | OutputSpec | list, ctx: SequenceContext, is_root: bool) -> Callable:
    def hook(mod, args, output):
        if isinstance(specs, dict):  # split outputs (e.g. rotary embeddings computed for the full sequence)
            if isinstance(output, tuple):
                output = list(output)
                for index, spec in specs.items():
                    for item in _as_list(spec):
                        output[index] = _split(output[index], item, ctx)
                output = tuple(output)
            else:
                for item in _as_list(specs.get(0, [])):
                    output = _split(output, item, ctx)
        elif isinstance(output, (tuple, list)):  # one entry per output, None: not gathered (diffusers' format)
            entries = _as_list(specs)
            if len(entries) != len(output):
                raise ValueError(f"the plan gathers {len(entries)} outputs of a module that returns {len(output)}")
            output = type(output)(x if spec is None else _gather(x, spec, ctx) for x, spec in zip(output, entries))
        else:
            for item in _as_list(specs):
                output = _gather(output, item, ctx)
        if is_root:
            ctx.end()
        return output

    return hook


def _expand(plan: Plan, modules: dict[str, torch.nn.Module], owner: str) -> Plan:
    """The plan by module name: a ``*`` in a name stands for one path component (diffusers' ``"blocks.*"``, every
    block), and the split entries several names give one module are merged."""
    expanded: Plan = {}
    missing = []
    for key, spec in plan.items():
        pattern = re.compile(re.escape(key).replace(r"\*", r"[^.]+"))
        names = [name for name in modules if pattern.fullmatch(name)] if "*" in key else [key] * (key in modules)
        if not names:
            missing.append(key)
        for name in names:
            if name in expanded and not (isinstance(spec, dict) and isinstance(expanded[name], dict)):
                raise ValueError(f"the sequence-parallel plan of {owner} both splits and gathers at {name!r}")
            expanded[name] = expanded[name] | spec if name in expanded else spec
    if missing:
        raise ValueError(f"the sequence-parallel plan names modules that {owner} lacks: {missing}")
    return expanded


def apply_plan(model: torch.nn.Module, plan: Plan, ctx: SequenceContext) -> list[RemovableHandle]:
    """Install the plan's hooks on ``model``; returns handles that remove them again."""
    check_cp_plan(plan, type(model).__name__)
    handles = []
    modules = dict(model.named_modules())
    plan = _expand(plan, modules, type(model).__name__)
    root_spec = plan.get("", {})
    # The model itself always gets hooks: they open and close the forward (see SequenceContext).
    handles.append(model.register_forward_pre_hook(_input_hook(model, root_spec, ctx, True), with_kwargs=True))
    for name, spec in plan.items():
        if name == "":
            continue
        module = modules[name]
        inputs = (
            {k: v for k, v in spec.items() if not any(i.split_output for i in _as_list(v))}
            if isinstance(spec, dict)
            else {}
        )
        outputs = {k: v for k, v in spec.items() if k not in inputs} if isinstance(spec, dict) else spec
        if inputs:
            handles.append(module.register_forward_pre_hook(_input_hook(module, inputs, ctx, False), with_kwargs=True))
        if outputs:
            handles.append(module.register_forward_hook(_output_hook(outputs, ctx, False)))
    handles.append(model.register_forward_hook(_output_hook({}, ctx, True)))
    return handles
