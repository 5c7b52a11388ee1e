"""JAX's persistent compilation cache beside the tune store, so a warm process compiles nothing.

The tune store remembers each key's decision; compiling the winner (on GPUs, XLA's dot
runs XLA's own GEMM autotuner while it compiles) would still cost up to a second per key
in every new process. With the ``compilation_cache`` setting on (the default) and the
disk store on, the tuner points JAX's persistent compilation cache at
``<cache_dir>/jax_compilation_cache`` the first time it is used, with no minimum compile
time or entry size, so matmul executables are kept, and a size cap (``MAX_BYTES``, JAX
evicting the least recently used entries; it needs ``filelock``) unless the user set one. It never overrides a
cache the user configured (``JAX_COMPILATION_CACHE_DIR`` or ``jax_compilation_cache_dir``)
nor one the user turned off (``jax_enable_compilation_cache=False``); ``disable`` puts back
every JAX setting ``enable`` changed.

A changed decision can never be served a stale executable: the lowering rule emits the
winner before JAX computes the cache key from the lowered module, so another winner is
another key.

    >>> from jax_autotune.tuning.compile_cache import enable, directory_for
    >>> enable(directory_for("/home/me/.cache/jax_autotune"))   # the path now in use, or None
    >>> counter = CompileCounter(); f(x); counter.compiles        # XLA compiles, cache hits not
    0
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

DIRECTORY_NAME = "jax_compilation_cache"
MAX_BYTES = 4 * 2**30  # JAX's cap on the folder (jax_compilation_cache_max_size) where the user set none
_NO_CAP = -1  # JAX's default: unbounded

_lock = threading.Lock()
_ours: str | None = None  # the directory this package pointed JAX at, if any
_replaced: dict = {}  # the JAX settings enable() changed, with the values they had before


def directory_for(cache_dir: str | os.PathLike) -> str:
    """Where the compilation cache lives for a tune store directory."""
    return os.path.join(os.fspath(cache_dir), DIRECTORY_NAME)


def user_configured() -> str | None:
    """Why JAX's cache is the user's to manage ('dir ...' or 'disabled'), or None."""
    configured = jax.config.jax_compilation_cache_dir
    if configured and configured != _ours:
        return f"dir {configured}"
    if not jax.config.jax_enable_compilation_cache:
        return "disabled"
    return None


def enable(directory: str) -> str | None:
    """Point JAX's persistent compilation cache at ``directory`` unless the user manages
    it; returns the directory JAX now uses for it (the user's, ours, or None when off)."""
    global _ours
    with _lock:
        if user_configured() is not None:
            return jax.config.jax_compilation_cache_dir
        if _ours == directory:
            return directory
        switching = _ours is not None
        if not switching:
            wanted = {"jax_persistent_cache_min_compile_time_secs": 0.0,
                      "jax_persistent_cache_min_entry_size_bytes": -1}
            # JAX's eviction needs filelock (a dependency of ours); without it a cap breaks the cache
            if (getattr(jax.config, "jax_compilation_cache_max_size", None) == _NO_CAP
                    and importlib.util.find_spec("filelock") is not None):
                wanted["jax_compilation_cache_max_size"] = MAX_BYTES
            for name, value in wanted.items():
                _replaced[name] = getattr(jax.config, name)
                jax.config.update(name, value)
        if getattr(jax.config, "jax_compilation_cache_max_size", _NO_CAP) != _NO_CAP:
            add_missing_access_times(directory)
        jax_cache.set_cache_dir(directory)
        if switching:  # JAX keeps the first directory's cache object until reset
            jax_cache.reset_cache()
        _ours = directory
        return directory


def add_missing_access_times(directory: str) -> int:
    """Give every executable in ``directory`` without one the access-time file JAX's
    size cap reads (``<entry>-atime``: nanoseconds, 8 bytes little-endian), dated by the
    executable's own mtime; how many it added. Entries written with no cap (an earlier
    version of this package, or the cap off) have none, and JAX's eviction then fails on
    every write with a warning.

        >>> add_missing_access_times(directory_for(config.get("cache_dir")))
        41
    """
    added = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    names = {entry.name for entry in entries}
    for entry in entries:
        stem = entry.name[:-len("-cache")]
        if (entry.name.endswith("-cache") and is_entry(entry.name) and f"{stem}-atime" not in names
                and entry.is_file(follow_symlinks=False)):
            try:
                stamp = entry.stat(follow_symlinks=False).st_mtime_ns.to_bytes(8, "little")
                with open(os.path.join(directory, f"{stem}-atime"), "xb") as out:
                    out.write(stamp)
                added += 1
            except OSError:  # raced by another process, or not writable: JAX warns, as before
                pass
    return added


def disable() -> None:
    """Stop using the cache this package enabled and put back the JAX settings it changed
    (a user's own cache is left alone)."""
    global _ours
    with _lock:
        if _ours is not None and jax.config.jax_compilation_cache_dir == _ours:
            jax.config.update("jax_compilation_cache_dir", None)
            for name, value in _replaced.items():
                jax.config.update(name, value)
            jax_cache.reset_cache()
        _replaced.clear()
        _ours = None


# JAX's entries (jax._src.lru_cache): "<module name>-<sha256 hex>" + "-cache" (the
# executable) or "-atime" (its last use, when eviction is on); older jax: no suffix
_ENTRY = re.compile(r".+-[0-9a-f]{64}(-cache|-atime)?")


def is_entry(name: str) -> bool:
    """Whether a file name is one JAX's persistent compilation cache writes.

        >>> is_entry("jit_matmul-" + "0" * 64 + "-cache"), is_entry("thesis.tex")
        (True, False)
    """
    return _ENTRY.fullmatch(name) is not None


def clear(directory: str) -> int:
    """Delete JAX's cache entries in ``directory`` (this package's folder for a store, never
    a folder the user gave JAX); returns how many executables were deleted. Other files,
    links and folders in it are left alone, and a ``directory`` that is itself a symbolic
    link is refused: nothing is ever deleted outside the folder.

        >>> clear(directory_for(config.get("cache_dir")))
        41
    """
    if os.path.basename(os.path.normpath(directory)) != DIRECTORY_NAME:
        raise ValueError(f"directory: expected a {DIRECTORY_NAME!r} folder of a tune store, "
                         f"got {directory!r}")
    configured = jax.config.jax_compilation_cache_dir
    if configured and os.path.abspath(configured) == os.path.abspath(directory) and configured != _ours:
        raise ValueError(f"{directory} is JAX's cache as the user configured it "
                         f"(jax_compilation_cache_dir); clear it yourself")
    try:  # O_NOFOLLOW: the folder itself may not be a link (checked and opened at once)
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    except OSError:
        if os.path.islink(directory):
            raise ValueError(f"{directory} is a symbolic link (to {os.readlink(directory)}); "
                             f"nothing deleted: remove the link, or clear its target "
                             f"yourself") from None
        raise
    deleted = 0
    try:
        for entry in os.scandir(folder):
            if is_entry(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.name, dir_fd=folder)
                deleted += not entry.name.endswith("-atime")
    finally:
        os.close(folder)
    return deleted


class CompileCounter:
    """The XLA compiles a process runs from now on, and the executables the persistent
    cache served instead: ``compiles``, ``hits``, ``requests`` (both; every request fires
    JAX's backend-compile event, hit or not)."""

    REQUEST = "/jax/core/compile/backend_compile_duration"
    HIT = "/jax/compilation_cache/cache_hits"

    def __init__(self):
        self.requests = self.hits = 0
        jax.monitoring.register_event_duration_secs_listener(self._count_request)
        jax.monitoring.register_event_listener(self._count_hit)

    def _count_request(self, event, *_, **__):
        if event == self.REQUEST:
            self.requests += 1

    def _count_hit(self, event, **_):
        if event == self.HIT:
            self.hits += 1

    @property
    def compiles(self) -> int:
        return self.requests - self.hits

    def to_json(self) -> dict:
        return {"requests": self.requests, "hits": self.hits, "compiles": self.compiles}
