"""What one compile or one warmup asks of the tuner: the settings, read once and passed down.

Two frozen records, built by ``jax_autotune.config`` (``policy()``, ``store_choice()``):
``Policy``, the tuning settings, and ``StoreChoice``, which store decisions live in.

A ``Policy`` is read from the configuration (``jax_autotune.config.policy()``) where a
tuned matmul's lowering or a ``warmup`` starts, and handed to the tuner, which reads no
setting of its own: a setting changed while a key is tuned does not reach that key. The
level a key was bucketed at travels with the key (``MatmulKey.level``), not here.

    >>> policy = config.policy()                    # Policy(mode='tune', budget_seconds=10.0, ...)
    >>> tuner.select(problem, key, policy)
    >>> tuner.select(problem, key, Policy(mode="cached"))
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Policy:
    """The tuning settings of one compile or warmup (``jax_autotune.config`` documents each)."""

    mode: str = "tune"  # tune, cached, require, off
    level: str = "balanced"  # the level new keys are bucketed at
    budget_seconds: float = 10.0  # per key
    log_decisions: str | None = None  # stdout, stderr, a path, or None
    progress: str = "auto"  # auto, on, off
    context: str = "full"  # full, forward, off

    @property
    def tunes(self) -> bool:
        """Whether a key missing from the table is benchmarked now."""
        return self.mode == "tune"


DEFAULT_POLICY = Policy()  # the documented defaults: what a tuner built by hand uses unless told


@dataclasses.dataclass(frozen=True)
class StoreChoice:
    """Which store the settings name: ``cache``, ``cache_dir``, ``environment``, ``store``
    (``tuning.store.open_store`` opens it).

        >>> open_store(StoreChoice(cache=True, cache_dir="/tmp/cache"))
        SqliteStore('/tmp/cache/default.db', on disk)
    """

    cache: bool
    cache_dir: str
    environment: str = "default"
    store: str = "sqlite"


__all__ = ["Policy", "DEFAULT_POLICY", "StoreChoice"]
