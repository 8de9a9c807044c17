"""The cache context of each transformer call: diffusers' cache hooks keep their state per context, which a stock
pipeline names around each call (``with transformer.cache_context("cond")``). A call made outside any context gets one
here, by the family's rule, or is refused:

- batched guidance (``cfg_mode="batched"``: EasyAnimate, Allegro, LTX-2's distilled passes): the one call a step gets
  ``"cond_uncond"``; a second call at the same timestep is a second-order scheduler's re-evaluation of the same tokens
  (Heun, KDPM2: every argument but the latents the previous call's) and takes that context too, any other (LTX-2 DFR's
  video tiles: other tokens each) is refused, since the step's one state would then serve different inputs;
- one call per guidance branch, named by the family's ``cache_branches`` (``BranchCalls``: ChronoEdit, HunyuanVideo
  Framepack, Cosmos, Kandinsky 5): a call is in the branch of the prompt tensor it gets (the pipeline passes one prompt
  per branch for the whole run, conditional first: the first tensor of a run names ``"cond"``, the second
  ``"uncond"``; a later call whose every argument but the latents and timestep equals in value those of one branch's
  first call, copies made each step, is in that branch; another is refused). A call whose timestep is above the
  previous call's (the schedule restarted: Framepack's next section) or whose latents differ in shape from the previous
  call's (ChronoEdit's temporal reasoning drops its reasoning frames) first resets every branch's cache state, so no
  residual cached for another schedule or shape is reused;
- no guidance (``BranchCalls(prompt=None)``: Kandinsky 6 SR, MiniMax-H3): every call is ``"cond"``. A call none of whose
  timesteps moved on from the previous call's (below it; above it where they rise, ``BranchCalls.rising``: MiniMax-H3's
  flow time) starts a new schedule (Kandinsky 6 SR's next tile, a modular pipeline's next run, which resets no state
  itself), as does one whose latents or timesteps differ in shape: the state is reset first;
- otherwise: refused in one line, since one state would then serve both guidance branches.

A call inside a context the pipeline set (``cache_context("cond")``) is compared with the previous call of that
context: one whose latents or timesteps changed shape, or whose timesteps went back (some above the previous call's,
below where they rise, ``BranchCalls.rising``) while none moved on, starts a new schedule inside one pipeline call (Wan
Animate's next segment, Helios' next chunk, SkyReels-V2 diffusion forcing's next long-video iteration, LTX's next
long multi-prompt window) and first resets every context's state (the record of each context's previous call too, so
the other branch's first call of the new schedule is not reset again). Per-frame or per-token timesteps (diffusion
forcing's matrix, where a frame that starts rises from the dummy 999 to the schedule's 1000 while others fall; LTX
I2V's conditioning tokens at 0) never reset within one schedule; a call at the previous call's timestep (Heun's
re-evaluation, the other branch) does not either.

A call, in a context or not, that passes an argument the family's ``cache_refused_args`` names (Sana-Video's
``controlnet_block_samples``, added between the blocks outside what the hooks skip) is refused in one line.

The rule reads only the call's arguments, which are the same on every process, so every layout names and resets the
same calls as one process. What it remembers of a run lives in a stateful diffusers hook, so it is forgotten exactly
when the cache states are (``_reset_stateful_cache``, which every stock pipeline calls when its run ends).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from diffusers.hooks.hooks import CacheContext, HookRegistry, ModelHook

from dit_sp.cache.blocks import cache_context_of, register_hook, remove_hook, set_cache_context, transformer_blocks
from dit_sp.errors import ConfigError
from dit_sp.families.family import BranchCalls

BRANCHES = ("cond", "uncond")
"""The contexts of a family's guidance calls, in the order its pipelines make them."""
_RUN_HOOK, _SCHEDULE_HOOK = "dit_sp_branch_run", "dit_sp_context_schedules"


class _Run(ModelHook):
    """What the naming remembers of the run in progress: the prompt tensors seen (by identity, in order), and the
    previous call's timestep and latents shape. Stateful, so diffusers resets it with the cache states."""

    _is_stateful = True

    def __init__(self) -> None:
        super().__init__()
        self.reset_state(None)

    def reset_state(self, module: torch.nn.Module | None) -> torch.nn.Module | None:
        self.prompts: list[torch.Tensor] = []  # kept alive for the run: an id is never reused by another tensor
        self.conditions: list[dict[str, Any]] = []  # each branch's first call's arguments but its latents and timestep
        self.timestep: float | None = None
        self.timesteps: torch.Tensor | None = None  # the previous call's timesteps, flattened (or their max: branches)
        self.shape: tuple[int, ...] | None = None
        self.others: dict[str, Any] | None = None  # a batched call's arguments but its latents (kept alive: by value)
        return module


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.forward)


def _arguments(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call of ``model`` by name (its class's ``forward``, whatever wraps the instance's)."""
    bound = dict(_signature(type(model)).bind_partial(model, *args, **kwargs).arguments)
    bound.pop(next(iter(_signature(type(model)).parameters)))  # self
    return bound


def _argument(model: torch.nn.Module, name: str, args: tuple, kwargs: dict) -> Any:
    """Argument ``name`` of a call of ``model``."""
    return kwargs[name] if name in kwargs else _arguments(model, args, kwargs).get(name)


def _branch_namer(model: torch.nn.Module, calls: Any) -> tuple[Callable[[tuple, dict], str], Callable[[], None]]:
    """``(name, undo)``: ``name(args, kwargs)`` gives a call's branch, resetting the cache states first at a new
    schedule or shape (see the module docstring); ``calls`` is the family's ``BranchCalls``."""
    run, head = _Run(), transformer_blocks(model)[0]
    register_hook(head, run, _RUN_HOOK)
    kind = type(model).__name__

    def name(args: tuple, kwargs: dict) -> str:
        prompt, timestep = (_argument(model, arg, args, kwargs) for arg in (calls.prompt, calls.timestep))
        hidden = _argument(model, "hidden_states", args, kwargs)
        # a tensor, or a tuple of them (Cosmos-Transfer2.5's (text, image context)): one object per branch for the run
        tensors = prompt if isinstance(prompt, tuple) else (prompt,)
        if not all(isinstance(t, torch.Tensor) for t in tensors) or not isinstance(timestep, torch.Tensor):
            raise ConfigError(f"step caching: {kind} names a call's guidance branch by its {calls.prompt!r} and "
                              f"{calls.timestep!r} tensors, and this call lacks one; pass both")  # fmt: skip
        t = timestep.detach().max().double().reshape(1)  # the schedule's front (per-token timesteps: its noisiest)
        shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else None
        if run.timesteps is not None and _starts_anew(t, shape, run.timesteps, run.shape, calls.rising):
            HookRegistry.check_if_exists_or_initialize(model).reset_stateful_hooks()  # `run` too
        run.timesteps, run.shape = t, shape
        for index, seen in enumerate(run.prompts):
            if seen is prompt:
                return BRANCHES[index]
        # a copy of a branch's every condition (Kandinsky 5's `.to(dtype)` of embeds in another dtype), not of its
        # prompt alone: two branches may differ in their other conditions only (pooled text, text positions)
        conditions = {
            k: v for k, v in _arguments(model, args, kwargs).items() if k not in ("hidden_states", calls.timestep)
        }
        for index, seen in enumerate(run.conditions):
            if _same(seen, conditions):
                return BRANCHES[index]
        if len(run.prompts) == len(BRANCHES):
            raise ConfigError(f"step caching: {kind} got a third {calls.prompt!r} tensor, of other values, in one "
                              "run; its guidance branches are named by their prompt tensors (cond, uncond), so a run "
                              "that replaces them (a step callback) cannot take a cache; run without one")  # fmt: skip
        run.prompts.append(prompt)
        run.conditions.append(conditions)
        return BRANCHES[len(run.prompts) - 1]

    return name, lambda: remove_hook(head, _RUN_HOOK)


def _one_branch(model: torch.nn.Module, calls: Any) -> tuple[Callable[[tuple, dict], str], Callable[[], None]]:
    """``(name, undo)`` for a family whose pipelines do not guide: ``name(args, kwargs)`` is ``"cond"``, resetting the
    cache state first at a new schedule or shape (see the module docstring); ``calls`` is the family's
    ``BranchCalls``."""
    run, head = _Run(), transformer_blocks(model)[0]
    register_hook(head, run, _RUN_HOOK)
    kind = type(model).__name__

    def name(args: tuple, kwargs: dict) -> str:
        timestep, hidden = (_argument(model, arg, args, kwargs) for arg in (calls.timestep, "hidden_states"))
        if not isinstance(timestep, torch.Tensor):
            raise ConfigError(f"step caching: {kind} tells a new schedule by its {calls.timestep!r} tensor, and this "
                              "call lacks one; pass it")  # fmt: skip
        t = timestep.detach().flatten().double().clone()
        shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else None
        # one call a step: a call at the previous call's timesteps is the next tile's, and starts anew too
        if run.timesteps is not None and _starts_anew(t, shape, run.timesteps, run.shape, calls.rising, same_step=True):
            HookRegistry.check_if_exists_or_initialize(model).reset_stateful_hooks()  # `run` too
        run.timesteps, run.shape = t, shape
        return BRANCHES[0]

    return name, lambda: remove_hook(head, _RUN_HOOK)


def _same(a: Any, b: Any) -> bool:
    """Whether two call arguments are the same: one object, or tensors (or lists, tuples, dicts of them) of equal
    values."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except Exception:  # an argument without a plain equality: not known to be the same
        return False


def _one_call_a_step(model: torch.nn.Module, timestep_arg: str,
                     latents: tuple[str, ...]) -> tuple[Callable[[tuple, dict], None], Callable]:  # fmt: skip
    """``(check, undo)``: ``check(args, kwargs)`` refuses a call at the timestep of the run's previous call (a batched
    family's calls outside a cache context share one state: one call a step) unless it re-evaluates the previous
    call's tokens, as a second-order scheduler does (Heun, KDPM2: the same arguments but the ``latents`` streams,
    those of the same shapes)."""
    run, head = _Run(), transformer_blocks(model)[0]
    register_hook(head, run, _RUN_HOOK)
    kind = type(model).__name__

    def check(args: tuple, kwargs: dict) -> None:
        bound = _arguments(model, args, kwargs)
        timestep = bound.get(timestep_arg)
        t = float(timestep.max()) if isinstance(timestep, torch.Tensor) else None
        shape = tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in (bound.get(n) for n in latents))
        others = {k: v for k, v in bound.items() if k not in latents}
        if t is not None and t == run.timestep:
            again = shape == run.shape and run.others is not None and others.keys() == run.others.keys()
            if not (again and all(_same(v, run.others[k]) for k, v in others.items())):
                raise ConfigError(f"step caching: {kind} was called twice at one timestep outside a cache context on "
                                  "other tokens (e.g. video tiles), and one cache state would serve both calls' "
                                  "different inputs; call it inside model.cache_context(name) per input, or run "
                                  "without a cache")  # fmt: skip
        run.timestep, run.shape, run.others = t, shape, others

    return check, lambda: remove_hook(head, _RUN_HOOK)


class _Schedules(ModelHook):
    """The previous call's timesteps and latents shape in each cache context the pipeline set (by name). Stateful, so
    diffusers forgets them with the cache states (a reset here too)."""

    _is_stateful = True

    def __init__(self) -> None:
        super().__init__()
        self.reset_state(None)

    def reset_state(self, module: torch.nn.Module | None) -> torch.nn.Module | None:
        self.previous: dict[str, tuple[torch.Tensor | None, tuple[int, ...] | None]] = {}
        return module


def _new_schedule_in_context(model: torch.nn.Module, calls: BranchCalls) -> tuple[Callable[[tuple, dict], bool],
                                                                                   Callable[[], None]]:  # fmt: skip
    """``(check, undo)``: ``check(args, kwargs)``, for a call inside a cache context the pipeline set, resets every
    context's cache state when the call starts a new schedule (see the module docstring) and says whether it did."""
    run, head = _Schedules(), transformer_blocks(model)[0]
    register_hook(head, run, _SCHEDULE_HOOK)
    latents = list(_signature(type(model)).parameters)[1]  # the latents: "hidden_states" or the forward's first

    def check(args: tuple, kwargs: dict) -> bool:
        context = cache_context_of(model)
        timestep = _argument(model, calls.timestep, args, kwargs)
        hidden = _argument(model, latents, args, kwargs)
        t = torch.as_tensor(timestep).detach().flatten().double().clone() if timestep is not None else None
        shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else None
        previous = run.previous.get(context.name)
        new = previous is not None and _starts_anew(t, shape, *previous, calls.rising)
        if new:
            HookRegistry.check_if_exists_or_initialize(model).reset_stateful_hooks()  # `run` and the context too
            set_cache_context(model, context)
        run.previous[context.name] = (t, shape)
        return new

    return check, lambda: remove_hook(head, _SCHEDULE_HOOK)


def _starts_anew(t: torch.Tensor | None, shape: tuple[int, ...] | None, t_before: torch.Tensor | None,
                 shape_before: tuple[int, ...] | None, rising: bool, same_step: bool = False) -> bool:  # fmt: skip
    """Whether a call (its flattened timesteps ``t``, its latents' shape) starts a new schedule after the previous call
    of its context: the latents or timesteps changed shape, or a timestep went back (up; down where they rise) and
    none moved on (a new per-frame schedule starts all frames back; within one, some frame always moves on). With
    ``same_step``, a call none of whose timesteps moved on starts anew even at the previous call's timesteps (one
    call a step and no guidance branches: Kandinsky 6 SR's next tile). The one rule of every call's naming here."""
    if shape != shape_before or (t is None) != (t_before is None):
        return True
    if t is None or t_before is None:
        return False
    if t.shape != t_before.shape:
        return True
    back, on = (t < t_before, t > t_before) if rising else (t > t_before, t < t_before)
    return not bool(on.any()) and (same_step or bool(back.any()))


def context_for_every_call(model: torch.nn.Module, family: Any) -> Callable[[], None]:
    """Give each call of ``model`` made outside a cache context the context of the family's rule (the module
    docstring), or refuse it. Returns the undo."""
    undo: list[Callable[[], None]] = []
    name = None
    if family.cfg_mode != "batched" and family.cache_branches is not None:
        namer = _one_branch if family.cache_branches.prompt is None else _branch_namer
        name, forget = namer(model, family.cache_branches)
        undo.append(forget)
    if family.cfg_mode == "batched":
        # the streams a second-order scheduler's re-evaluation changes: the video, and the blocks' other generated
        # stream where the family names it (LTX-2's audio_hidden_states), not the text
        named = (name for outputs in family.block_outputs.values() for name in outputs[2:4])
        latents = tuple(dict.fromkeys(("hidden_states", *(n for n in named if n != "encoder_hidden_states"))))
        one_call, forget = _one_call_a_step(model, (family.cache_branches or BranchCalls()).timestep, latents)
        undo.append(forget)
    in_context, forget = _new_schedule_in_context(model, family.cache_branches or BranchCalls())
    undo.append(forget)
    given = []  # the context this hook set for the call in progress (the model's own hooks: one model, one call)

    def enter(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        for arg, why in family.cache_refused_args.items():  # in a cache context or not
            if _argument(module, arg, args, kwargs) is not None:
                raise ConfigError(f"step caching: {type(module).__name__} was called with {arg!r}, which a cached call "
                                  f"cannot take ({why}); run without the cache")  # fmt: skip
        if cache_context_of(module) is not None:
            in_context(args, kwargs)
            return
        if family.cfg_mode == "batched":
            one_call(args, kwargs)
            context = "cond_uncond"
        elif name is not None:
            context = name(args, kwargs)
        else:
            raise ConfigError(f"step caching: {type(module).__name__} was called outside a cache context, so its "
                              "guidance branches could not be kept apart; call it inside model.cache_context(name) "
                              "(diffusers' pipelines of the family do), or run without a cache")  # fmt: skip
        set_cache_context(module, CacheContext(context))
        given.append(True)

    def leave(module: torch.nn.Module, args: tuple, output: Any) -> None:
        if given:
            set_cache_context(module, None)
            given.clear()

    # always_call: a call that raises leaves no context behind (the next call outside one would silently reuse it);
    # prepend: the arguments as the caller passed them, before any hook of parallelize's replaces one
    leaves = model.register_forward_hook(leave, always_call=True)
    handles = [model.register_forward_pre_hook(enter, with_kwargs=True, prepend=True), leaves]
    undo.extend(handle.remove for handle in handles)
    return lambda: [fn() for fn in undo]
