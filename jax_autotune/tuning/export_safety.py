"""Internal: export safety, i.e. which custom-call targets a candidate emits and whether
jax.export takes them.

jax.export serializes a custom call only when its target has a compatibility guarantee
(XLA's own ops are always fine; Mosaic GPU's ``mosaic_gpu_v2`` is on jax's list, the
Pallas Triton call and this project's FFI targets are not). A candidate's targets come
from what it emits: it is lowered alone for the problem (no compile, a few milliseconds)
and its StableHLO walked, once per (candidate, platform, problem), and only when asked.

    >>> from jax_autotune.tuning import export_safety
    >>> safety = export_safety.check(candidate, problem, "cpu")
    >>> safety.targets, safety.unsafe, safety.safe
    (frozenset({'jax_autotune_gemm'}), frozenset({'jax_autotune_gemm'}), False)
    >>> with export_safety.allowing({"jax_autotune_gemm"}):
    ...     safety.allowed(export_safety.allowed_targets())
    True

``allowing`` is the opt-in a lowering reads: targets the caller also passes to
``jax.export`` as disabled checks, so they may stay in an artifact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterable, Iterator

import jax
import numpy as np
from jax.extend.mlir import ir

from jax_autotune.tuning import lowering_warnings
from jax_autotune.tuning.module_ops import ops

try:  # private: jax.export's allow-list lives here (jax 0.10 and 0.11)
    from jax._src.export import _export as _jax_export
except ImportError:  # pragma: no cover - a jax that moved it: ask jax.export itself
    _jax_export = None

# the start of jax.export's error for a custom call it does not take
REJECTED = "custom calls whose targets have no compatibility guarantees"


def stable_targets() -> frozenset[str] | None:
    """jax.export's allow-list of custom-call targets; None where this jax hides it.

        >>> "mosaic_gpu_v2" in stable_targets()
        True
    """
    found = getattr(_jax_export, "_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE", None)
    return None if found is None else frozenset(found)


def module_targets(module: ir.Module) -> frozenset[str]:
    """``call_target_name`` of every ``stablehlo.custom_call`` in ``module``, nested regions
    (case, while, called functions) included."""
    return frozenset(ir.StringAttr(op.attributes["call_target_name"]).value
                     for op in ops(module) if op.name == "stablehlo.custom_call")


@dataclasses.dataclass(frozen=True)
class ExportSafety:
    """What a candidate emits for one problem and platform.

    ``unsafe``: the targets jax.export refuses without a disabled check; ``error``: why the
    candidate could not be lowered alone (it is then never chosen for an export).
    """

    targets: frozenset[str]
    unsafe: frozenset[str]
    error: str = ""

    @property
    def safe(self) -> bool:
        return not self.error and not self.unsafe

    def allowed(self, extra: Iterable[str] = ()) -> bool:
        """Safe once the targets in ``extra`` are allowed too."""
        return not self.error and self.unsafe <= frozenset(extra)


_cache: dict[tuple[Any, str, Any], ExportSafety] = {}
_cache_lock = threading.Lock()
_checks = 0  # lowerings done: tests check one per (candidate, platform, problem)


def checks_run() -> int:
    """How many candidates this process has lowered alone to check them."""
    return _checks


def check(candidate, problem, platform: str) -> ExportSafety:
    """The export safety of ``candidate`` (``fn(lhs, rhs, problem)``) for ``problem`` lowered
    for ``platform`` ('cpu', 'cuda', 'rocm'); computed once, then cached.

        >>> check(XLA_DOT, problem, "cpu").safe
        True
    """
    global _checks
    cache_key = (candidate, platform, problem)
    with _cache_lock:
        if cache_key in _cache:
            return _cache[cache_key]
    fn = candidate.bound(problem)
    operands = tuple(jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype in problem.input_specs())
    try:
        with lowering_warnings.quiet():
            lowered = jax.jit(fn).trace(*operands).lower(lowering_platforms=(platform,))
        targets = module_targets(lowered.compiler_ir("stablehlo"))
        stable = stable_targets()
        unsafe = targets - stable if stable is not None else _refused(fn, operands, platform, targets)
        safety = ExportSafety(frozenset(targets), frozenset(unsafe))
    except Exception as err:  # noqa: BLE001 - a candidate that cannot lower is never exported
        safety = ExportSafety(frozenset(), frozenset(), error=f"{type(err).__name__}: {err}"[:300])
    with _cache_lock:
        _checks += 1
        return _cache.setdefault(cache_key, safety)


def _refused(fn, operands, platform: str, targets: frozenset[str]) -> frozenset[str]:
    """Without the allow-list: jax.export of the candidate alone decides (all its targets
    count as unsafe when it refuses)."""
    if not targets:
        return frozenset()
    try:
        with lowering_warnings.quiet():
            jax.export.export(jax.jit(fn), platforms=(platform,))(*operands)
    except ValueError as err:
        if REJECTED in str(err):
            return targets
        raise
    return frozenset()


# ---------------------------------------------------------------- the opt-in

# A JAX setting of our own (jax.make_user_context): jax's trace, lowering and compile caches are keyed by its value, so a
# function exported before (or after) the opt-in is lowered again, never served stale.
_allowed = jax.make_user_context(default_value=frozenset())


def allowed_targets() -> frozenset[str]:
    """The targets an export in this thread may keep beyond jax's allow-list."""
    return _allowed.value


@contextlib.contextmanager
def allowing(targets: Iterable[str]) -> Iterator[frozenset[str]]:
    """Within the block (this thread), exports may keep ``targets``, added to any allowed
    outside it."""
    if isinstance(targets, str):
        raise TypeError(f"targets: expected an iterable of target names, got the string {targets!r}")
    combined = allowed_targets() | frozenset(targets)
    with _allowed(combined):
        yield combined
