"""Pallas's Triton backend, decided at one place: whether this jax ships it, and its
deprecation kept from users.

JAX deprecated the backend in 0.11.0 ("The Pallas Triton backend is deprecated and will
be removed in a future JAX version..."; the warning is raised each time a Triton
``pallas_call`` lowers). The Triton families (``kernels.gpu.candidates.TRITON_FAMILIES``)
join the GPU candidate set only where ``SHIPPED``: the module imports and JAX has not
turned the deprecation into an error. Their kernels lower inside
``tuning.lowering_warnings.quiet()``, which this module registers the warning with, so a
user never sees it for our kernels (a user's own Triton kernels still warn).

    >>> from jax_autotune.kernels.gpu import triton_backend
    >>> triton_backend.SHIPPED           # jax 0.10.2 and 0.11.2
    True
    >>> triton_backend.pl_triton.CompilerParams
"""

from __future__ import annotations

from jax_autotune.tuning import lowering_warnings

DEPRECATION = "The Pallas Triton backend is deprecated"
_DEPRECATION_ID = "jax-pallas-triton"


def _accelerated() -> bool:
    """Whether JAX raises instead of warning when the backend lowers."""
    try:
        from jax._src import deprecations
        return bool(deprecations.is_accelerated(_DEPRECATION_ID))
    except Exception:  # noqa: BLE001 - jax before the deprecation, or a renamed internal
        return False


try:
    from jax.experimental.pallas import triton as pl_triton
    SHIPPED = not _accelerated()
    WHY_NOT = "" if SHIPPED else "this jax raises where the Pallas Triton backend lowers"
except Exception as err:  # noqa: BLE001 - any import failure: the backend is gone
    pl_triton = None
    SHIPPED = False
    WHY_NOT = f"jax.experimental.pallas.triton does not import: {type(err).__name__}: {err}"

lowering_warnings.silence(DEPRECATION)


def compiler_params(**kwargs):
    """``pl_triton.CompilerParams(**kwargs)`` (older jax: ``TritonCompilerParams``)."""
    if pl_triton is None:
        raise RuntimeError(f"the Pallas Triton backend is unavailable: {WHY_NOT}")
    cls = getattr(pl_triton, "CompilerParams", None) or getattr(pl_triton, "TritonCompilerParams")
    return cls(**kwargs)


__all__ = ["SHIPPED", "WHY_NOT", "DEPRECATION", "pl_triton", "compiler_params"]
