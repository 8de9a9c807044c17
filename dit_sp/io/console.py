"""A console that speaks once for the whole world: what every rank's worker entry (``generate``'s setup, the
trainer's world) calls once its layout is known.

``quiet_followers(leader)``: every rank runs the same code, so each would draw the same progress bars and
print the same library warnings; only the console leader (rank 0: the sample leader that writes the video, or
training's rank 0) keeps them, each warning once. The others ignore Python ``warnings`` (torch's,
diffusers', ...), lower the diffusers, transformers and huggingface_hub loggers to errors, and turn those
libraries' progress bars off. Errors are never hidden: an error on any rank still reaches the launcher with
its traceback.

``plain_tracebacks()``: ``torch.distributed.init_process_group`` wraps ``sys.excepthook`` so that every line
of an uncaught traceback starts with ``[rankN]:`` (useful when ranks interleave). torch has no setting for
it; in a world of one process there is nothing to tell apart, so the hook from before the world existed is
put back.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


LIBRARIES = ("diffusers", "transformers", "huggingface_hub")
"""The libraries whose loggers and progress bars the followers silence."""


def quiet_followers(leader: bool) -> None:
    """On a rank other than the console leader: no Python warnings, library loggers at ERROR, no library
    progress bars (the leader's console is left as it is). Changes this process's global state, as a worker
    of a run owns its process. The leader prints each warning (category and text) once: Python's
    default would print one again whenever a library changes the warning filters (``catch_warnings``),
    e.g. every step."""
    if leader:
        if not getattr(warnings.showwarning, "once_per_text", False):
            warnings.showwarning = _once_per_text(warnings.showwarning)
        return
    warnings.filterwarnings("ignore")
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)
    with suppress(ImportError):
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.set_verbosity_error()
        diffusers_logging.disable_progress_bar()
    with suppress(ImportError):
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    with suppress(ImportError):
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def _once_per_text(show: Callable[..., None]) -> Callable[..., None]:
    """``warnings.showwarning`` (the documented hook) that passes each category and text on once."""
    shown: set[tuple[type, str]] = set()

    def showwarning(message, category, filename, lineno, file=None, line=None) -> None:
        if (category, str(message)) not in shown:
            shown.add((category, str(message)))
            show(message, category, filename, lineno, file, line)

    showwarning.once_per_text = True
    return showwarning


@contextmanager
def plain_tracebacks() -> Iterator[None]:
    """Around the call that creates the process group: afterwards, in a world of one process, uncaught
    tracebacks print as Python prints them (no ``[rank0]:`` on every line); several ranks keep torch's prefix."""
    import torch.distributed as dist

    hook = sys.excepthook
    try:
        yield
    finally:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            sys.excepthook = hook
