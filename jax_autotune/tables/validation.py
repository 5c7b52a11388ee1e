"""What an untrusted tune table may hold: JSON field types, and caps on its size.

Every check raises ``TuneTableError`` naming the file and the field; ``LIMITS`` bounds
the strings and counts a table may carry, so a hostile table cannot copy a 200 MB string
into the store or nest deeper than the checks go.

    >>> from jax_autotune.tables.validation import field, LIMITS
    >>> LIMITS["characters per string"]
    4096
"""

from __future__ import annotations

import json
from typing import Any

from jax_autotune.tuning.decision import OUTCOMES, Decision

__all__ = ["LIMITS", "TuneTableError", "cap", "field", "parse_entry"]

# what an untrusted table may carry (a cap exceeded is a TuneTableError that names it)
LIMITS = {"characters per string": 4096, "entries per device": 100_000, "devices": 1024,
          "candidates per device": 1000, "results per entry": 1000, "samples per result": 1000,
          "bounds fields": 64, "bytes of text": 2**30}


class TuneTableError(ValueError):
    """A tune table that cannot be read: not JSON, another schema or version, or a field of
    the wrong type. The message names the file (when known) and the field."""


_NUMBER = "number"
_SCALAR = (_NUMBER, str, type(None))


def _type_name(expected) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", list: "a list",
             dict: "an object", type(None): "null", _NUMBER: "a number"}
    return " or ".join(names[t] for t in (expected if isinstance(expected, tuple) else (expected,)))


def _matches(value: Any, expected) -> bool:
    for kind in expected if isinstance(expected, tuple) else (expected,):
        if kind is _NUMBER:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif kind in (int, float) and isinstance(value, bool):
            continue
        elif isinstance(value, kind):
            return True
    return False


def cap(count: int, limit: str, origin: str, where: str) -> None:
    """A TuneTableError when ``count`` is over ``LIMITS[limit]``, naming the cap."""
    if count > LIMITS[limit]:
        raise TuneTableError(f"{origin}: {where or 'the table'}: over the cap of "
                             f"{LIMITS[limit]:,} {limit} a tune table may carry")


def field(data: dict, name: str, expected, where: str, origin: str, *, required: bool = True):
    """``data[name]`` when it has the ``expected`` JSON type (and its strings are within the
    cap); a TuneTableError naming ``origin`` and the field otherwise.

        >>> field({"winner": 3}, "winner", str, "entries[0].", "t.json")
        TuneTableError: t.json: entries[0].winner: expected a string, got 3
    """
    if name not in data:
        if required:
            raise TuneTableError(f"{origin}: {where}{name}: missing (expected {_type_name(expected)})")
        return None
    value = data[name]
    if not _matches(value, expected):
        raise TuneTableError(f"{origin}: {where}{name}: expected {_type_name(expected)}, "
                             f"got {_shown(value)}")
    _check_strings(value, f"{where}{name}", origin)
    return value


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError, RecursionError):
        return type(value).__name__


def _check_strings(value: Any, where: str, origin: str) -> None:
    """Cap the strings of a field (itself, a list's items or an object's keys and values)."""
    items = value if isinstance(value, list) else [*value, *value.values()] if isinstance(value, dict) else [value]
    for item in items:
        if isinstance(item, str):
            cap(len(item), "characters per string", origin, where)


def _check_bounds(bounds: Any, where: str, origin: str) -> None:
    """Bounds hold numbers, strings, nulls or objects of those (``phase_seconds``): no deeper."""
    for name, value in (bounds or {}).items():
        if isinstance(value, dict):
            cap(len(value), "bounds fields", origin, f"{where}{name}")
            _check_strings(value, f"{where}{name}", origin)
            value = next((v for v in value.values() if not _matches(v, _SCALAR)), None)
        if not _matches(value, _SCALAR):
            raise TuneTableError(f"{origin}: {where}{name}: expected a number, a string, null or an "
                                 f"object of those, got {_shown(value)}")


_RESULT_FIELDS = {"name": (str, True), "outcome": (str, True), "round": (str, False),
                  "samples": (list, False), "score": ((_NUMBER, type(None)), False),
                  "pruned": (bool, False), "rel_error": ((_NUMBER, type(None)), False),
                  "error": (str, False)}
_ENTRY_FIELDS = {"key": (dict, True), "key_string": (str, False), "problem": (dict, True),
                 "winner": (str, True), "results": (list, False),
                 "bounds": ((dict, type(None)), False), "limit": ((_NUMBER, type(None)), False),
                 "tuning_seconds": (_NUMBER, False), "timestamp": (_NUMBER, False),
                 "device": (str, False), "checksum": (str, False), "source": (str, False),
                 "reason": (str, False), "export_kernel": (str, False),
                 "export_reason": (str, False)}


def parse_entry(data: Any, where: str, origin: str) -> Decision:
    """One table entry, validated field by field, as a ``Decision``."""
    if not isinstance(data, dict):
        raise TuneTableError(f"{origin}: {where.rstrip('.')}: expected an object, "
                             f"got {type(data).__name__}")
    for name, (expected, required) in _ENTRY_FIELDS.items():
        field(data, name, expected, where, origin, required=required)
    cap(len(data.get("bounds") or {}), "bounds fields", origin, f"{where}bounds")
    _check_bounds(data.get("bounds"), f"{where}bounds.", origin)
    cap(len(data.get("results") or []), "results per entry", origin, f"{where}results")
    for i, result in enumerate(data.get("results") or []):
        at = f"{where}results[{i}]."
        if not isinstance(result, dict):
            raise TuneTableError(f"{origin}: {at.rstrip('.')}: expected an object, "
                                 f"got {type(result).__name__}")
        for name, (expected, required) in _RESULT_FIELDS.items():
            field(result, name, expected, at, origin, required=required)
        if result["outcome"] not in OUTCOMES:
            raise TuneTableError(f"{origin}: {at}outcome: expected one of {', '.join(OUTCOMES)}, "
                                 f"got {result['outcome']!r}")
        cap(len(result.get("samples") or []), "samples per result", origin, f"{at}samples")
        for j, sample in enumerate(result.get("samples") or []):
            if not _matches(sample, _NUMBER):
                raise TuneTableError(f"{origin}: {at}samples[{j}]: expected a number, got {sample!r}")
    try:
        return Decision.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise TuneTableError(f"{origin}: {where.rstrip('.')}: {err}") from None
