"""Where the CUDA libraries the native GPU kernels call are found, and their FFI targets'
one registration.

No CUDA library is linked into the native module: each is loaded at run time, from the
copy XLA's CUDA plugin already mapped into this process, else from an installed
``nvidia-*`` wheel in site-packages (never one found through ``sys.path``, which holds a
script's folder or the working directory).

    >>> cuda_libraries.sources("libcublasLt.so")
    [('/venv/.../nvidia/cu13/lib/libcublasLt.so.13', 'already mapped by XLA')]
    >>> cuda_libraries.register_targets()      # '' once every CUDA FFI target is registered
    ''
"""

from __future__ import annotations

import glob
import os
import site
import sysconfig
import threading
from typing import Callable

import jax

MAPPED, WHEEL = "already mapped by XLA", "an nvidia wheel in site-packages"

_lock = threading.Lock()
_registered: str | None = None  # None: not tried yet; "": registered; else why not


def site_packages() -> list[str]:
    """The folders installed packages live in (the interpreter's and the user's)."""
    roots = [*site.getsitepackages(), *(
        [site.getusersitepackages()] if site.ENABLE_USER_SITE else []),
        *(sysconfig.get_paths()[name] for name in ("purelib", "platlib"))]
    return list(dict.fromkeys(os.path.realpath(root) for root in roots))


def sources(name: str, wheels: bool = True) -> list[tuple[str, str]]:
    """(path, origin) of each copy of the library ``name`` (``"libcublasLt.so"``) to try,
    best first: the one already mapped into this process, then (``wheels``) those of the
    ``nvidia-*`` wheels in site-packages. Nothing is looked up through ``sys.path`` or the
    loader's search path, so a library in the working directory is never loaded."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if f"/{name}" in path:
                    found.setdefault(path, MAPPED)
    except OSError:
        pass
    for root in site_packages() if wheels else ():
        for path in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", f"{name}*")), reverse=True):
            found.setdefault(path, WHEEL)
    return list(found.items())


class LoadedOnce:
    """A library loaded by ``load()`` ('' or why not) the first time it is asked for,
    once per process.

        >>> cublaslt_loader = LoadedOnce(load_cublaslt)
        >>> cublaslt_loader.available(), cublaslt_loader.error()
        (False, 'no cuBLASLt library is mapped into this process or installed in site-packages')
    """

    def __init__(self, load: Callable[[], str]):
        self._load = load
        self._lock = threading.Lock()
        self._error: str | None = None  # None: not tried yet; "": loaded

    def available(self) -> bool:
        with self._lock:
            if self._error is None:
                self._error = self._load()
            return self._error == ""

    def error(self) -> str:
        """'' when loaded, else why not."""
        self.available()
        return self._error or ""

    def describe(self, loaded: Callable[[], str]) -> str:
        """``loaded()`` (which library, where from) when it loads, else why not; loads it
        only where a CUDA device exists."""
        if not any(d.platform == "gpu" for d in jax.devices()):
            return "not loaded: no CUDA device in this process"
        return loaded() if self.available() else f"not loaded: {self.error()}"


def register_targets() -> str:
    """Registers every CUDA FFI target of the native module for the CUDA platform, once
    per process; '' when they are, else why not."""
    global _registered
    with _lock:
        if _registered is None:
            try:
                import jax_autotune._native as _native
                for name, capsule in _native.cuda_registrations().items():
                    jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
                _registered = ""
            except Exception as err:  # noqa: BLE001 - no native module, or no CUDA platform in this jax
                _registered = f"the FFI targets could not be registered for CUDA: {err}"
        return _registered


__all__ = ["MAPPED", "WHEEL", "LoadedOnce", "register_targets", "site_packages", "sources"]
