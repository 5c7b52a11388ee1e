"""The memory-only store: nothing outlives the process.

What ``cache = 0`` or ``store = memory`` gives: reads miss, writes are dropped, and
every claim is granted at once, so the tuner's own memory table is where decisions live
(each process tunes its keys again). Values are still checked (a value that is not a
JSON-serializable dict is a caller's bug, raised here too).

    >>> from jax_autotune.tuning.memory_store import MemoryStore
    >>> store = MemoryStore()
    >>> store.put("ns", "k", "c", {"x": 1}), store.get("ns", "k", "c"), store.available
    (False, None, False)
"""

from __future__ import annotations

from typing import Any, Iterable

from jax_autotune.tuning.store_protocol import (Claim, Expired, Keep, NamespaceFilter, Store, StoreEntry,
                                                encode_value)

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """A store that keeps nothing; ``why`` names the setting that chose it.

        >>> MemoryStore(why="store = memory").check()
        'the disk store is off (store = memory)'
    """

    kind = "memory"

    def __init__(self, *, why: str = "cache = 0") -> None:
        super().__init__(None)
        self.why = why

    def check(self, write: bool = False) -> str:
        return f"the disk store is off ({self.why})"

    def _open(self, create: bool) -> None:
        return None

    def get(self, namespace: str, key: str, checksum: str) -> dict | None:
        return None

    def put_many(self, rows: Iterable[tuple[str, str, str, dict]]) -> bool:
        for _, _, _, value in rows:
            encode_value(value)
        return False

    def put_if_absent(self, namespace: str, key: str, checksum: str, value: dict,
                      keep: Keep = lambda value: True) -> tuple[dict, bool]:
        encode_value(value)
        return value, True

    def claim(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float,
              expired: Expired = lambda owner, expires: False,
              keep: Keep = lambda value: True) -> tuple[Claim, Any]:
        return Claim.CLAIMED, None

    def renew(self, namespace: str, key: str, checksum: str, owner: str, lease_seconds: float) -> bool:
        return False

    def release(self, namespace: str, key: str, checksum: str, owner: str) -> None:
        return None

    def delete(self, namespace: str | None = None, *, namespace_prefix: str | None = None) -> int:
        NamespaceFilter.of(namespace, namespace_prefix)  # the same argument check
        return 0

    def delete_namespaces(self, namespaces: Iterable[str]) -> int:
        return 0

    def entries(self, namespace: str | None = None, *,
                namespace_prefix: str | None = None) -> list[StoreEntry]:
        NamespaceFilter.of(namespace, namespace_prefix)
        return []

    def namespaces(self) -> list[str]:
        return []

    def close(self) -> None:
        return None
