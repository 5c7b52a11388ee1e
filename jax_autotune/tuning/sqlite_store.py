"""The SQLite tune store: one database file per environment, ``<cache_dir>/<environment>.db``.

Two tables::

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

The file is created (with its folder) on the first write, in WAL journal mode with a 30 s
busy timeout, so several processes and threads of one machine can read and write one
database at once. WAL needs shared memory between them: a database on a network
filesystem (NFS, Lustre) is the directory store's place (``tuning.directory_store``).
If the database cannot be opened, read or written (a file that is not a database, a full
disk ...), one ``StoreWarning`` names the path and the error and the store is memory-only
from then on. A database this process may not write (the file or its folder is
read-only) is opened read-only, with one warning. ``put_many`` writes many rows in one
transaction: all of them or none.

    >>> import pathlib, tempfile
    >>> from jax_autotune.tuning.sqlite_store import SqliteStore
    >>> store = SqliteStore(pathlib.Path(tempfile.mkdtemp()) / "default.db")
    >>> store.put("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1", {"winner": "xla_dot"})
    True
    >>> store.get("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "other-checksum") is None
    True
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable

from jax_autotune.files import check_regular
from jax_autotune.tuning.store_protocol import (Claim, Expired, Keep, NamespaceFilter, Store, StoreEntry,
                                                claim_is_busy, encode_value)

__all__ = ["BUSY_TIMEOUT_SECONDS", "SqliteStore"]

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
_ROW = "namespace = ? AND key = ? AND checksum = ?"


def _where(selected: NamespaceFilter) -> tuple[str, tuple]:
    """A WHERE clause (possibly empty) for a namespace filter."""
    if selected.namespace is not None:
        return " WHERE namespace = ?", (selected.namespace,)
    if selected.prefix is not None:
        # substr, not LIKE: '_' and '%' are ordinary characters in namespaces.
        return " WHERE substr(namespace, 1, ?) = ?", (len(selected.prefix), selected.prefix)
    return "", ()


class SqliteStore(Store):
    """The store in one SQLite file; never raises for disk trouble.

        >>> SqliteStore("/tmp/cache/default.db").put(ns, "k1", "c1", {"winner": "xla_dot"})
        True

    Safe to share between threads (one connection behind a lock) and to use from several
    processes on one file (WAL, busy timeout). A store inherited through ``fork`` opens its
    own connection in the child.
    """

    kind = "database"
    _disk_errors = _DISK_ERRORS

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(Path(os.fspath(path)))
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()

    # -- connection handling ------------------------------------------------------------

    def _open(self, create: bool) -> sqlite3.Connection | None:
        return self._connection(create)

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        """The open connection; None if the store failed or (for a read, ``create=False``)
        the file does not exist yet. A file this process cannot write is opened read-only.
        Raises a disk error on failure. Call with the lock held."""
        if self._failed:
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
            self._become_read_only()
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

    def _read(self, body, empty):
        """``body(conn)`` on the open connection; ``empty`` when there is no file yet or the
        store failed (a disk error fails it, with the one warning)."""
        with self._lock:
            try:
                conn = self._connection(create=False)
                return empty if conn is None else body(conn)
            except _DISK_ERRORS as err:
                self._fail(err)
                return empty

    def _transaction(self, body):
        """``body(conn)`` inside BEGIN IMMEDIATE ... COMMIT (the write lock taken up front, so
        two processes never deadlock upgrading a read); None when read-only or failed."""
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

    # -- rows ---------------------------------------------------------------------------

    def get(self, namespace: str, key: str, checksum: str) -> dict | None:
        row = self._read(lambda conn: conn.execute(f"SELECT value FROM entries WHERE {_ROW}",
                                                   (namespace, key, checksum)).fetchone(), None)
        return None if row is None else self._decode(namespace, key, checksum, row[0])

    def put_many(self, rows: Iterable[tuple[str, str, str, dict]]) -> bool:
        """All rows in ONE transaction: a process killed midway leaves none of them.

            >>> store.put_many([(ns, "k1", "c1", {"winner": "xla_dot"}), (ns, "k2", "c1", {...})])
            True
        """
        now = time.time()
        encoded = [(namespace, key, checksum, encode_value(value), now)
                   for namespace, key, checksum, value in rows]
        return self._transaction(lambda conn: conn.executemany(
            "INSERT OR REPLACE INTO entries (namespace, key, checksum, value, updated) "
            "VALUES (?, ?, ?, ?, ?)", encoded)) is not None

    def put_if_absent(self, namespace: str, key: str, checksum: str, value: dict,
                      keep: Keep = lambda value: True) -> tuple[dict, bool]:
        text = encode_value(value)

        def body(conn):
            stored = self._kept(conn, namespace, key, checksum, keep)
            if stored is None:
                conn.execute("INSERT OR REPLACE INTO entries (namespace, key, checksum, value, "
                             "updated) VALUES (?, ?, ?, ?, ?)",
                             (namespace, key, checksum, text, time.time()))
            conn.execute(f"DELETE FROM claims WHERE {_ROW}", (namespace, key, checksum))
            return (value, True) if stored is None else (stored, False)

        return self._transaction(body) or (value, True)

    def _kept(self, conn, namespace: str, key: str, checksum: str, keep: Keep) -> dict | None:
        """The stored value of a key when it decodes and ``keep`` accepts it, else None."""
        row = conn.execute(f"SELECT value FROM entries WHERE {_ROW}", (namespace, key, checksum)).fetchone()
        value = None if row is None else self._decode(namespace, key, checksum, row[0])
        return value if value is not None and keep(value) else None

    # -- claims -------------------------------------------------------------------------

    def claim(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float,
              expired: Expired = lambda owner, expires: False,
              keep: Keep = lambda value: True) -> tuple[Claim, Any]:
        """One transaction: the stored value, else the claim (new, its own, or one whose
        lease ran out or whose owner ``expired`` says is gone), else busy.

            >>> store.claim(ns, "k1", "c1", "host:123:ab", lease_seconds=15)   # doctest: +SKIP
            ('claimed', None)
        """
        def body(conn):
            value = self._kept(conn, namespace, key, checksum, keep)
            if value is not None:
                return Claim.DECIDED, value
            now = time.time()
            held = conn.execute(f"SELECT owner, expires FROM claims WHERE {_ROW}",
                                (namespace, key, checksum)).fetchone()
            if held is not None and claim_is_busy(held[0], held[1], owner, now, expired):
                return Claim.BUSY, held[0]
            conn.execute("INSERT OR REPLACE INTO claims (namespace, key, checksum, owner, expires) "
                         "VALUES (?, ?, ?, ?, ?)", (namespace, key, checksum, owner, now + lease_seconds))
            return Claim.CLAIMED, None

        result = self._transaction(body)
        return (Claim.CLAIMED, None) if result is None else result

    def renew(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float) -> bool:
        return bool(self._transaction(lambda conn: conn.execute(
            f"UPDATE claims SET expires = ? WHERE {_ROW} AND owner = ?",
            (time.time() + lease_seconds, namespace, key, checksum, owner)).rowcount))

    def release(self, namespace: str, key: str, checksum: str, owner: str) -> None:
        self._transaction(lambda conn: conn.execute(
            f"DELETE FROM claims WHERE {_ROW} AND owner = ?", (namespace, key, checksum, owner)))

    # -- many rows ----------------------------------------------------------------------

    def delete(self, namespace: str | None = None, *, namespace_prefix: str | None = None) -> int:
        """Remove the rows of one namespace, of every namespace starting with a prefix, or
        (neither given) all rows; returns how many were removed.

            >>> store.delete(namespace_prefix="autotune/0.1.0/")  # doctest: +SKIP
            12
        """
        where, params = _where(NamespaceFilter.of(namespace, namespace_prefix))
        return self._read(lambda conn: 0 if self._read_only else
                          conn.execute("DELETE FROM entries" + where, params).rowcount, 0)

    def delete_namespaces(self, namespaces: Iterable[str]) -> int:
        """In one transaction: all or none, so a failure halfway never leaves a half-cleared
        store.

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
        where, params = _where(NamespaceFilter.of(namespace, namespace_prefix))
        rows = self._read(lambda conn: conn.execute(
            "SELECT namespace, key, checksum, value, updated FROM entries" + where
            + " ORDER BY namespace, key, checksum", params).fetchall(), [])
        result = []
        for ns, key, checksum, text, updated in rows:
            value = self._decode(ns, key, checksum, text)
            if value is not None:
                result.append(StoreEntry(ns, key, checksum, value, float(updated)))
        return result

    def namespaces(self) -> list[str]:
        return self._read(lambda conn: [row[0] for row in conn.execute(
            "SELECT DISTINCT namespace FROM entries ORDER BY namespace")], [])

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                try:
                    conn.close()
                except _DISK_ERRORS:
                    pass
