"""The public API's imports. ``jax_autotune`` loads this module on the first use of a
public name (``__all__`` there lists them); it imports jax and the tuner.

    >>> import jax_autotune as jat
    >>> jat.warmup is jax_autotune._public.warmup
    True
"""

# every name below is re-exported by jax_autotune (its __all__)
from jax_autotune.api import dot_general, key_for, matmul
from jax_autotune.attention_key import AttentionKey
from jax_autotune.tuning.attention_decisions import AttentionDecision
from jax_autotune.autotune import autotune
from jax_autotune.key import Kind, Layout, Level, MatmulKey, Precision, Scale
from jax_autotune.problem import MatmulProblem
from jax_autotune.ragged import ragged_dot
from jax_autotune.serving import (deserialize, export, export_allowing, export_disabled_checks,
                                  native_targets)
from jax_autotune.tables.install import load_table, table
from jax_autotune.errors import (ConfigError, ConfigWarning, ConsensusWarning, DecisionLogWarning,
                                 JaxAutotuneConsensusWarning, JaxAutotuneError, JaxAutotuneStoreWarning,
                                 JaxAutotuneWarning, KeyNotTunedError, NativeKernelsWarning,
                                 NoTunedMatmulWarning, NotARegularFileError, ShardKernelError,
                                 StoreWarning, TuneTableError, TuneTableWarning)
from jax_autotune.tables.table_file import TuneTable
from jax_autotune.tuning.counters import reset_stats, stats
from jax_autotune.tuning.decision import CandidateResult, Decision
from jax_autotune.program_check import ProgramCheck
from jax_autotune.warmup import WarmupReport, warmup
