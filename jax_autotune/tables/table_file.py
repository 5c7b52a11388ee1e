"""Tune tables: the decisions of one or several devices, portable as one versioned JSON file.

A ``TuneTable`` holds, per device fingerprint, the candidate-set checksum, the candidate
names and every decision (the winner and every candidate's results). It is how a model
ships its kernel choices: export it, import it elsewhere, or put it in an orbax
checkpoint next to the parameters (see ``jax_autotune.checkpoint``).

    >>> from jax_autotune.tables.table_file import TuneTable
    >>> TuneTable.load("tune_table.json")                # validated, nothing installed
    TuneTable(2 devices, 41 entries)

File format (``schema_version`` 1; JSON only, nothing is ever unpickled)::

    {"schema": "jax_autotune.tune_table", "schema_version": 1,
     "jax_autotune_version": "0.1.0", "jax_version": "0.10.2",
     "created": "2025-01-01T00:00:00Z",
     "devices": {"<fingerprint>": {"checksum": "<candidate-set checksum>",
                                   "candidates": ["xla_dot", ...],
                                   "entries": [<Decision.to_json()>, ...]},
                 "<fingerprint>/grouped": {...}},
     "attention": {"<fingerprint>": [{"key": "attention:...", "checksum": "...",
                                      "value": <AttentionDecision.to_json()>}, ...]},
     "programs": {"<fingerprint>": [{"key": "<program identity>", "checksum": "...",
                                     "value": <ProgramRecord.to_json()>}, ...]}}

``attention`` and ``programs`` (optional; written only when there are some) carry what a
``jat.autotune`` program decides beside its matmuls: each attention's decision (fused or as
written) and each whole-program check (the keys it leaves plain), with the checksum each
is kept under, so that a shipped model neither decides its attentions again nor runs
slower than plain where the check found it would. A row whose value is no decision or
record is skipped, counted in the same one warning.

A section holds one candidate set: a device's grouped matmuls (``lax.ragged_dot``), whose
set is another, are the section ``<fingerprint>/grouped``
(``jax_autotune.tables.install.section_name``); this module reads a section's name as an
opaque string.

Loading validates: text that is not UTF-8 JSON (or nested too deep to parse), another
schema or schema version, a field of the wrong type, or a table over its caps raise
``TuneTableError`` naming the field; ``LIMITS`` caps what an untrusted table can carry
(string length, counts; its size and JSON values before it is parsed). Only a regular
file is read (``jax_autotune.files.open_regular``). An entry this build cannot
use is skipped, with ONE ``TuneTableWarning`` per load giving the count: its checksum
differs from its device's, its winner is not among its device's candidates, or (for a
device whose candidate set the reader passes in as ``known``) the device's checksum or
the winner is unknown to this build's candidate set. Entries of other devices are kept (a
table may carry several GPU kinds) but never installed. The versions in the file are
informational: the candidate-set checksum is what decides whether an entry is usable.
Reading is pure: it builds no tuner and opens no store (``jax_autotune.tables.install``
connects tables to the runtime).

Merge rule (``TuneTable.merge``): newer wins. Attention decisions and program checks carry
no time: per (device, key, checksum), ``other``'s wins. Per (device, key), the entry with the
larger ``timestamp`` wins (a tie keeps ``self``'s). If the two tables disagree on a
device's candidate-set checksum, that device's whole section comes from the table whose
newest entry for it is newer (decisions of two candidate sets never mix). Devices present
in only one table are kept as they are.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import math
import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax

from jax_autotune.errors import TuneTableWarning
from jax_autotune._version import __version__
from jax_autotune.key import MatmulKey
from jax_autotune.tables.summary import SummaryRow, key_id, matches, summarize
from jax_autotune.files import open_regular
from jax_autotune.tuning.validation import (LIMITS, TuneTableError, cap, check_text_size, field,
                                            parse_entry, shown)
from jax_autotune.tuning.attention_decisions import AttentionDecision
from jax_autotune.tuning.decision import Decision
from jax_autotune.tuning.programs import ProgramRecord

__all__ = ["LIMITS", "SCHEMA", "SCHEMA_VERSION", "CandidateSetInfo", "DeviceTable", "KeptRow", "TuneTable",
           "TuneTableError", "TuneTableWarning"]

SCHEMA = "jax_autotune.tune_table"
SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class CandidateSetInfo:
    """What this build knows of one device's candidate set: its checksum and names.

    Reading a table against these (``TuneTable.loads(..., known=...)``) skips the entries
    this build cannot use; ``jax_autotune.tables.install`` makes them from live tuners.

        >>> CandidateSetInfo("9f3c...", frozenset({"xla_dot", "native_gemm_avx2_6x16_t1"}))
    """

    checksum: str
    names: frozenset[str]


# ---------------------------------------------------------------- one device's section

@dataclasses.dataclass(frozen=True)
class DeviceTable:
    """The decisions of one device fingerprint, all from one candidate set.

        >>> section = DeviceTable("abc123", ("xla_dot", "native_gemm"), (decision,))
        >>> section.entry(decision.key).winner                       # doctest: +SKIP
        'native_gemm'
    """

    checksum: str
    candidates: tuple[str, ...]
    entries: tuple[Decision, ...] = ()  # sorted by canonical key

    def __post_init__(self):
        object.__setattr__(self, "candidates", tuple(self.candidates))
        ordered = sorted(self.entries, key=lambda d: d.key.canonical())
        object.__setattr__(self, "entries", tuple(ordered))

    def entry(self, key: MatmulKey) -> Decision | None:
        for decision in self.entries:
            if decision.key == key:
                return decision
        return None

    @property
    def newest(self) -> float:
        """The newest entry's timestamp (-inf for an empty section)."""
        return max((d.timestamp for d in self.entries), default=-math.inf)

    def to_json(self) -> dict[str, Any]:
        return {"checksum": self.checksum, "candidates": list(self.candidates),
                "entries": [d.to_json() for d in self.entries]}


@dataclasses.dataclass(frozen=True)
class KeptRow:
    """An attention decision or a whole-program check a table carries for a device: its
    store key (the attention key's canonical string, or the program's identity), the
    checksum it is kept under, and its value (``AttentionDecision.to_json()``,
    ``ProgramRecord.to_json()``).

        >>> KeptRow(decision.key.canonical(), checksum, decision.to_json())
    """

    key: str
    checksum: str
    value: dict

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "checksum": self.checksum, "value": self.value}


def _attention_row(row: KeptRow) -> bool:
    decision = AttentionDecision.from_json(row.value)
    return decision is not None and decision.key.canonical() == row.key


def _program_row(row: KeptRow) -> bool:
    return ProgramRecord.from_json(row.value) is not None


KEPT = {"attention": (_attention_row, "an attention row whose value is no decision"),  # a table's kept
        "programs": (_program_row, "a program row whose value is no check")}  # rows: valid, else why skipped


def _merged_rows(ours: Mapping[str, tuple[KeptRow, ...]],
                 theirs: Mapping[str, tuple[KeptRow, ...]]) -> dict[str, tuple[KeptRow, ...]]:
    """Per device, the rows of both, ``theirs`` winning per (key, checksum)."""
    merged = {fp: {(r.key, r.checksum): r for r in rows} for fp, rows in ours.items()}
    for fingerprint, rows in theirs.items():
        merged.setdefault(fingerprint, {}).update({(r.key, r.checksum): r for r in rows})
    return {fp: tuple(rows.values()) for fp, rows in merged.items()}


# ---------------------------------------------------------------- the table

@dataclasses.dataclass(frozen=True, eq=True)
class TuneTable:
    """Decisions of one or several devices, keyed by device fingerprint.

        >>> t = TuneTable.load("tune_table.json")
        >>> t.merge(table()).save("tune_table.json")
        >>> [row.winner for row in t.summary_rows()]
        ['native_gemm_avx2_6x16_t2', 'xla_dot']
    """

    devices: Mapping[str, DeviceTable] = dataclasses.field(default_factory=dict)
    attention: Mapping[str, tuple[KeptRow, ...]] = dataclasses.field(default_factory=dict)  # per fingerprint
    programs: Mapping[str, tuple[KeptRow, ...]] = dataclasses.field(default_factory=dict)  # per fingerprint
    jax_autotune_version: str = ""
    jax_version: str = ""
    created: str = ""

    __hash__ = None  # holds a dict

    def __post_init__(self):
        if not self.jax_autotune_version or not self.jax_version:
            object.__setattr__(self, "jax_autotune_version", self.jax_autotune_version or __version__)
            object.__setattr__(self, "jax_version", self.jax_version or jax.__version__)
        if not self.created:
            now = datetime.datetime.now(datetime.timezone.utc)
            object.__setattr__(self, "created", now.strftime("%Y-%m-%dT%H:%M:%SZ"))
        object.__setattr__(self, "devices", dict(sorted(self.devices.items())))
        for name in KEPT:
            rows = {fp: tuple(sorted(rows, key=lambda r: (r.key, r.checksum)))
                    for fp, rows in sorted(getattr(self, name).items()) if rows}
            object.__setattr__(self, name, rows)

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(section.entries) for section in self.devices.values())

    def __repr__(self) -> str:
        return f"TuneTable({len(self.devices)} devices, {len(self)} entries)"

    def entries(self, device: str | None = None) -> Iterator[tuple[str, Decision]]:
        """(fingerprint, decision) pairs, of one device or of all."""
        for fingerprint, section in self.devices.items():
            if device is None or fingerprint == device:
                for decision in section.entries:
                    yield fingerprint, decision

    def find(self, key: str, device: str | None = None) -> list[tuple[str, Decision]]:
        """The entries whose key matches ``key``: a key id or a compact key as ``show``
        prints them, a canonical key string, or else as ``show --key`` matches (``matches``).

            >>> [d.winner for _, d in t.find("m=1024 n=1024 k=1024")]     # doctest: +SKIP
            ['xla_dot']
        """
        pairs = list(self.entries(device))
        text = " ".join(key.split())
        for exact in (lambda d: key_id(d.key) == text, lambda d: d.key.canonical() == text,
                      lambda d: d.key.describe() == text):
            found = [(fp, d) for fp, d in pairs if exact(d)]
            if found:
                return found
        return [(fp, d) for fp, d in pairs if matches(d.key, text)]

    def summary_rows(self, device: str | None = None, key: str | None = None) -> list[SummaryRow]:
        """One ``SummaryRow`` per entry, optionally of one device and of keys containing
        ``key`` (in the canonical key string or the compact form, or equal to the key id)."""
        return [summarize(fingerprint, decision) for fingerprint, decision in self.entries(device)
                if not key or matches(decision.key, key)]

    # -- combining ----------------------------------------------------------------------

    def merge(self, other: "TuneTable") -> "TuneTable":
        """A new table: newer wins (see the module docstring for the exact rule).

            >>> shipped.merge(table())     # local re-tunes replace older shipped entries
            TuneTable(2 devices, 43 entries)
        """
        if not isinstance(other, TuneTable):
            raise TypeError(f"other: expected a TuneTable, got {type(other).__name__}")
        devices = dict(self.devices)
        for fingerprint, theirs in other.devices.items():
            ours = devices.get(fingerprint)
            if ours is None:
                devices[fingerprint] = theirs
            elif ours.checksum != theirs.checksum:
                if theirs.newest > ours.newest:
                    devices[fingerprint] = theirs
            else:
                merged = {d.key: d for d in ours.entries}
                for decision in theirs.entries:
                    mine = merged.get(decision.key)
                    if mine is None or decision.timestamp > mine.timestamp:
                        merged[decision.key] = decision
                candidates = ours.candidates + tuple(c for c in theirs.candidates
                                                     if c not in ours.candidates)
                devices[fingerprint] = DeviceTable(ours.checksum, candidates,
                                                   tuple(merged.values()))
        return TuneTable(devices, **{name: _merged_rows(getattr(self, name), getattr(other, name))
                                     for name in KEPT})

    # -- JSON ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "jax_autotune_version": self.jax_autotune_version, "jax_version": self.jax_version,
            "created": self.created,
            "devices": {fp: section.to_json() for fp, section in self.devices.items()},
            **{name: {fp: [r.to_json() for r in rows] for fp, rows in getattr(self, name).items()}
               for name in KEPT if getattr(self, name)},
        }

    def dumps(self) -> str:
        """The table as JSON text (what ``save`` writes)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike, *, overwrite: bool = True) -> Path:
        """Write the table as JSON to ``path`` atomically (a temporary file, then a rename),
        with the permissions the umask gives a new file. ``overwrite=False``: a
        ``FileExistsError`` if ``path`` exists (checked atomically; nothing is replaced).

            >>> table().save("tune_table.json")
            PosixPath('tune_table.json')
        """
        path = Path(os.fspath(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:  # a new file opened with mode 0o666, so the umask applies (mkstemp: 0o600)
            tmp = path.parent / f".{path.name}.{os.urandom(4).hex()}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileExistsError:
                continue
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.dumps())
            if overwrite:
                os.replace(tmp, path)
            else:
                _link_new(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *,
             known: Mapping[str, CandidateSetInfo] | None = None) -> "TuneTable":
        """Read and validate a table file (see the module docstring). ``known`` holds, per
        device fingerprint, the candidate set this build has for it: entries it cannot use
        are skipped (``jax_autotune.tables.install.read_table`` passes this process's).
        A missing file raises ``FileNotFoundError``.

            >>> TuneTable.load("tune_table.json")
            TuneTable(1 devices, 12 entries)
        """
        origin = str(path)
        local = isinstance(path, (str, os.PathLike)) and not (
            hasattr(path, "open") and "://" in os.fspath(path))  # not an epath.Path of a bucket
        if local:  # a regular file, its size checked before it is read
            with open_regular(path) as f:
                cap(os.fstat(f.fileno()).st_size, "bytes of text", origin, "")
                raw = f.read(LIMITS["bytes of text"] + 1)
        else:
            with path.open("rb") as f:
                raw = f.read(LIMITS["bytes of text"] + 1)
        check_text_size(raw, origin)
        text = _decoded(raw, origin)
        del raw  # parse with one copy of the text alive
        return cls.loads(text, known=known, origin=origin)

    @classmethod
    def loads(cls, text: str | bytes, *, known: Mapping[str, CandidateSetInfo] | None = None,
              origin: str = "tune table") -> "TuneTable":
        """Parse and validate JSON text; ``origin`` names the source in errors and warnings.
        Its size and value count are capped before it is parsed (``check_text_size``)."""
        check_text_size(text, origin)
        try:
            data = json.loads(_decoded(text, origin))
        except (ValueError, RecursionError) as err:
            raise _not_json(origin, err) from None
        return cls.from_json(data, known=known, origin=origin)

    @classmethod
    def from_json(cls, data: Any, *, known: Mapping[str, CandidateSetInfo] | None = None,
                  origin: str = "tune table") -> "TuneTable":
        """Validate a decoded JSON object (see the module docstring for the rules)."""
        try:
            return _parse(data, known or {}, origin)
        except RecursionError:
            raise TuneTableError(f"{origin}: nested too deep to be a tune table") from None


# ---------------------------------------------------------------- validation

def _not_json(origin: str, err: BaseException) -> TuneTableError:
    return TuneTableError(f"{origin}: not a JSON tune table in UTF-8 "
                          f"({type(err).__name__}: {str(err)[:200]})")


def _decoded(text: str | bytes, origin: str) -> str:
    try:
        return text.decode("utf-8") if isinstance(text, bytes) else text
    except UnicodeDecodeError as err:
        raise _not_json(origin, err) from None


def _parse(data: Any, known_sets: Mapping[str, CandidateSetInfo], origin: str) -> TuneTable:
    if not isinstance(data, dict):
        raise TuneTableError(f"{origin}: expected a JSON object at the top, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise TuneTableError(f"{origin}: schema: expected {SCHEMA!r}, got {shown(schema)}")
    version = field(data, "schema_version", int, "", origin)
    if version != SCHEMA_VERSION:
        raise TuneTableError(f"{origin}: schema_version: this build reads version {SCHEMA_VERSION}, "
                             f"got {version} (upgrade jax_autotune to read it)")
    header = {name: field(data, name, str, "", origin)
              for name in ("jax_autotune_version", "jax_version", "created")}
    raw_devices = field(data, "devices", dict, "", origin)
    cap(len(raw_devices), "devices", origin, "devices")

    skipped: Counter[str] = Counter()
    devices: dict[str, DeviceTable] = {}
    for fingerprint, raw in raw_devices.items():
        where = f"devices[{json.dumps(fingerprint)}]."
        if not isinstance(raw, dict):
            raise TuneTableError(f"{origin}: {where.rstrip('.')}: expected an object, "
                                 f"got {type(raw).__name__}")
        checksum = field(raw, "checksum", str, where, origin)
        candidates = field(raw, "candidates", list, where, origin)
        cap(len(candidates), "candidates per device", origin, f"{where}candidates")
        for i, name in enumerate(candidates):
            if not isinstance(name, str):
                raise TuneTableError(f"{origin}: {where}candidates[{i}]: expected a string, got {shown(name)}")
        raw_entries = field(raw, "entries", list, where, origin)
        cap(len(raw_entries), "entries per device", origin, f"{where}entries")
        this_build = known_sets.get(fingerprint)
        known = set(candidates) if this_build is None else set(candidates) & this_build.names
        kept: dict[MatmulKey, Decision] = {}
        for i, raw_entry in enumerate(raw_entries):
            decision = parse_entry(raw_entry, f"{where}entries[{i}].", origin)
            if (decision.checksum and decision.checksum != checksum) or (
                    this_build is not None and checksum != this_build.checksum):
                skipped["a candidate-set checksum other than this build's"] += 1
                continue
            if decision.winner not in known:
                skipped["a winner that is not a candidate of this build"] += 1
                continue
            decision = dataclasses.replace(decision, device=fingerprint, checksum=checksum)
            previous = kept.get(decision.key)
            if previous is None or decision.timestamp > previous.timestamp:
                kept[decision.key] = decision
        devices[fingerprint] = DeviceTable(checksum, tuple(candidates), tuple(kept.values()))
    kept = {name: _kept_rows(data, name, skipped, origin) for name in KEPT}
    if skipped:
        total = sum(skipped.values())
        reasons = "; ".join(f"{n} with {why}" for why, n in skipped.items())
        warnings.warn(f"jax_autotune: {origin}: skipped {total} tune-table "
                      f"entr{'y' if total == 1 else 'ies'} this build cannot use ({reasons}). "
                      f"Those keys are not installed; tune them on this device "
                      f"(jax_autotune.warmup) and export a new table.",
                      TuneTableWarning, stacklevel=4)
    return TuneTable(devices, **kept, **header)


def _kept_rows(data: dict, name: str, skipped: Counter, origin: str) -> dict[str, tuple[KeptRow, ...]]:
    """The ``name`` rows of a table (``KEPT``), validated; the invalid ones counted in ``skipped``."""
    valid, why = KEPT[name]
    raw_devices = field(data, name, dict, "", origin, required=False) or {}
    cap(len(raw_devices), "devices", origin, name)
    rows: dict[str, tuple[KeptRow, ...]] = {}
    for fingerprint, raw_rows in raw_devices.items():
        where = f"{name}[{json.dumps(fingerprint)}]"
        if not isinstance(raw_rows, list):
            raise TuneTableError(f"{origin}: {where}: expected a list, got {type(raw_rows).__name__}")
        cap(len(raw_rows), "entries per device", origin, where)
        found = []
        for i, raw in enumerate(raw_rows):
            if not isinstance(raw, dict):
                raise TuneTableError(f"{origin}: {where}[{i}]: expected an object, got {type(raw).__name__}")
            row = KeptRow(*(field(raw, f, str, f"{where}[{i}].", origin) for f in ("key", "checksum")),
                          field(raw, "value", dict, f"{where}[{i}].", origin))
            if valid(row):
                found.append(row)
            else:
                skipped[why] += 1
        rows[fingerprint] = tuple(found)
    return rows


def _link_new(source: Path, path: Path) -> None:
    """Give ``source`` the new name ``path``; a FileExistsError if ``path`` exists, even if
    another process makes it meanwhile (a hard link never replaces)."""
    try:
        os.link(source, path)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: check, then rename
        if path.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.replace(source, path)
