"""jax_autotune: a matmul autotuner for JAX.

    >>> import jax, jax_autotune as jat
    >>> jax.jit(jat.matmul)(x, w)                       # jnp.matmul semantics, tuned kernel
    >>> jat.warmup([(1024, 1024, 1024)], dtype="bfloat16")
"""

from jax_autotune import config
from jax_autotune.api import dot_general, matmul
from jax_autotune.decision import CandidateResult, Decision
from jax_autotune.key import Kind, Layout, Level, MatmulKey, MatmulProblem, Precision, Scale, key_for
from jax_autotune.counters import reset_stats, stats
from jax_autotune.store import JaxAutotuneStoreWarning
from jax_autotune.tune_table import TuneTable, TuneTableError, TuneTableWarning, load_table, table
from jax_autotune.tuner import KeyNotTunedError
from jax_autotune.warmup import WarmupReport, warmup

__version__ = "0.1.0"

__all__ = [
    "CandidateResult", "Decision", "JaxAutotuneStoreWarning", "KeyNotTunedError", "Kind", "Layout",
    "Level", "MatmulKey", "MatmulProblem", "Precision", "Scale", "__version__", "config",
    "TuneTable", "TuneTableError", "TuneTableWarning", "WarmupReport", "dot_general", "key_for", "load_table", "matmul", "reset_stats", "stats", "table", "warmup",
]
