"""The directory store: one file per row, for a cache folder on a shared filesystem.

SQLite's WAL needs memory shared by every process that opens the database, which a
network filesystem (NFS, Lustre) does not give; a folder of files written whole and
renamed into place works there (XLA keeps its autotuning results so). The layout, under
``<cache_dir>/<environment>.d/`` (no name holds user text: every name is a hash)::

    <environment>.d/
      <ns>/                    one folder per namespace; ns = sha256 of the namespace
        <row>.json             one row; row = sha256 of (key, checksum)
        <row>.claim            the key is being tuned: owner, lease expiry
        <row>.takeover         the key's claim or damaged row being changed (for milliseconds)
        .<row>.<token>.tmp     a row or claim being written, renamed into place when whole

A row file is one JSON object: ``{"namespace", "key", "checksum", "value", "updated"}``.
It is written to a temporary name in its folder, fsynced, then renamed (``os.replace``),
so a reader sees the old file or the new one, never half of one, and a process killed
while writing loses only that row. A reader skips, with one ``StoreWarning`` per store, a
file that is not a regular file, not a JSON object, over the caps of
``tuning.validation``, or whose namespace, key or checksum is not the one its name stands
for; names it does not know, too (dot files are in-progress writes: skipped quietly).

A claim is created whole or not at all (a hard link of a written file: the one atomic
create that NFS keeps; ``tuning.whole_files``) and holds the owner and its lease's expiry.
Whatever changes an existing claim (renewed, released, or taken over, as in the SQLite
store, once its lease ran out or ``expired`` says its owner is gone) is done by the one
process that creates the key's takeover file the same way, and only while the claim is
still the one it judged. Claims only spare work (each key tuned once); that every process
ends with one decision rests on ``put_if_absent``, whose row is created once the same way
(a damaged row is replaced under the takeover file). ``put_many`` and
``delete_namespaces`` go file by file, not in one transaction: rows written before a
failure stay. A folder this process cannot write is read, with one warning; new
decisions stay in memory.

    >>> from jax_autotune.tuning.directory_store import DirectoryStore
    >>> store = DirectoryStore("/shared/cache/jax_autotune/default.d")
    >>> store.put("autotune/0.1.0/0.10.2/cpu/matmul", "k1", "c1", {"winner": "xla_dot"})
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from jax_autotune.tuning.store_protocol import (Claim, Expired, Keep, NamespaceFilter, Store, StoreEntry,
                                                claim_is_busy, decode_value, encode_value)
from jax_autotune.tuning.validation import LIMITS
from jax_autotune.tuning.whole_files import (DENIED, create_once, read_whole, remove_if, replace_whole,
                                             sync_folder)

__all__ = ["DirectoryStore"]

_HASH = re.compile(r"[0-9a-f]{32}")
_ROW, _CLAIM, _TAKEOVER = ".json", ".claim", ".takeover"
_TRIES = 3  # rounds of create, find a stale file, replace it
_TAKEOVER_SECONDS = 10.0  # a takeover takes milliseconds; one held longer is its dead taker's


def _digest(*parts: str) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _record(namespace: str, key: str, checksum: str, value: dict, updated: float) -> bytes:
    encode_value(value)  # the caller's bug (not a JSON dict) raises before anything is written
    return json.dumps({"namespace": namespace, "key": key, "checksum": checksum,
                       "updated": updated, "value": value}, sort_keys=True).encode()


def _entry(data: bytes) -> StoreEntry:
    """The row a file holds; ValueError (or TypeError) when it is not one."""
    if not data:
        raise ValueError("an empty file (a torn write)")
    record = decode_value(data.decode("utf-8"))
    for name in ("namespace", "key", "checksum"):
        if not isinstance(record.get(name), str):
            raise ValueError(f"{name}: expected a string")
    updated = record.get("updated")
    if not isinstance(record.get("value"), dict) or isinstance(updated, bool) \
            or not isinstance(updated, (int, float)):
        raise ValueError("expected a row: a value object and an updated time")
    return StoreEntry(record["namespace"], record["key"], record["checksum"], record["value"],
                      float(updated))


def _never(owner: str, expires: float) -> bool:
    return False


def _holder(data: bytes | None) -> tuple[str, float]:
    """(owner, expires) of a claim file; an unreadable one is a lapsed claim of nobody."""
    try:
        claim = json.loads(data or b"")
        return str(claim["owner"]), float(claim["expires"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return "", 0.0


class DirectoryStore(Store):
    """The store as a folder of one file per row; never raises for disk trouble.

        >>> DirectoryStore(tmp / "default.d").entries()     # a missing folder reads as empty
        []
    """

    kind = "folder"

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(Path(os.fspath(path)))
        self._opened = False

    # -- the folder ---------------------------------------------------------------------

    def _open(self, create: bool) -> bool:
        """Whether the folder exists (``create``: made if missing); read-only, with one
        warning, when this process may not write it. Raises OSError when it is no folder."""
        if self._opened:
            return True
        if not self._path.exists():
            if not create:
                return False
            self._path.mkdir(parents=True, exist_ok=True)
        if not self._path.is_dir():
            raise NotADirectoryError(f"{self._path} is not a folder")
        if not os.access(self._path, os.W_OK):
            self._become_read_only()
        self._opened = True
        return True

    def _reading(self, body: Callable[[], Any], empty: Any) -> Any:
        """``body()`` when the folder exists; ``empty`` when it does not or the store failed
        (a disk error fails it, with the one warning)."""
        with self._lock:
            try:
                return body() if not self._failed and self._open(create=False) else empty
            except OSError as err:
                self._fail(err)
                return empty

    def _writing(self, body: Callable[[], Any]) -> Any:
        """``body()`` in the folder (made if missing); None when read-only or failed. A
        write the filesystem refuses makes the store read-only; other errors fail it."""
        with self._lock:
            try:
                if self._failed or not self._open(create=True) or self._read_only:
                    return None
            except OSError as err:
                self._fail(err)
                return None
            try:
                return body()
            except OSError as err:
                if err.errno in DENIED:
                    self._become_read_only()
                else:
                    self._fail(err)
                return None

    def _paths(self, namespace: str, key: str, checksum: str) -> tuple[Path, Path, Path]:
        folder = self._path / _digest(namespace)
        stem = _digest(key, checksum)
        return folder, folder / f"{stem}{_ROW}", folder / f"{stem}{_CLAIM}"

    # -- files --------------------------------------------------------------------------

    def _peek(self, path: Path) -> bytes | None:
        """The bytes of ``path``: None when it is missing; b'' (and the one warning) when it
        is no regular file or cannot be read by this process."""
        return read_whole(path, LIMITS["bytes of text"], lambda path, err: self._skip(
            f"{path} in the tune store folder {self._path}: {err}"))

    def _load(self, path: Path, data: bytes | None = None) -> StoreEntry | None:
        """The row in ``path`` (or ``data``, read from it); None when it is missing or bad
        (a bad one is skipped with the one warning)."""
        data = self._peek(path) if data is None else data
        if data is None:
            return None
        try:
            entry = _entry(data)
            if (path.parent.name, path.name) != (_digest(entry.namespace),
                                                 _digest(entry.key, entry.checksum) + _ROW):
                raise ValueError("its namespace, key or checksum is not the one its name stands for")
        except (ValueError, TypeError, RecursionError) as err:
            self._skip(f"{path} in the tune store folder {self._path}: {err}")
            return None
        return entry

    def _kept(self, row: Path, keep: Keep, data: bytes | None = None) -> dict | None:
        entry = self._load(row, data)
        return entry.value if entry is not None and keep(entry.value) else None

    # -- rows ---------------------------------------------------------------------------

    def get(self, namespace: str, key: str, checksum: str) -> dict | None:
        row = self._paths(namespace, key, checksum)[1]
        return self._reading(lambda: self._kept(row, lambda value: True), None)

    def put_many(self, rows: Iterable[tuple[str, str, str, dict]]) -> bool:
        """Each row written whole, one file after the other (not one transaction).

            >>> store.put_many([(ns, "k1", "c1", {"winner": "xla_dot"}), (ns, "k2", "c1", {...})])
            True
        """
        now = time.time()
        encoded = [(self._paths(ns, key, checksum), _record(ns, key, checksum, value, now))
                   for ns, key, checksum, value in rows]

        def body() -> bool:
            folders = dict.fromkeys(folder for (folder, _, _), _ in encoded)
            for folder in folders:
                folder.mkdir(parents=True, exist_ok=True)
            for (_, row, _), data in encoded:
                replace_whole(row, data)
            for folder in folders:
                sync_folder(folder)
            return True

        return bool(self._writing(body))

    def put_if_absent(self, namespace: str, key: str, checksum: str, value: dict,
                      keep: Keep = lambda value: True) -> tuple[dict, bool]:
        folder, row, claim = self._paths(namespace, key, checksum)
        data = _record(namespace, key, checksum, value, time.time())

        def body() -> tuple[dict, bool]:
            folder.mkdir(parents=True, exist_ok=True)
            result, alone = None, secrets.token_hex(8)
            deadline, pause = time.monotonic() + _TAKEOVER_SECONDS, 0.001
            while True:
                seen = self._peek(row)
                stored = None if seen is None else self._kept(row, keep, seen)
                if stored is not None:
                    result = stored, False
                    break
                done = create_once(row, data) if seen is None else self._exclusively(
                    row, alone, _never, lambda: self._replace_if(row, seen, data))
                if done:  # a row keep refuses (damaged, unusable) is replaced, as by SQLite
                    break
                if time.monotonic() > deadline:  # others kept it busy this long: replaced
                    replace_whole(row, data)
                    break
                if done is None:  # another process is replacing it: its row, in a moment
                    time.sleep(pause)
                    pause = min(2 * pause, 0.05)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(claim)
            sync_folder(folder)
            return result or (value, True)

        return self._writing(body) or (value, True)

    # -- claims -------------------------------------------------------------------------

    def claim(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float,
              expired: Expired = lambda owner, expires: False,
              keep: Keep = lambda value: True) -> tuple[Claim, Any]:
        """The stored value, else the claim file (new, its own, or one whose lease ran out
        or whose owner ``expired`` says is gone), else busy.

            >>> store.claim(ns, "k1", "c1", "host:123:ab", lease_seconds=15)   # doctest: +SKIP
            ('claimed', None)
        """
        folder, row, claim = self._paths(namespace, key, checksum)
        mine = json.dumps({"namespace": namespace, "key": key, "checksum": checksum, "owner": owner,
                           "expires": time.time() + lease_seconds}).encode()

        def body() -> tuple[Claim, Any]:
            folder.mkdir(parents=True, exist_ok=True)
            holder = ""
            for _ in range(_TRIES):
                stored = self._kept(row, keep)
                if stored is not None:
                    return Claim.DECIDED, stored
                if create_once(claim, mine):
                    return self._claimed(row, claim, owner, expired, keep)
                seen = self._peek(claim)
                if seen is None:
                    continue  # released meanwhile
                holder, expires = _holder(seen)
                if claim_is_busy(holder, expires, owner, time.time(), expired):
                    return Claim.BUSY, holder
                # its own, lapsed, or its owner gone: renewed or taken over
                if self._exclusively(claim, owner, expired, lambda: self._replace_if(claim, seen, mine)):
                    return self._claimed(row, claim, owner, expired, keep)
            return Claim.BUSY, holder

        return self._writing(body) or (Claim.CLAIMED, None)

    def _claimed(self, row: Path, claim: Path, owner: str, expired: Expired, keep: Keep) -> tuple[Claim, Any]:
        """This process holds the claim: unless a decision was stored between the look and
        the claim (then the claim is dropped)."""
        stored = self._kept(row, keep)
        if stored is None:
            return Claim.CLAIMED, None
        self._drop(claim, owner, expired)
        return Claim.DECIDED, stored

    def _replace_if(self, path: Path, seen: bytes, data: bytes) -> bool:
        """Replace ``path`` with ``data`` if it still holds ``seen``; whether it did."""
        if self._peek(path) != seen:
            return False  # renewed, released or taken over meanwhile: look again
        replace_whole(path, data)
        return True

    def _drop(self, claim: Path, owner: str, expired: Expired) -> None:
        """Remove ``owner``'s claim, unless another process holds it now."""
        def step() -> None:
            if _holder(self._peek(claim))[0] == owner:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(claim)
        self._exclusively(claim, owner, expired, step)

    def _exclusively(self, path: Path, owner: str, expired: Expired, step: Callable[[], Any]) -> Any:
        """``step()`` while this process alone holds the takeover file of ``path``'s key
        (created once, as a claim is); None when another process holds it. A takeover file
        past its short lease, or of a process ``expired`` says is gone, is removed."""
        lock = path.with_suffix(_TAKEOVER)
        ticket = json.dumps({"owner": owner, "expires": time.time() + _TAKEOVER_SECONDS}).encode()
        if not create_once(lock, ticket):
            held = self._peek(lock)
            if held is not None and not claim_is_busy(*_holder(held), owner, time.time(), expired):
                remove_if(lock, lambda found: found == held, self._peek)
            return None
        try:
            return step()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)

    def renew(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float) -> bool:
        _, _, claim = self._paths(namespace, key, checksum)

        def step() -> bool:
            seen = self._peek(claim)
            if seen is None or _holder(seen)[0] != owner:
                return False
            replace_whole(claim, json.dumps({**json.loads(seen), "expires": time.time() + lease_seconds}).encode())
            return True

        return bool(self._writing(lambda: self._exclusively(claim, owner, _never, step)))

    def release(self, namespace: str, key: str, checksum: str, owner: str) -> None:
        _, _, claim = self._paths(namespace, key, checksum)
        self._writing(lambda: self._drop(claim, owner, _never))

    # -- many rows ----------------------------------------------------------------------

    def _names(self, folder: Path, wanted: re.Pattern) -> list[str]:
        """The names in ``folder`` that ``wanted`` matches, sorted; another name (not a dot
        file), or a folder this process may not list, is skipped with the one warning."""
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except PermissionError as err:  # another user's folder: its rows are not read
            self._skip(f"{folder} in the tune store folder {self._path}: {err}")
            return []
        foreign = [name for name in names if not name.startswith(".") and not wanted.fullmatch(name)]
        if foreign:
            self._skip(f"{folder / foreign[0]} in the tune store folder {self._path}: a name this "
                       f"store does not write")
        return [name for name in names if wanted.fullmatch(name)]

    _FOLDER = re.compile(_HASH.pattern)
    _FILE = re.compile(rf"{_HASH.pattern}({re.escape(_ROW)}|{re.escape(_CLAIM)}|{re.escape(_TAKEOVER)})")

    def _rows(self, folder: Path) -> list[Path]:
        return [folder / name for name in self._names(folder, self._FILE) if name.endswith(_ROW)]

    def _folders(self, selected: NamespaceFilter) -> list[Path]:
        if selected.namespace is not None:
            return [self._path / _digest(selected.namespace)]
        return [self._path / name for name in self._names(self._path, self._FOLDER)]

    def _entries_in(self, folder: Path, selected: NamespaceFilter) -> list[StoreEntry]:
        """The rows of one namespace folder when its namespace is selected."""
        found = []
        for path in self._rows(folder):
            entry = self._load(path)
            if entry is not None:
                if not selected.matches(entry.namespace):
                    return []  # every row of a folder has its one namespace
                found.append(entry)
        return found

    def entries(self, namespace: str | None = None, *,
                namespace_prefix: str | None = None) -> list[StoreEntry]:
        selected = NamespaceFilter.of(namespace, namespace_prefix)
        found = self._reading(lambda: [entry for folder in self._folders(selected)
                                       for entry in self._entries_in(folder, selected)], [])
        return sorted(found, key=lambda e: (e.namespace, e.key, e.checksum))

    def namespaces(self) -> list[str]:
        def body() -> list[str]:
            named = (next((e.namespace for e in map(self._load, self._rows(folder)) if e), None)
                     for folder in self._folders(NamespaceFilter()))
            return sorted(name for name in named if name is not None)

        return self._reading(body, [])

    def delete(self, namespace: str | None = None, *, namespace_prefix: str | None = None) -> int:
        """Remove the row files of the selected namespaces (all: every row file, bad ones
        too); claims, foreign files and the folders stay. How many files were removed."""
        selected = NamespaceFilter.of(namespace, namespace_prefix)

        def body() -> int:
            removed = 0
            for folder in self._folders(selected):
                if selected.prefix is not None and not self._entries_in(folder, selected):
                    continue
                for path in self._rows(folder):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        removed += 1
            return removed

        if not self._reading(lambda: True, False):
            return 0  # nothing stored yet: nothing created to be deleted
        return self._writing(body) or 0

    def delete_namespaces(self, namespaces: Iterable[str]) -> int:
        """``delete`` of each namespace given, one after the other."""
        return sum(self.delete(name) for name in dict.fromkeys(namespaces))

    def close(self) -> None:
        """Nothing is held open between calls."""
        with self._lock:
            self._opened = False
