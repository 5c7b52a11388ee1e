"""What a tuning thread carries over from the thread that asked for the tuning.

``jax.enable_x64(...)`` sets jax's x64 flag for the calling thread only; a worker thread
starts with the process default, so without this a float64 key asked for under the
context manager would be compiled and timed on float32 stand-ins.

    >>> with jax.enable_x64(True):
    ...     future = pool.submit(carrying_x64(compile_candidate), candidate, problem, args)
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import jax

F = TypeVar("F", bound=Callable)


def carrying_x64(fn: F) -> F:
    """``fn`` run, in whatever thread, with the x64 setting of the thread calling this."""
    x64 = bool(jax.config.jax_enable_x64)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with jax.enable_x64(x64):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


__all__ = ["carrying_x64"]
