"""Every error and warning of jax_autotune, under two bases, one name pattern: ``<What>Error``
and ``<What>Warning``.

    >>> import warnings, jax_autotune as jat
    >>> warnings.simplefilter("ignore", jat.JaxAutotuneWarning)   # all of the tuner's warnings
    >>> try:
    ...     jax.jit(step).lower(params, batch).compile()          # under JAX_AUTOTUNE_MODE=require
    ... except jat.KeyNotTunedError as err:                        # also a jat.JaxAutotuneError
    ...     print(err)

Each error also derives from the builtin a caller would catch without knowing this module
(``ConfigError`` is a ``ValueError``, ``KeyNotTunedError`` a ``RuntimeError``, ...). The
names of earlier releases stay as aliases (``JaxAutotuneStoreWarning``,
``JaxAutotuneConsensusWarning``).
"""

from __future__ import annotations


class JaxAutotuneError(Exception):
    """The base of every error jax_autotune raises."""


class JaxAutotuneWarning(UserWarning):
    """The base of every warning jax_autotune gives."""


# ---------------------------------------------------------------- errors

class ConfigError(JaxAutotuneError, ValueError):
    """A bad setting: its name, value and what is allowed."""


class KeyNotTunedError(JaxAutotuneError, RuntimeError):
    """Mode ``require`` met a key that is not in the tune table."""


class TuneTableError(JaxAutotuneError, ValueError):
    """A tune table that cannot be read: not JSON, another schema or version, or a field of
    the wrong type. The message names the file (when known) and the field."""


class ShardKernelError(JaxAutotuneError, RuntimeError):
    """No kernel for a per-shard problem inside XLA's partitioner (the message names the key)."""


class NotARegularFileError(JaxAutotuneError, OSError):
    """A path the user named is a FIFO, a device or a folder, not a regular file."""


# ---------------------------------------------------------------- warnings

class ConfigWarning(JaxAutotuneWarning):
    """A config file that may hold jax_autotune's settings could not be read: the defaults apply."""


class StoreWarning(JaxAutotuneWarning):
    """The tune store fell back to memory, is read-only, or a stored decision was rejected."""


class ConsensusWarning(JaxAutotuneWarning):
    """Another process did not decide a key in time, or the job's key-value store failed."""


class DecisionLogWarning(JaxAutotuneWarning):
    """The decision log (``log_decisions``) cannot be written."""


class NativeKernelsWarning(JaxAutotuneWarning):
    """The native CPU kernels are not built: CPU matmuls use XLA's dot only."""


class TuneTableWarning(JaxAutotuneWarning):
    """Tune-table entries skipped on load (another build's kernel, a kernel that cannot run here)."""


class NoTunedMatmulWarning(JaxAutotuneWarning):
    """``warmup(fn)`` found no matmul that a compile of ``fn`` asks the tuner for."""


JaxAutotuneStoreWarning = StoreWarning  # the earlier names
JaxAutotuneConsensusWarning = ConsensusWarning

__all__ = ["JaxAutotuneError", "JaxAutotuneWarning", "ConfigError", "KeyNotTunedError",
           "TuneTableError", "ShardKernelError", "NotARegularFileError", "ConfigWarning",
           "StoreWarning", "ConsensusWarning", "DecisionLogWarning", "NativeKernelsWarning",
           "TuneTableWarning", "NoTunedMatmulWarning", "JaxAutotuneStoreWarning",
           "JaxAutotuneConsensusWarning"]
