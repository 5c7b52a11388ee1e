"""The persistent tune store: tuning decisions and device throughput on disk (SQLite).

One database file per environment, ``<cache_dir>/<environment>.db`` (see
:func:`open_store`), holding two tables::

    CREATE TABLE entries (
        namespace TEXT NOT NULL,   -- e.g. 'autotune/0.1.0/0.10.2/<device>/matmul'
        key       TEXT NOT NULL,   -- the tune key, serialized by its owner
        checksum  TEXT NOT NULL,   -- checksum of the candidate set; a new set misses
        value     TEXT NOT NULL,   -- a JSON object (never pickle)
        updated   REAL NOT NULL,   -- time.time() of the last write
        PRIMARY KEY (namespace, key, checksum)
    )
    CREATE TABLE claims (          -- a key being tuned by one process (see ``claim``)
        namespace, key, checksum,  -- as in entries
        owner     TEXT NOT NULL,   -- host:pid:token of the tuning process
        expires   REAL NOT NULL,   -- time.time() after which another process may take over
        PRIMARY KEY (namespace, key, checksum)
    )

Namespaces (built by ``tuning.namespaces``):

- ``autotune/<jax_autotune version>/<jax version>/<device fingerprint>/matmul`` — one row
  per tuned key: the winner and every candidate's results, bounds and limit.
- ``throughput/<jax_autotune version>/<device fingerprint>`` — the measured peaks and
  launch overhead of one device, shared by all keys.

The file is created (with its directory) on the first write, in WAL journal mode with a
30 s busy timeout, so several processes and threads can read and write one database at
once. The store never raises for disk trouble: if the database cannot be opened, read or
written (read-only directory, a file that is not a database, a full disk ...), it emits one
:class:`StoreWarning` naming the path and the error and from then on behaves as
a memory-only store (reads miss, writes are dropped; the tuner's in-memory table keeps the
decisions). A row whose value is not a JSON object is skipped, with one warning per store;
so is a decision row that breaks a tune-table entry's rules (``tuner.stored_decision``).

A database this process may not write (a shared or deployed cache: the file or its folder
is read-only) is opened read-only, with one warning: its rows are read, writes are
dropped (the tuner keeps new decisions in its memory table). ``put_many`` writes many
rows in one transaction: all of them or none.

    >>> import pathlib, tempfile
    >>> from jax_autotune.tuning.store import TuneStore
    >>> store = TuneStore(pathlib.Path(tempfile.mkdtemp()) / "default.db")
    >>> store.put("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1", {"winner": "xla_dot"})
    >>> store.get("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1")
    {'winner': 'xla_dot'}
    >>> store.get("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "other-checksum") is None
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from jax_autotune.errors import JaxAutotuneStoreWarning, StoreWarning
import jax_autotune.config as config
from jax_autotune.files import check_regular

__all__ = ["BUSY_TIMEOUT_SECONDS", "StoreWarning", "StoreEntry", "TuneStore", "open_store"]

BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    checksum  TEXT NOT NULL,
    value     TEXT NOT NULL,
    updated   REAL NOT NULL,
    PRIMARY KEY (namespace, key, checksum)
);
CREATE TABLE IF NOT EXISTS claims (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    checksum  TEXT NOT NULL,
    owner     TEXT NOT NULL,
    expires   REAL NOT NULL,
    PRIMARY KEY (namespace, key, checksum)
);
"""

# Errors that mean "the disk store does not work"; anything else is a bug and propagates.
_DISK_ERRORS = (sqlite3.Error, OSError)


@dataclasses.dataclass(frozen=True)
class StoreEntry:
    """One row of the store, with its value decoded from JSON.

        >>> StoreEntry("throughput/0.1.0/cpu", "peaks", "v1", {"flops": 1e12}, 0.0).key
        'peaks'
    """

    namespace: str
    key: str
    checksum: str
    value: dict[str, Any]
    updated: float


def _namespace_filter(namespace: str | None, namespace_prefix: str | None) -> tuple[str, tuple]:
    """A WHERE clause (possibly empty) for an exact namespace or a namespace prefix."""
    if namespace is not None and namespace_prefix is not None:
        raise ValueError("give namespace or namespace_prefix, not both")
    if namespace is not None:
        return " WHERE namespace = ?", (namespace,)
    if namespace_prefix is not None:
        # substr, not LIKE: '_' and '%' are ordinary characters in namespaces.
        return " WHERE substr(namespace, 1, ?) = ?", (len(namespace_prefix), namespace_prefix)
    return "", ()


class TuneStore:
    """A (namespace, key, checksum) -> JSON object store in one SQLite file; never raises for
    disk trouble (it warns once and becomes memory-only).

        >>> store = TuneStore(None)            # memory-only: reads miss, writes are dropped
        >>> store.put("ns", "k", "c", {"x": 1})
        >>> store.get("ns", "k", "c") is None, store.available
        (True, False)

    Safe to share between threads (one connection behind a lock) and to use from several
    processes on one file (WAL, busy timeout). A store inherited through ``fork`` opens its
    own connection in the child.
    """

    def __init__(self, path: str | os.PathLike | None) -> None:
        self._path: Path | None = None if path is None else Path(os.fspath(path))
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._failed = False
        self._error = ""  # why the store failed, once it did
        self._read_only = False
        self._warned_failure = False
        self._warned_bad_row = False

    # -- properties ---------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The database file (None for a memory-only store)."""
        return self._path

    @property
    def available(self) -> bool:
        """Whether the disk is in use: False for a memory-only store or after a failure."""
        return self._path is not None and not self._failed

    @property
    def read_only(self) -> bool:
        """True once the database was opened read-only (writes are dropped)."""
        return self._read_only

    def check(self, write: bool = False) -> str:
        """'' when the database can be read now (``write``: and written; this creates the
        file), else why not, in one line, without the failure warning (the caller reports
        it). A missing file reads as empty.

            >>> TuneStore("/proc/x/default.db").check(write=True)
            'cannot use /proc/x/default.db: FileNotFoundError: ...'
        """
        if self._path is None:
            return "the disk store is off (cache = 0)"
        with self._lock:
            if not self._failed:
                try:
                    self._connection(create=write)
                except _DISK_ERRORS as err:
                    self._fail(err, warn=False)
            if self._failed:
                return f"cannot use {self._path}: {self._error}"
            if write and self._read_only:
                return f"cannot write {self._path}: it is read-only for this process"
        return ""

    def __repr__(self) -> str:
        state = ("memory-only" if not self.available else "read-only" if self._read_only
                 else "on disk")
        return f"TuneStore({str(self._path) if self._path else None!r}, {state})"

    # -- connection handling ------------------------------------------------------------

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        """The open connection; None if the store is memory-only or (for a read,
        ``create=False``) the file does not exist yet. A file this process cannot write is
        opened read-only. Raises a disk error on failure. Call with the lock held."""
        if self._path is None or self._failed:
            return None
        if self._conn is not None and self._pid != os.getpid():
            self._conn = None  # inherited across fork: never use (or close) the parent's
        if self._conn is not None:
            return self._conn
        for name in (self._path.name, f"{self._path.name}-wal", f"{self._path.name}-shm"):
            check_regular(self._path.with_name(name))  # SQLite's open would block on a FIFO
        exists = self._path.exists()
        if not create and not exists:
            return None
        if exists and not (os.access(self._path, os.W_OK) and os.access(self._path.parent, os.W_OK)):
            conn = self._open_read_only()
        else:
            try:
                conn = self._open_read_write()
            except _DISK_ERRORS as err:
                if not exists:
                    raise
                try:  # e.g. a read-only mount or folder that os.access does not reveal
                    conn = self._open_read_only()
                except _DISK_ERRORS:
                    raise err from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _open_read_write(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
            self._retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
            self._retry_locked(lambda: conn.executescript(_SCHEMA))
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        """A read-only connection, warning once. A WAL database whose folder this process
        cannot write has no shared-memory file to open read-only: it is then opened
        ``immutable`` (no locking), which only a deployed, unchanging file can be."""
        uri = self._path.resolve().as_uri()
        error: BaseException | None = None
        for options in ("mode=ro", "mode=ro&immutable=1"):
            conn = sqlite3.connect(f"{uri}?{options}", uri=True, timeout=BUSY_TIMEOUT_SECONDS,
                                   isolation_level=None, check_same_thread=False)
            try:
                conn.execute("SELECT 1 FROM entries LIMIT 1").fetchall()
            except _DISK_ERRORS as err:
                conn.close()
                error = err
                continue
            if not self._read_only:
                self._read_only = True
                warnings.warn(f"jax_autotune: the tune store database {self._path} is read-only "
                              f"for this process: its decisions are used, new ones stay in "
                              f"memory (they are tuned again by the next process).",
                              StoreWarning, stacklevel=5)
            return conn
        raise error

    @staticmethod
    def _retry_locked(step, attempts: int = 50) -> Any:
        """Run ``step``; retry briefly on 'database is locked' (switching to WAL while another
        process creates the same file can report SQLITE_BUSY without waiting)."""
        for attempt in range(attempts):
            try:
                return step()
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or attempt == attempts - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))

    def _fail(self, err: BaseException, warn: bool = True) -> None:
        """Fall back to memory-only, warning once. Call with the lock held."""
        self._failed, self._error = True, f"{type(err).__name__}: {err}"
        self.close()
        if warn and not self._warned_failure:
            self._warned_failure = True
            warnings.warn(f"jax_autotune: cannot use the tune store database {self._path}: "
                          f"{type(err).__name__}: {err}. Tuning decisions stay in memory for "
                          f"this process (they will be re-tuned next time).",
                          StoreWarning, stacklevel=3)

    def _decode(self, namespace: str, key: str, checksum: str, text: Any) -> dict | None:
        """The row's value as a dict, or None (with one warning per store) if it is not a
        JSON object."""
        try:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError(f"expected a JSON object, got {type(value).__name__}")
            return value
        except (TypeError, ValueError, RecursionError) as err:
            self.skip_row(namespace, key, checksum, str(err))
            return None

    def skip_row(self, namespace: str, key: str, checksum: str, reason: str) -> None:
        """Warn, once per store, that a row is treated as missing: its value is not a JSON
        object, or not a record its reader accepts (``tuner.stored_decision``).

            >>> store.skip_row(ns, "k1", "c1", "results[0].score: expected a number")
        """
        if not self._warned_bad_row:
            self._warned_bad_row = True
            warnings.warn(f"jax_autotune: skipping a bad row in the tune store database "
                          f"{self._path} (namespace={namespace!r}, key={key!r}, "
                          f"checksum={checksum!r}): {reason}. That entry (and any other bad "
                          f"row of this database) is treated as missing until it is re-tuned.",
                          StoreWarning, stacklevel=4)

    # -- API ----------------------------------------------------------------------------

    def get(self, namespace: str, key: str, checksum: str) -> dict | None:
        """The stored value, or None (missing, other checksum, memory-only, bad row).

            >>> store.get("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1")  # doctest: +SKIP
            {'winner': 'xla_dot'}
        """
        with self._lock:
            try:
                conn = self._connection(create=False)
                if conn is None:
                    return None
                row = conn.execute("SELECT value FROM entries WHERE namespace = ? AND key = ? "
                                   "AND checksum = ?", (namespace, key, checksum)).fetchone()
            except _DISK_ERRORS as err:
                self._fail(err)
                return None
            if row is None:
                return None
            return self._decode(namespace, key, checksum, row[0])

    def put(self, namespace: str, key: str, checksum: str, value: dict) -> bool:
        """Store ``value`` (a JSON-serializable dict) under (namespace, key, checksum),
        replacing any earlier value; False when it was not written (see ``put_many``).

            >>> store.put("throughput/0.1.0/cpu", "peaks", "v1", {"flops": 1e12})  # doctest: +SKIP
            True
        """
        return self.put_many([(namespace, key, checksum, value)])

    def put_many(self, rows: Iterable[tuple[str, str, str, dict]]) -> bool:
        """Store (namespace, key, checksum, value) rows in ONE transaction: a process killed
        midway leaves none of them. False when nothing was written (memory-only, read-only,
        or a disk error, which warns once). Raises TypeError/ValueError only for a value
        that is not a JSON-serializable dict (a caller bug, also checked when memory-only).

            >>> store.put_many([(ns, "k1", "c1", {"winner": "xla_dot"}), (ns, "k2", "c1", {...})])
            True
        """
        now = time.time()
        encoded = [(namespace, key, checksum, _encode(value), now)
                   for namespace, key, checksum, value in rows]
        return self._transaction(lambda conn: conn.executemany(
            "INSERT OR REPLACE INTO entries (namespace, key, checksum, value, updated) "
            "VALUES (?, ?, ?, ?, ?)", encoded)) is not None

    def put_if_absent(self, namespace: str, key: str, checksum: str, value: dict,
                      keep: Callable[[dict], bool] = lambda value: True) -> tuple[dict, bool]:
        """Store ``value`` unless a value that ``keep`` accepts is stored under (namespace,
        key, checksum) already, and drop the key's claim; returns (the stored value, whether
        it is ``value``): a concurrent tuning never replaces a stored decision. Memory-only:
        (value, True).

            >>> store.put_if_absent(ns, "k1", "c1", {"winner": "b"})   # doctest: +SKIP
            ({'winner': 'a'}, False)
        """
        text = _encode(value)

        def body(conn):
            stored = self._kept(conn, namespace, key, checksum, keep)
            if stored is None:
                conn.execute("INSERT OR REPLACE INTO entries (namespace, key, checksum, value, "
                             "updated) VALUES (?, ?, ?, ?, ?)",
                             (namespace, key, checksum, text, time.time()))
            conn.execute("DELETE FROM claims WHERE namespace = ? AND key = ? AND checksum = ?",
                         (namespace, key, checksum))
            return (value, True) if stored is None else (stored, False)

        return self._transaction(body) or (value, True)

    def _kept(self, conn, namespace: str, key: str, checksum: str, keep) -> dict | None:
        """The stored value of a key when it decodes and ``keep`` accepts it, else None."""
        row = conn.execute("SELECT value FROM entries WHERE namespace = ? AND key = ? "
                           "AND checksum = ?", (namespace, key, checksum)).fetchone()
        value = None if row is None else self._decode(namespace, key, checksum, row[0])
        return value if value is not None and keep(value) else None

    def claim(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float,
              expired=lambda owner, expires: False,
              keep: Callable[[dict], bool] = lambda value: True) -> tuple[str, Any]:
        """One atomic step towards tuning a key once per store: ``("decided", value)`` when
        a value ``keep`` accepts is stored, ``("claimed", None)`` when ``owner`` now holds
        the claim (new, its own, or one whose lease ran out or that ``expired(owner,
        expires)`` says is dead), else ``("busy", holder)``. A memory-only store always
        answers ``claimed``.

            >>> store.claim(ns, "k1", "c1", "host:123:ab", lease_seconds=15)   # doctest: +SKIP
            ('claimed', None)
        """
        def body(conn):
            value = self._kept(conn, namespace, key, checksum, keep)
            if value is not None:
                return "decided", value
            now = time.time()
            held = conn.execute("SELECT owner, expires FROM claims WHERE namespace = ? AND "
                                "key = ? AND checksum = ?", (namespace, key, checksum)).fetchone()
            if held is not None and held[0] != owner and held[1] > now and not expired(*held):
                return "busy", held[0]
            conn.execute("INSERT OR REPLACE INTO claims (namespace, key, checksum, owner, expires) "
                         "VALUES (?, ?, ?, ?, ?)", (namespace, key, checksum, owner, now + lease_seconds))
            return "claimed", None

        result = self._transaction(body)
        return ("claimed", None) if result is None else result

    def renew(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s lease; False when it no longer holds the claim."""
        return bool(self._transaction(lambda conn: conn.execute(
            "UPDATE claims SET expires = ? WHERE namespace = ? AND key = ? AND checksum = ? "
            "AND owner = ?", (time.time() + lease_seconds, namespace, key, checksum, owner)).rowcount))

    def release(self, namespace: str, key: str, checksum: str, owner: str) -> None:
        """Drop ``owner``'s claim without a decision (others may claim at once)."""
        self._transaction(lambda conn: conn.execute(
            "DELETE FROM claims WHERE namespace = ? AND key = ? AND checksum = ? AND owner = ?",
            (namespace, key, checksum, owner)))

    def _transaction(self, body):
        """``body(conn)`` inside BEGIN IMMEDIATE ... COMMIT (the write lock taken up front, so
        two processes never deadlock upgrading a read); None when memory-only, read-only or
        failed."""
        with self._lock:
            try:
                conn = self._connection(create=True)
                if conn is None or self._read_only:
                    return None
                self._retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"))
                try:
                    result = body(conn)
                except BaseException:
                    with contextlib.suppress(*_DISK_ERRORS):
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result
            except _DISK_ERRORS as err:
                self._fail(err)
                return None

    def delete(self, namespace: str | None = None, *, namespace_prefix: str | None = None) -> int:
        """Remove the rows of one namespace, of every namespace starting with a prefix, or
        (neither given) all rows; returns how many were removed.

            >>> store.delete(namespace_prefix="autotune/0.1.0/")  # doctest: +SKIP
            12
        """
        where, params = _namespace_filter(namespace, namespace_prefix)
        with self._lock:
            try:
                conn = self._connection(create=False)
                if conn is None or self._read_only:
                    return 0
                return conn.execute("DELETE FROM entries" + where, params).rowcount
            except _DISK_ERRORS as err:
                self._fail(err)
                return 0

    def delete_namespaces(self, namespaces: Iterable[str]) -> int:
        """Remove the rows of every namespace given in one transaction (all or none, so a
        failure halfway never leaves a half-cleared store); returns how many were removed.

            >>> store.delete_namespaces(store.namespaces())  # doctest: +SKIP
            12
        """
        names = list(dict.fromkeys(namespaces))
        if not names:
            return 0

        def body(conn) -> int:
            return sum(conn.execute("DELETE FROM entries WHERE namespace = ?", (name,)).rowcount
                       for name in names)

        return self._transaction(body) or 0

    def entries(self, namespace: str | None = None, *,
                namespace_prefix: str | None = None) -> list[StoreEntry]:
        """The rows of one namespace, of a namespace prefix, or all rows, ordered by
        (namespace, key, checksum); rows whose value is not a JSON object are skipped.

            >>> [e.key for e in store.entries("throughput/0.1.0/cpu")]  # doctest: +SKIP
            ['peaks']
        """
        where, params = _namespace_filter(namespace, namespace_prefix)
        with self._lock:
            try:
                conn = self._connection(create=False)
                if conn is None:
                    return []
                rows = conn.execute("SELECT namespace, key, checksum, value, updated FROM entries"
                                    + where + " ORDER BY namespace, key, checksum",
                                    params).fetchall()
            except _DISK_ERRORS as err:
                self._fail(err)
                return []
            result = []
            for ns, key, checksum, text, updated in rows:
                value = self._decode(ns, key, checksum, text)
                if value is not None:
                    result.append(StoreEntry(ns, key, checksum, value, float(updated)))
            return result

    def namespaces(self) -> list[str]:
        """The distinct namespaces present, sorted.

            >>> store.namespaces()  # doctest: +SKIP
            ['autotune/0.1.0/0.10.2/cpu/matmul', 'throughput/0.1.0/cpu']
        """
        with self._lock:
            try:
                conn = self._connection(create=False)
                if conn is None:
                    return []
                return [row[0] for row in conn.execute(
                    "SELECT DISTINCT namespace FROM entries ORDER BY namespace")]
            except _DISK_ERRORS as err:
                self._fail(err)
                return []

    def close(self) -> None:
        """Close the connection (idempotent); a later call reopens it."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                try:
                    conn.close()
                except _DISK_ERRORS:
                    pass

    def __enter__(self) -> TuneStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _encode(value: dict) -> str:
    if not isinstance(value, dict):
        raise TypeError(f"value: expected a dict, got {type(value).__name__}")
    return json.dumps(value, sort_keys=True)


def open_store() -> TuneStore:
    """The store the configuration asks for: memory-only if ``cache`` is off, else
    ``<cache_dir>/<environment>.db``.

        >>> from jax_autotune import config
        >>> config.update("cache", False)
        >>> open_store().available
        False
        >>> config.update("cache", None)
    """
    if not config.get("cache"):
        return TuneStore(None)
    return TuneStore(Path(config.get("cache_dir")) / f"{config.get('environment')}.db")
