"""The persistent tune store: tuning decisions and device throughput, and which backend
holds them.

Every store maps (namespace, key, checksum) to a JSON object (never pickle) and has the
methods of ``tuning.store_protocol.Store``; the setting ``store`` picks the backend
(:func:`open_store`):

- ``sqlite`` (default): ``<cache_dir>/<environment>.db`` (``tuning.sqlite_store``), for a
  folder on a local disk shared by the processes of one machine;
- ``directory``: ``<cache_dir>/<environment>.d/``, one file per row (``tuning.directory_store``),
  for a folder on a cluster's shared filesystem (NFS, Lustre), where SQLite's WAL does not work;
- ``memory`` (and ``cache = 0``): nothing kept (``tuning.memory_store``).

Namespaces (built by ``tuning.namespaces``):

- ``autotune/<jax_autotune version>/<jax version>/<device fingerprint>/matmul`` — one row
  per tuned key: the winner and every candidate's results, bounds and limit.
- ``throughput/<jax_autotune version>/<device fingerprint>`` — the measured peaks and
  launch overhead of one device, shared by all keys.
- ``programs/<jax_autotune version>/<jax version>/<device fingerprint>`` — one row per
  checked program: its times plain and tuned, and the keys it leaves plain (``tuning.programs``).

No store raises for disk trouble: one that cannot be used warns once and is memory-only
from then on; one this process may not write is read, with one warning. A bad row is
skipped with one warning per store, and so is a decision row that breaks a tune-table
entry's rules (``decisions.stored_decision``).

    >>> import pathlib, tempfile
    >>> from jax_autotune.tuning.store import store_at
    >>> store = store_at(pathlib.Path(tempfile.mkdtemp()) / "default.db")   # SQLite
    >>> store.put("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1", {"winner": "xla_dot"})
    True
    >>> store.get("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1")
    {'winner': 'xla_dot'}
"""

from __future__ import annotations

import os
from pathlib import Path

from jax_autotune.errors import JaxAutotuneStoreWarning, StoreWarning
from jax_autotune.tuning.directory_store import DirectoryStore
from jax_autotune.tuning.memory_store import MemoryStore
from jax_autotune.tuning.policy import StoreChoice
from jax_autotune.tuning.sqlite_store import BUSY_TIMEOUT_SECONDS, SqliteStore
from jax_autotune.tuning.store_protocol import Store, StoreEntry

__all__ = ["BUSY_TIMEOUT_SECONDS", "DirectoryStore", "JaxAutotuneStoreWarning", "MemoryStore",
           "SqliteStore", "Store", "StoreChoice", "StoreEntry", "StoreWarning", "open_store",
           "store_at", "store_location"]


def store_at(path: str | os.PathLike | None) -> Store:
    """The SQLite store at ``path``, or for None the memory-only store.

        >>> store_at("/tmp/cache/default.db"), store_at(None)
        (SqliteStore('/tmp/cache/default.db', on disk), MemoryStore(None, memory-only))
    """
    return MemoryStore() if path is None else SqliteStore(path)


def store_location(backend: str, cache_dir: str | os.PathLike, environment: str) -> Path:
    """Where a disk backend keeps an environment's rows.

        >>> store_location("directory", "/shared/cache", "default")
        PosixPath('/shared/cache/default.d')
    """
    suffix = {"sqlite": ".db", "directory": ".d"}[backend]
    return Path(cache_dir) / f"{environment}{suffix}"


def open_store(choice: StoreChoice) -> Store:
    """The store ``choice`` names: memory-only when ``cache`` is off or ``store`` is
    ``memory``, else the ``store`` backend at ``store_location(...)``.

        >>> open_store(StoreChoice(cache=True, cache_dir="/home/me/.cache/jax_autotune", store="directory"))
        DirectoryStore('/home/me/.cache/jax_autotune/default.d', on disk)
    """
    if not choice.cache:
        return MemoryStore(why="cache = 0")
    if choice.store == "memory":
        return MemoryStore(why="store = memory")
    location = store_location(choice.store, choice.cache_dir, choice.environment)
    return DirectoryStore(location) if choice.store == "directory" else SqliteStore(location)
