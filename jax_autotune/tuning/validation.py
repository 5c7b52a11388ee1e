"""What an untrusted decision record may hold: JSON field types, and caps on its size.

The rules of a tune table's entries, which a row of the tune store must also meet
(``parse_entry``: tables, the store's readers). Every check raises ``TuneTableError``
naming the file (or database) and the field; ``LIMITS`` bounds the strings and counts a
table may carry, so a hostile table cannot copy a 200 MB string into the store or nest
deeper than the checks go.

    >>> from jax_autotune.tuning.validation import LIMITS, parse_entry
    >>> LIMITS["characters per string"]
    4096
    >>> parse_entry({"winner": 3}, "entries[0].", "t.json")
    TuneTableError: t.json: entries[0].key: missing (expected an object)
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from jax_autotune.errors import TuneTableError
from jax_autotune.tuning.decision import OUTCOMES, Decision

__all__ = ["LIMITS", "TuneTableError", "cap", "check_text_size", "field", "parse_entry", "shown"]

# What an untrusted table may carry (a cap exceeded is a TuneTableError that names it).
# A real entry is 5-15 KB of text and ~30 bytes per JSON value (13 or 33 candidates'
# results), so a table of 4,000 GPU keys is ~60 MB and 2 M values; one model has tens.
# Size and values are checked before parsing: json.loads costs up to ~60 bytes per value
# ("[]," is three), so refusing a hostile table costs a few times the text cap at most.
LIMITS = {"characters per string": 4096, "entries per device": 100_000, "devices": 1024,
          "candidates per device": 1000, "results per entry": 1000, "samples per result": 1000,
          "bounds fields": 64, "bytes of text": 2**26, "JSON values": 2**22}


_NUMBER = "number"
_SCALAR = (_NUMBER, str, type(None))


def _type_name(expected) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", list: "a list",
             dict: "an object", type(None): "null", _NUMBER: "a number"}
    return " or ".join(names[t] for t in (expected if isinstance(expected, tuple) else (expected,)))


def _matches(value: Any, expected) -> bool:
    for kind in expected if isinstance(expected, tuple) else (expected,):
        if kind is _NUMBER:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and _fits_float(value):
                return True
        elif kind in (int, float) and isinstance(value, bool):
            continue
        elif isinstance(value, kind):
            return True
    return False


def _fits_float(value: int | float) -> bool:
    """A JSON integer such as 10**400 is no number a time or a ratio can be."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def cap(count: int, limit: str, origin: str, where: str) -> None:
    """A TuneTableError when ``count`` is over ``LIMITS[limit]``, naming the cap."""
    if count > LIMITS[limit]:
        raise TuneTableError(f"{origin}: {where or 'the table'}: over the cap of "
                             f"{LIMITS[limit]:,} {limit} a tune table may carry")


def check_text_size(text: str | bytes, origin: str) -> None:
    """Cap a table's text before it is parsed: its length, and its JSON values, counted from
    above as its commas and opening brackets (those inside strings too).

        >>> check_text_size(b'{"schema": [' + b"0," * 2**22 + b"0]}", "t.json")
        TuneTableError: t.json: the table: over the cap of 4,194,304 JSON values a tune table may carry
    """
    cap(len(text), "bytes of text", origin, "")
    marks = (b",", b"[", b"{") if isinstance(text, bytes) else (",", "[", "{")
    cap(sum(text.count(mark) for mark in marks) + 1, "JSON values", origin, "")


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
                             f"got {shown(value)}")
    _check_strings(value, f"{where}{name}", origin)
    return value


def shown(value: Any, width: int = 80, depth: int = 0) -> str:
    """A short JSON view of ``value`` for an error message, cheap however large it is.

        >>> shown(["ab", 1, None, {"x": True}, 5])
        '["ab", 1, null, {"x": true}, ...]'
    """
    items = 4 if depth < 2 else 0
    if isinstance(value, str):
        text = json.dumps(value[:width])
    elif isinstance(value, dict):
        parts = [f"{json.dumps(str(k)[:20])}: {shown(v, 20, depth + 1)}"
                 for k, v in itertools.islice(value.items(), items)]
        text = "{" + ", ".join(parts + ["..."] * (len(value) > len(parts))) + "}"
    elif isinstance(value, list):
        parts = [shown(v, 20, depth + 1) for v in value[:items]]
        text = "[" + ", ".join(parts + ["..."] * (len(value) > len(parts))) + "]"
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = type(value).__name__
    return text[:width]


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
                                 f"object of those, got {shown(value)}")


_RESULT_FIELDS = {"name": (str, True), "outcome": (str, True), "round": (str, False),
                  "samples": (list, False), "score": ((_NUMBER, type(None)), False),
                  "pruned": (bool, False), "rel_error": ((_NUMBER, type(None)), False),
                  "error": (str, False), "paired_ratio": ((_NUMBER, type(None)), False)}
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
                raise TuneTableError(f"{origin}: {at}samples[{j}]: expected a number, got {shown(sample)}")
    try:
        return Decision.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise TuneTableError(f"{origin}: {where.rstrip('.')}: {err}") from None
