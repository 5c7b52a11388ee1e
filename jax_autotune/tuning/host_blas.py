"""Internal: numpy's OpenBLAS held to one thread while a host clock times candidates.

After a threaded call, OpenBLAS's worker threads keep spinning for a while before they
sleep. On a CPU the float64 reference and the correctness check (numpy, so OpenBLAS) run
right before candidates are timed, and those spinning threads took cores from the samples
that followed (``benchmarks/host_blas_probe.py``). Inside ``single_threaded()``
numpy's OpenBLAS works on the calling thread alone, so nothing is left spinning; the
thread count it had is restored when the last such block (of any thread) ends. While a
block is open, numpy in every thread of the process runs its BLAS single-threaded.

Where numpy's BLAS is not an OpenBLAS mapped into this process (another BLAS, or a
system without ``/proc/self/maps``) the block changes nothing.

    >>> with host_blas.single_threaded():
    ...     ref = reference(problem, lhs, rhs)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading

# OpenBLAS's thread-count functions under the names its builds export: numpy's wheels
# ship scipy-openblas (prefix ``scipy_``, suffix ``64_`` for 64-bit integers)
_PREFIXES = ("scipy_", "")
_SUFFIXES = ("64_", "")

_lock = threading.Lock()
_depth = 0
_restore: int | None = None  # the thread count to give back when the last block ends


class _Library:
    """OpenBLAS's ``get_num_threads`` and ``set_num_threads`` of one loaded library."""

    def __init__(self, get, set_):
        self.get, self.set = get, set_


def _mapped_openblas(maps: str = "/proc/self/maps") -> list[str]:
    """The paths of the OpenBLAS libraries mapped into this process, in order of appearance."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            paths = (line.split(maxsplit=5)[-1].strip() for line in lines if "openblas" in line.lower())
            return list(dict.fromkeys(p for p in paths if "openblas" in os.path.basename(p).lower()))
    except OSError:
        return []


def _functions(path: str) -> _Library | None:
    """The thread-count functions of the library at ``path``, or None when it has none."""
    try:
        library = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    for prefix in _PREFIXES:
        for suffix in _SUFFIXES:
            get = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
            set_ = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return _Library(get, set_)
    return None


@functools.lru_cache(maxsize=1)
def _numpy_openblas() -> _Library | None:
    """numpy's OpenBLAS, found once (numpy loads it on import); None where there is none."""
    import numpy  # noqa: F401 - maps numpy's BLAS into the process

    for path in _mapped_openblas():
        found = _functions(path)
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def single_threaded():
    """numpy's OpenBLAS on one thread inside the block (see the module docstring)."""
    global _depth, _restore
    found = _numpy_openblas()
    if found is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _restore = found.get()
            if _restore > 1:
                found.set(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore is not None and _restore > 1:
                found.set(_restore)


__all__ = ["single_threaded"]
