"""jax_autotune: a matmul autotuner for JAX.

    >>> import jax, jax_autotune as jat
    >>> jax.jit(jat.autotune(train_step))               # every matmul inside is tuned
    >>> jax.jit(jat.matmul)(x, w)                       # jnp.matmul semantics, tuned kernel
    >>> jat.ragged_dot(x, experts, group_sizes)          # lax.ragged_dot, tuned (MoE)
    >>> jat.warmup([(1024, 1024, 1024)], dtype="bfloat16")
    >>> jat.export(f, x, w).serialize()                  # a jax.export artifact (serving)

Everything public is listed in ``__all__``; the subpackages (``tuning``, ``kernels``,
``tables``, ``cli``) are internal. ``jax_autotune.checkpoint`` (orbax items) loads on
first use, so orbax stays optional.

Importing the package is light, so that the command line starts without jax: the public
names (``_public``) load on the first use of one, or at once when jax is already imported
(``import jax, jax_autotune``), which costs little then. Neither changes anything in JAX:
the tuner's first use points JAX's compilation cache beside the store (``registry``).
"""

import logging
import sys
import types

import jax_autotune.config as config
from jax_autotune._version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())  # tuning's records: tuning/progress.py

__all__ = [
    "AttentionDecision", "AttentionKey", "CandidateResult", "Decision", "Kind", "Layout", "Level", "MatmulKey", "MatmulProblem",
    "Precision", "ProgramCheck", "Scale", "TuneTable", "WarmupReport", "__version__", "autotune",
    "config", "deserialize", "dot_general", "export", "export_allowing", "export_disabled_checks",
    "key_for", "load_table", "matmul", "native_targets", "ragged_dot", "reset_stats", "stats", "table", "warmup",
    # jax_autotune.errors: two bases, then every error and warning (and two earlier names)
    "JaxAutotuneError", "JaxAutotuneWarning", "ConfigError", "KeyNotTunedError", "TuneTableError",
    "ShardKernelError", "NotARegularFileError", "ConfigWarning", "StoreWarning", "ConsensusWarning",
    "DecisionLogWarning", "NativeKernelsWarning", "TuneTableWarning", "NoTunedMatmulWarning",
    "JaxAutotuneStoreWarning", "JaxAutotuneConsensusWarning",
]
_LOADED_HERE = {"__version__", "config"}


def _load_public() -> None:
    from jax_autotune import _public
    for name in set(__all__) - _LOADED_HERE:
        globals()[name] = getattr(_public, name)


def __getattr__(name: str):
    if name in __all__:
        _load_public()
        return globals()[name]
    # ``jat.checkpoint`` without importing orbax at ``import jax_autotune``
    if name == "checkpoint":
        import importlib
        return importlib.import_module("jax_autotune.checkpoint")
    raise AttributeError(f"module 'jax_autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Importing the submodules ``warmup`` and ``autotune`` must not hide the functions of
    those names: the package attribute stays the function (as it was before lazy loading)."""

    def __setattr__(self, name: str, value) -> None:
        if name in __all__ and name not in _LOADED_HERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
if "jax" in sys.modules:
    _load_public()
