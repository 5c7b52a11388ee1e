"""Serving through ``jax.export``: artifacts of tuned functions.

Under ``jax.export`` each matmul emits the fastest candidate jax.export takes as is (XLA's
dot and its variants; Mosaic GPU kernels), ranked by the key's tuned results, so a plain
``jax.export.export(jax.jit(f))(x)`` serializes and the artifact needs only jax where it
runs. The opt-in keeps the fastest kernels even where they are custom calls jax.export
gives no compatibility guarantee for (this project's FFI kernels on CPUs; Pallas Triton
on GPUs; cuBLASLt, ``allow_targets=["jax_autotune_cublaslt"]``): such an artifact runs
only with the same jax_autotune (and jax) installed where it runs, its targets registered
(``deserialize`` does that), on a CPU with the ISA it was tuned on.

    >>> exported = jat.export(f, x, w)                       # export-safe kernels
    >>> blob = exported.serialize()                          # needs the flatbuffers package
    >>> jat.deserialize(blob).call(x, w)
    >>> fastest = jat.export(f, x, w, native=True)           # the project's FFI kernels too

With ``jax.export`` itself (or a tool built on it), the same opt-in is the context plus
the matching disabled checks:

    >>> with jat.export_allowing():
    ...     exported = jax.export.export(jax.jit(f), disabled_checks=jat.export_disabled_checks())(x, w)
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax

from jax_autotune.kernels.gpu import cublas_grouped, cublaslt
from jax_autotune.registry import native_module
from jax_autotune.tuning import export_safety


def native_targets() -> tuple[str, ...]:
    """The FFI custom-call targets of the native CPU kernels, registered with XLA in this
    process; () where the extension is not built.

        >>> jat.native_targets()
        ('jax_autotune_noop', 'jax_autotune_small', 'jax_autotune_gemv', 'jax_autotune_gemm', ...)
    """
    native = native_module("cpu")
    return native.register_targets() if native is not None else ()


def _targets(targets: Iterable[str] | None) -> tuple[str, ...]:
    if targets is None:
        return native_targets()
    if isinstance(targets, str):
        raise TypeError(f"targets: expected an iterable of target names, got the string {targets!r}")
    return tuple(targets)


def export_disabled_checks(targets: Iterable[str] | None = None) -> list[jax.export.DisabledSafetyCheck]:
    """``jax.export`` disabled checks for ``targets`` (default: ``native_targets()``).

        >>> jax.export.export(jitted, disabled_checks=jat.export_disabled_checks())(x)
    """
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _targets(targets)]


@contextlib.contextmanager
def export_allowing(targets: Iterable[str] | None = None) -> Iterator[frozenset[str]]:
    """Within the block, an export emits the fastest kernel whose custom-call targets are
    in jax's allow-list or in ``targets`` (default: ``native_targets()``). Pass the same
    targets to ``jax.export`` as ``export_disabled_checks(targets)``.

        >>> with jat.export_allowing():
        ...     jax.export.export(jitted, disabled_checks=jat.export_disabled_checks())(x)
    """
    with export_safety.allowing(_targets(targets)) as allowed:
        yield allowed


def export(fn: Callable, *args: Any, platforms: Sequence[str] | None = None, native: bool = False,
           allow_targets: Iterable[str] = (), **kwargs: Any) -> jax.export.Exported:
    """``jax.export.export(jax.jit(fn), platforms=platforms)(*args, **kwargs)`` of a function
    using jax_autotune's matmuls (``fn`` may already be jitted).

    By default the artifact holds export-safe kernels only. ``native=True`` keeps the
    fastest native CPU kernels; ``allow_targets`` keeps kernels with those custom-call
    targets too (e.g. Pallas Triton's on GPUs). Either way jax.export gets the matching
    disabled checks, and the artifact then needs jax_autotune installed where it runs.

        >>> exported = jat.export(f, x, w, native=True)
        >>> jat.deserialize(exported.serialize()).call(x, w)
    """
    extra = _targets(allow_targets)
    targets = (*native_targets(), *extra) if native else extra
    jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
    with export_allowing(targets):
        return jax.export.export(jitted, platforms=platforms,
                                 disabled_checks=export_disabled_checks(targets))(*args, **kwargs)


def deserialize(blob: bytes | bytearray) -> jax.export.Exported:
    """``jax.export.deserialize(blob)`` after registering the native kernels' targets, so an
    artifact exported with ``native=True`` runs in a fresh process.

        >>> jat.deserialize(open("model.jax", "rb").read()).call(x)
    """
    native_targets()
    if any(d.platform == "gpu" for d in jax.devices()):  # the CUDA targets, kept with allow_targets
        cublaslt.available()  # loads cuBLASLt and registers every CUDA target
        cublas_grouped.available()  # loads cuBLAS for jax_autotune_cublas_grouped
    return jax.export.deserialize(bytearray(blob))
