"""Worker-side checks of regional compile (``compile_blocks``) under sequence parallelism: every family's tiny
transformer, compiled on a layout, against the same layout's eager run, with the graph breaks Dynamo counted."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from kandinsky_cosmos_checks import TINY, build, inputs
from model_checks import model_inputs

from dit_sp import parallelize
from dit_sp.errors import LayoutRefused
from dit_sp.families import FAMILIES
from dit_sp.parallel import init_layout
from dit_sp.sp.compile import compile_blocks
from dit_sp.zoo import build_tiny


def tiny_models() -> dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], dict]]]:
    """family -> (build, inputs) of a tiny transformer: a built-in model, or one of the test-built ones."""
    found: dict[str, tuple] = {}
    for family in FAMILIES:
        for name in family.tiny_models:
            try:
                model_inputs(name)
            except (ValueError, KeyError):
                continue
            found.setdefault(
                family.name, (lambda n=name: build_tiny(n, "transformer").float(), lambda n=name: model_inputs(n))
            )
        test_built = [name for name in TINY if name.split("-")[0] == family.name]
        if test_built:
            found.setdefault(family.name, (lambda n=test_built[0]: build(n), lambda n=test_built[0]: inputs(n)))
    return found


def flat(output: Any) -> torch.Tensor:
    """A model's outputs as one flat tensor (Cosmos 3: a list of per-item videos; MiniMax-H3: video and audio)."""
    if isinstance(output, torch.Tensor):
        return output.flatten()
    return torch.cat([flat(x) for x in output if x is not None])


def graph_breaks(counters: Any) -> dict[str, Any]:
    """What Dynamo counted: ``graph_breaks``, reason -> count, of the breaks it resumed after
    (``counters["graph_break"]``, as tests/cache counts them) and of the frames it gave up on and ran eagerly
    (``counters["unimplemented"]``: an exception, a break in a loop, the recompile limit), each reason by its first
    line; ``graphs``: the graphs it made."""
    breaks: dict[str, int] = {}
    for kind in ("graph_break", "unimplemented"):
        for reason, count in counters[kind].items():
            first = reason.strip().splitlines()[0]
            breaks[first] = breaks.get(first, 0) + count
    return {"graph_breaks": breaks, "graphs": counters["stats"]["unique_graphs"]}


def _run(model: torch.nn.Module, kwargs: dict, grads: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The outputs, flat, and with ``grads`` the gradients of ``sum(out * w)`` w.r.t. the float inputs."""
    if not grads:
        with torch.no_grad():
            return flat(model(**kwargs, return_dict=False)), []
    leaves = {k: v.clone().requires_grad_() for k, v in kwargs.items()
              if k in ("hidden_states", "encoder_hidden_states")}  # fmt: skip
    out = flat(model(**(kwargs | leaves), return_dict=False))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(3))).sum().backward()
    return out.detach(), [leaf.grad for leaf in leaves.values()]


def compiled_under_sp(families: list[str], layouts: dict[str, dict[str, int]], grads_of: tuple[str, ...] = (),
                      backend: str = "eager", only: dict[str, tuple[str, ...]] | None = None,
                      ) -> dict[str, dict[str, dict[str, Any]]]:  # fmt: skip
    """Per family and layout (``init_layout``'s keywords; ``only``: layout -> the families run on it, default all):
    ``out``, the largest difference between the outputs of
    the model parallelized with its blocks compiled (``compile_blocks``, ``backend``) and parallelized eagerly, and
    ``graph_breaks`` and ``graphs`` (``graph_breaks``), or ``error`` (the compiled call raised), or ``refused`` (the
    layout is); ``seconds``. For the families of ``grads_of``, ``grad``: the same of the input gradients, and
    ``grad_breaks``, Dynamo's count for that call with autograd."""
    from torch._dynamo.utils import counters

    models = tiny_models()
    results: dict[str, dict[str, Any]] = {}
    for layout_name, layout in layouts.items():
        parallel = init_layout(**layout)
        for family in families:
            if only is not None and layout_name in only and family not in only[layout_name]:
                continue
            make, make_inputs = models[family]
            model, kwargs = make(), make_inputs()
            start = time.perf_counter()
            record: dict[str, Any] = {}
            try:
                handle = parallelize(model, parallel)
            except LayoutRefused as error:  # a ring, for a family only Ulysses splits
                results.setdefault(family, {})[layout_name] = {"refused": str(error)}
                continue
            with handle:
                for grads in (False, True) if family in grads_of else (False,):
                    eager, eager_grads = _run(model, kwargs, grads)
                    torch._dynamo.reset()
                    counters.clear()
                    undo = compile_blocks(model, backend=backend)
                    try:
                        compiled, compiled_grads = _run(model, kwargs, grads)
                        if grads:
                            record["grad"] = max(
                                (a - b).abs().max().item() for a, b in zip(compiled_grads, eager_grads)
                            )
                        record["out"] = max(record.get("out", 0.0), (compiled - eager).abs().max().item())
                    except Exception as error:  # noqa: BLE001 (reported)
                        record["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
                    finally:
                        undo()
                    measured = graph_breaks(counters)
                    record |= {"grad_breaks": measured["graph_breaks"]} if grads else measured
            record["seconds"] = time.perf_counter() - start
            results.setdefault(family, {})[layout_name] = record
    return results
