"""What every tune store is: its methods (``Store``), its row (``StoreEntry``), and the
rules all backends share (the namespace filter, how a row's text is decoded, when a claim
is busy).

A store maps (namespace, key, checksum) to a JSON object. The backends (``sqlite_store``,
``directory_store``, ``memory_store``) differ in where rows live, never in what a row
is: a value that is not a JSON object, or that is over the caps of ``tuning.validation``,
is a bad row, skipped with one ``StoreWarning`` per store; a namespace prefix is
matched character for character; a claim is busy while another owner's lease runs and
``expired`` does not say its owner is gone. None of them raises for disk trouble: it
warns once and from then on behaves as a memory-only store.

    >>> from jax_autotune.tuning.store import open_store
    >>> store = open_store(config.store_choice())  # the backend the settings name
    >>> store.put("throughput/0.1.0/cpu", "peaks", "v1", {"flops": 1e12})
    True
    >>> store.get("throughput/0.1.0/cpu", "peaks", "v1")
    {'flops': 1e12}
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from jax_autotune.errors import StoreWarning
from jax_autotune.tuning.validation import TuneTableError, check_text_size

__all__ = ["Store", "StoreEntry", "NamespaceFilter", "Claim", "claim_is_busy", "decode_value",
           "encode_value"]

Keep = Callable[[dict], bool]
Expired = Callable[[str, float], bool]


class Claim(enum.StrEnum):
    """What ``Store.claim`` found: a decision stored (with its value), the key claimed for
    this owner, or another owner's claim in force (with its holder)."""

    DECIDED = "decided"
    CLAIMED = "claimed"
    BUSY = "busy"


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


@dataclasses.dataclass(frozen=True)
class NamespaceFilter:
    """An exact namespace, a namespace prefix (character for character: '_' and '%' are
    ordinary), or (neither) every namespace.

        >>> NamespaceFilter.of(None, "autotune/").matches("autotune/0.1.0/x/matmul")
        True
    """

    namespace: str | None = None
    prefix: str | None = None

    @classmethod
    def of(cls, namespace: str | None, namespace_prefix: str | None) -> NamespaceFilter:
        if namespace is not None and namespace_prefix is not None:
            raise ValueError("give namespace or namespace_prefix, not both")
        return cls(namespace, namespace_prefix)

    def matches(self, namespace: str) -> bool:
        if self.namespace is not None:
            return namespace == self.namespace
        return self.prefix is None or namespace.startswith(self.prefix)


def encode_value(value: dict) -> str:
    """A value's stored text; TypeError/ValueError for one that is not a JSON-serializable
    dict (a caller's bug, raised by every backend, the memory-only one too)."""
    if not isinstance(value, dict):
        raise TypeError(f"value: expected a dict, got {type(value).__name__}")
    return json.dumps(value, sort_keys=True)


def decode_value(text: Any) -> dict:
    """The JSON object stored as ``text``; ValueError (or TypeError) when it is not one,
    or when it is over a tune table's caps (``validation.check_text_size``).

        >>> decode_value('[1, 2]')
        ValueError: expected a JSON object, got list
    """
    try:
        check_text_size(text, "the row")
    except TuneTableError as err:
        raise ValueError(str(err)) from None
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def claim_is_busy(holder: str, expires: float, owner: str, now: float, expired: Expired) -> bool:
    """Whether a claim held by ``holder`` until ``expires`` keeps ``owner`` out: another
    owner, a lease still running, and ``expired(holder, expires)`` (its process is gone)
    does not say so."""
    return holder != owner and expires > now and not expired(holder, expires)


class Store(abc.ABC):
    """A (namespace, key, checksum) -> JSON object store that never raises for disk
    trouble. The methods every backend has, and the state and warnings they share.

        >>> with open_store(config.store_choice()) as store:
        ...     store.claim(ns, "k1", "c1", "host:123:ab", lease_seconds=15)
        ('claimed', None)
    """

    kind = "store"  # how messages name the location: 'database', 'folder'
    _disk_errors: tuple[type[BaseException], ...] = (OSError,)  # what "the disk does not work" raises

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.RLock()
        self._failed = False
        self._error = ""  # why the store failed, once it did
        self._read_only = False
        self._warned_failure = False
        self._warned_bad_row = False

    @property
    def path(self) -> Path | None:
        """Where the rows live (a database file, a folder); None for a memory-only store."""
        return self._path

    @property
    def available(self) -> bool:
        """Whether the disk is in use: False for a memory-only store or after a failure."""
        return self._path is not None and not self._failed

    @property
    def read_only(self) -> bool:
        """True once the store was opened read-only (writes are dropped)."""
        return self._read_only

    def check(self, write: bool = False) -> str:
        """'' when the store can be read now (``write``: and written; this creates it), else
        why not, in one line, without the failure warning. A missing store reads as empty.

            >>> SqliteStore("/proc/x/default.db").check(write=True)
            'cannot use /proc/x/default.db: FileNotFoundError: ...'
        """
        with self._lock:
            if not self._failed:
                try:
                    self._open(create=write)
                except self._disk_errors as err:
                    self._fail(err, warn=False)
            if self._failed:
                return f"cannot use {self._path}: {self._error}"
            if write and self._read_only:
                return f"cannot write {self._path}: it is read-only for this process"
        return ""

    @abc.abstractmethod
    def _open(self, create: bool) -> Any:
        """Make the store ready to read (``create``: and made if missing); raises one of
        ``_disk_errors`` when it cannot be used. Call with the lock held."""

    @abc.abstractmethod
    def get(self, namespace: str, key: str, checksum: str) -> dict | None:
        """The stored value, or None (missing, other checksum, memory-only, bad row)."""

    def put(self, namespace: str, key: str, checksum: str, value: dict) -> bool:
        """Store ``value`` under (namespace, key, checksum), replacing any earlier value;
        False when it was not written (see ``put_many``)."""
        return self.put_many([(namespace, key, checksum, value)])

    @abc.abstractmethod
    def put_many(self, rows: Iterable[tuple[str, str, str, dict]]) -> bool:
        """Store (namespace, key, checksum, value) rows; False when they were not written
        (memory-only, read-only, or a disk error, which warns once)."""

    @abc.abstractmethod
    def put_if_absent(self, namespace: str, key: str, checksum: str, value: dict,
                      keep: Keep = lambda value: True) -> tuple[dict, bool]:
        """Store ``value`` unless a value ``keep`` accepts is stored already, and drop the
        key's claim: (the stored value, whether it is ``value``). Memory-only: (value, True)."""

    @abc.abstractmethod
    def claim(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float,
              expired: Expired = lambda owner, expires: False,
              keep: Keep = lambda value: True) -> tuple[Claim, Any]:
        """``(Claim.DECIDED, value)``, ``(Claim.CLAIMED, None)`` or ``(Claim.BUSY, holder)``:
        one step towards tuning a key once per store. Memory-only: always ``CLAIMED``."""

    @abc.abstractmethod
    def renew(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s lease; False when it no longer holds the claim."""

    @abc.abstractmethod
    def release(self, namespace: str, key: str, checksum: str, owner: str) -> None:
        """Drop ``owner``'s claim without a decision (others may claim at once)."""

    @abc.abstractmethod
    def delete(self, namespace: str | None = None, *, namespace_prefix: str | None = None) -> int:
        """Remove the rows of a namespace, a namespace prefix, or all; how many."""

    @abc.abstractmethod
    def delete_namespaces(self, namespaces: Iterable[str]) -> int:
        """Remove the rows of every namespace given; how many."""

    @abc.abstractmethod
    def entries(self, namespace: str | None = None, *,
                namespace_prefix: str | None = None) -> list[StoreEntry]:
        """The rows of a namespace, a prefix, or all, by (namespace, key, checksum)."""

    @abc.abstractmethod
    def namespaces(self) -> list[str]:
        """The distinct namespaces present, sorted."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of what the store holds open (idempotent); a later call reopens it."""

    def skip_row(self, namespace: str, key: str, checksum: str, reason: str) -> None:
        """Warn, once per store, that a row is treated as missing: its value is not a JSON
        object, or not a record its reader accepts (``decisions.stored_decision``).

            >>> store.skip_row(ns, "k1", "c1", "results[0].score: expected a number")
        """
        self._skip(f"a bad row in the tune store {self.kind} {self._path} (namespace="
                   f"{namespace!r}, key={key!r}, checksum={checksum!r}): {reason}")

    def _skip(self, what: str) -> None:
        self._warn_once("_warned_bad_row", f"skipping {what}. That entry (and any other bad row "
                        f"of this {self.kind}) is treated as missing until it is re-tuned.", 5)

    def _warn_once(self, flag: str, message: str, stacklevel: int) -> None:
        """Set the attribute ``flag``; warn the first time only."""
        if not getattr(self, flag):
            setattr(self, flag, True)
            warnings.warn(f"jax_autotune: {message}", StoreWarning, stacklevel=stacklevel + 1)

    def _decode(self, namespace: str, key: str, checksum: str, text: Any) -> dict | None:
        """The row's value as a dict, or None (with the one bad-row warning)."""
        try:
            return decode_value(text)
        except (TypeError, ValueError, RecursionError) as err:
            self.skip_row(namespace, key, checksum, str(err))
            return None

    def _fail(self, err: BaseException, warn: bool = True) -> None:
        """Fall back to memory-only, warning once. Call with the lock held."""
        self._failed, self._error = True, f"{type(err).__name__}: {err}"
        self.close()
        if warn:
            self._warn_once("_warned_failure", f"cannot use the tune store {self.kind} {self._path}: "
                            f"{self._error}. Tuning decisions stay in memory for this process "
                            f"(they will be re-tuned next time).", 3)

    def _become_read_only(self) -> None:
        """Read from now on, drop writes; one warning. Call with the lock held."""
        self._warn_once("_read_only", f"the tune store {self.kind} {self._path} is read-only for "
                        f"this process: its decisions are used, new ones stay in memory (they "
                        f"are tuned again by the next process).", 6)

    def __repr__(self) -> str:
        state = ("memory-only" if not self.available else "read-only" if self._read_only
                 else "on disk")
        return f"{type(self).__name__}({str(self._path) if self._path else None!r}, {state})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
