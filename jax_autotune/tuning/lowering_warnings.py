"""Warnings JAX raises while lowering our own kernels, kept from the user.

A kernel family registers the messages its lowering triggers in JAX and that say
nothing about the user's program (``silence``: the Pallas Triton backend's
deprecation, ``kernels.gpu.triton_backend``); every place that lowers a candidate (the
product's lowering rule, the tuner's compiles, the export check) lowers it inside
``quiet()``. Nothing else is filtered, and nothing outside ``quiet()``: a user's own
Pallas Triton kernel still gets JAX's warning.

    >>> silence("The Pallas Triton backend is deprecated")
    >>> with quiet():
    ...     lowered = jax.jit(kernel).lower(lhs, rhs)     # no deprecation warning

``warnings.catch_warnings`` swaps the process's filter list, so the swaps are
serialised by one lock, held while one candidate's kernel lowers (milliseconds;
compiles run outside it). A kernel lowered inside must not wait on another thread that
lowers: none of ours binds a tuned primitive.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from typing import Iterator

_messages: list[str] = []  # regexes, matched at the start of the warning's message
_lock = threading.RLock()


def silence(message_start: str) -> None:
    """Keep DeprecationWarnings whose message starts with ``message_start`` inside ``quiet()``."""
    pattern = re.escape(message_start)
    with _lock:
        if pattern not in _messages:
            _messages.append(pattern)


def silenced() -> tuple[str, ...]:
    """The registered message patterns."""
    with _lock:
        return tuple(_messages)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Lower inside this: the registered deprecations of our kernels are not shown."""
    with _lock:
        if not _messages:
            yield
            return
        with warnings.catch_warnings():
            for pattern in _messages:
                warnings.filterwarnings("ignore", message=pattern, category=DeprecationWarning)
            yield


__all__ = ["silence", "silenced", "quiet"]
