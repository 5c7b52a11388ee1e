"""jax_autotune: a matmul autotuner for JAX.

    >>> import jax, jax_autotune as jat
    >>> jax.jit(jat.autotune(train_step))               # every matmul inside is tuned
    >>> jax.jit(jat.matmul)(x, w)                       # jnp.matmul semantics, tuned kernel
    >>> jat.warmup([(1024, 1024, 1024)], dtype="bfloat16")
    >>> jat.export(f, x, w).serialize()                  # a jax.export artifact (serving)

Everything public is listed in ``__all__``; the subpackages (``tuning``, ``kernels``,
``tables``, ``cli``) are internal. ``jax_autotune.checkpoint`` (orbax items) loads on
first use, so orbax stays optional.
"""

import logging

logging.getLogger(__name__).addHandler(logging.NullHandler())  # tuning's records: see tuning/progress.py

import jax_autotune.config as config  # noqa: E402
from jax_autotune._version import __version__
from jax_autotune.api import dot_general, key_for, matmul
from jax_autotune.autotune import autotune
from jax_autotune.key import Kind, Layout, Level, MatmulKey, Precision, Scale
from jax_autotune.problem import MatmulProblem
from jax_autotune.serving import (deserialize, export, export_allowing, export_disabled_checks,
                                  native_targets)
from jax_autotune.tables.install import load_table, table
from jax_autotune.tables.table_file import TuneTable, TuneTableError, TuneTableWarning
from jax_autotune.tuning.counters import reset_stats, stats
from jax_autotune.tuners import NativeKernelsWarning
from jax_autotune.tuning.consensus import JaxAutotuneConsensusWarning
from jax_autotune.tuning.decision import CandidateResult, Decision, DecisionLogWarning
from jax_autotune.tuning.store import JaxAutotuneStoreWarning
from jax_autotune.tuning.tuner import KeyNotTunedError
from jax_autotune.warmup import NoTunedMatmulWarning, WarmupReport, warmup

__all__ = [
    "CandidateResult", "Decision", "DecisionLogWarning", "JaxAutotuneConsensusWarning",
    "JaxAutotuneStoreWarning", "KeyNotTunedError", "Kind", "Layout", "Level", "MatmulKey",
    "MatmulProblem", "NativeKernelsWarning", "NoTunedMatmulWarning", "Precision", "Scale", "TuneTable", "TuneTableError",
    "TuneTableWarning", "WarmupReport", "__version__", "autotune", "config", "deserialize",
    "dot_general", "export", "export_allowing", "export_disabled_checks", "key_for", "load_table",
    "matmul", "native_targets", "reset_stats", "stats", "table", "warmup",
]


def __getattr__(name: str):
    # ``jat.checkpoint`` without importing orbax at ``import jax_autotune``
    if name == "checkpoint":
        import importlib
        return importlib.import_module("jax_autotune.checkpoint")
    raise AttributeError(f"module 'jax_autotune' has no attribute {name!r}")
