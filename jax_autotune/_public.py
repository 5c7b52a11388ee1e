"""The public API's imports. ``jax_autotune`` loads this module on the first use of a
public name (``__all__`` there lists them); it imports jax and the tuner.

    >>> import jax_autotune as jat
    >>> jat.warmup is jax_autotune._public.warmup
    True
"""

# every name below is re-exported by jax_autotune (its __all__)
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
