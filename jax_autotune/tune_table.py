"""Tune tables: the decisions of one or several devices, portable as one versioned JSON file.

A ``TuneTable`` holds, per device fingerprint, the candidate-set checksum, the candidate
names and every decision (the winner and every candidate's results). It is how a model
ships its kernel choices: export it, import it elsewhere, or put it in an orbax
checkpoint next to the parameters (see ``jax_autotune.checkpoint``).

    >>> from jax_autotune.tune_table import TuneTable, load_table, table
    >>> table().save("tune_table.json")                  # this process + the store
    >>> load_table("tune_table.json")                    # another process or machine
    TuneTable(2 devices, 41 entries)

File format (``schema_version`` 1; JSON only, nothing is ever unpickled)::

    {"schema": "jax_autotune.tune_table", "schema_version": 1,
     "jax_autotune_version": "0.1.0", "jax_version": "0.10.2",
     "created": "2025-01-01T00:00:00Z",
     "devices": {"<fingerprint>": {"checksum": "<candidate-set checksum>",
                                   "candidates": ["xla_dot", ...],
                                   "entries": [<Decision.to_json()>, ...]}}}

Loading validates: text that is not JSON, another schema or schema version, or a field
of the wrong type raise ``TuneTableError`` naming the field. An entry this build cannot
use is skipped, with ONE ``TuneTableWarning`` per load giving the count: its checksum
differs from its device's, its winner is not among its device's candidates, or (for a
device this process has a tuner for) the device's checksum or the winner is unknown to
this build's candidate set. Entries of other devices are kept (a table may carry several
GPU kinds) but never installed. The versions in the file are informational: the
candidate-set checksum is what decides whether an entry is usable.

Merge rule (``TuneTable.merge``): newer wins. Per (device, key), the entry with the
larger ``timestamp`` wins (a tie keeps ``self``'s). If the two tables disagree on a
device's candidate-set checksum, that device's whole section comes from the table whose
newest entry for it is newer (decisions of two candidate sets never mix). Devices present
in only one table are kept as they are.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from jax_autotune.decision import OUTCOMES, Decision
from jax_autotune.key import MatmulKey
from jax_autotune.tuner import built_tuners

if TYPE_CHECKING:
    from jax_autotune.tuner import Tuner

__all__ = [
    "SCHEMA", "SCHEMA_VERSION", "DeviceTable", "SummaryRow", "TuneTable", "TuneTableError",
    "describe_key",
    "TuneTableWarning", "current_tuners", "install_table", "key_id",
    "load_table", "table",
]

SCHEMA = "jax_autotune.tune_table"
SCHEMA_VERSION = 1
XLA_DOT_NAME = "xla_dot"  # the baseline every summary compares with


class TuneTableError(ValueError):
    """A tune table that cannot be read: not JSON, another schema or version, or a field of
    the wrong type. The message names the file (when known) and the field."""


class TuneTableWarning(UserWarning):
    """Entries of a tune table were skipped because this build cannot use them."""


def key_id(key: MatmulKey) -> str:
    """A short stable handle of a key (``jax-autotune show`` prints it, ``explain`` takes it).

        >>> key_id(MatmulKey.parse(text))   # doctest: +SKIP
        '3f9c2a71d0'
    """
    return hashlib.sha256(key.canonical().encode()).hexdigest()[:10]


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


# ---------------------------------------------------------------- summaries

@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One line of ``jax-autotune show``: a decision and how it compares with XLA's dot.

    ``speedup`` is XLA's time over the winner's; ``roofline_fraction`` is the roofline
    limit (or, without one, the roofline floor) over the winner's time: 1.0 or more means
    the winner is inside the limit. ``samples`` counts the winner's kept timings; times
    are seconds; None where not measured.
    """

    device: str
    key: str  # canonical key string
    key_id: str
    shape: str  # compact: [B x] M x N x K, dtypes, layouts, precision
    winner: str
    winner_seconds: float | None
    xla_seconds: float | None
    speedup: float | None
    roofline_fraction: float | None
    samples: int
    outcomes: dict[str, int]
    source: str
    reason: str


def _layout_letter(layout) -> str:
    if layout.name == "Contiguous":
        return "N"
    if layout.name == "HighlyPermuted":
        return "P"
    return ("T" if layout.transposed else "") + ("B" if layout.batch_swap else "")


def describe_key(key: MatmulKey) -> str:
    """A compact one-line form of a key, e.g. ``1024x1024x1024 float32 NT DEFAULT``."""
    dims = f"{key.m}x{key.n}x{key.k}" if key.batch == 1 else f"{key.batch}x{key.m}x{key.n}x{key.k}"
    dtypes = {key.lhs_dtype, key.rhs_dtype, key.out_dtype}
    dtype = key.lhs_dtype if len(dtypes) == 1 else f"{key.lhs_dtype},{key.rhs_dtype}->{key.out_dtype}"
    layouts = f"{_layout_letter(key.lhs_layout)}{_layout_letter(key.rhs_layout)}"
    return f"{dims} {dtype} {layouts} {key.precision.value}"


def _roofline_fraction(decision: Decision, winner_seconds: float | None) -> float | None:
    if not winner_seconds or winner_seconds <= 0:
        return None
    if decision.limit:
        return decision.limit / winner_seconds
    floors = [decision.bounds.get(name) for name in ("compute_seconds", "memory_seconds")]
    floors = [f for f in floors if isinstance(f, (int, float)) and not isinstance(f, bool)]
    return max(floors) / winner_seconds if floors else None


def summarize(device: str, decision: Decision) -> SummaryRow:
    """The ``SummaryRow`` of one decision."""
    winner = decision.result(decision.winner)
    winner_seconds = winner.score if winner else None
    xla = decision.result(XLA_DOT_NAME)
    xla_seconds = xla.score if xla is not None and xla.outcome == "ok" else None
    speedup = (xla_seconds / winner_seconds
               if xla_seconds and winner_seconds and winner_seconds > 0 else None)
    return SummaryRow(
        device=device, key=decision.key.canonical(), key_id=key_id(decision.key),
        shape=describe_key(decision.key), winner=decision.winner,
        winner_seconds=winner_seconds, xla_seconds=xla_seconds, speedup=speedup,
        roofline_fraction=_roofline_fraction(decision, winner_seconds),
        samples=len(winner.samples) if winner else 0,
        outcomes=dict(sorted(Counter(r.outcome for r in decision.results).items())),
        source=decision.source, reason=decision.reason)


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
    jax_autotune_version: str = ""
    jax_version: str = ""
    created: str = ""

    __hash__ = None  # holds a dict

    def __post_init__(self):
        if not self.jax_autotune_version or not self.jax_version:
            import jax

            from jax_autotune import __version__
            object.__setattr__(self, "jax_autotune_version", self.jax_autotune_version or __version__)
            object.__setattr__(self, "jax_version", self.jax_version or jax.__version__)
        if not self.created:
            now = datetime.datetime.now(datetime.timezone.utc)
            object.__setattr__(self, "created", now.strftime("%Y-%m-%dT%H:%M:%SZ"))
        object.__setattr__(self, "devices", dict(sorted(self.devices.items())))

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
        prints them, a canonical key string, or else any substring of a canonical string.

            >>> [d.winner for _, d in t.find("m=1024 n=1024 k=1024")]     # doctest: +SKIP
            ['xla_dot']
        """
        pairs = list(self.entries(device))
        text = " ".join(key.split())
        for exact in (lambda d: key_id(d.key) == text, lambda d: d.key.canonical() == text,
                      lambda d: describe_key(d.key) == text):
            found = [(fp, d) for fp, d in pairs if exact(d)]
            if found:
                return found
        return [(fp, d) for fp, d in pairs if text in d.key.canonical()]

    def summary_rows(self, device: str | None = None, key: str | None = None) -> list[SummaryRow]:
        """One ``SummaryRow`` per entry, optionally of one device and of keys containing
        ``key`` (in the canonical key string or the compact form, or equal to the key id)."""
        rows = []
        for fingerprint, decision in self.entries(device):
            if key and not (key in decision.key.canonical() or key in describe_key(decision.key)
                            or key == key_id(decision.key)):
                continue
            rows.append(summarize(fingerprint, decision))
        return rows

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
        return TuneTable(devices)

    # -- JSON ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "jax_autotune_version": self.jax_autotune_version, "jax_version": self.jax_version,
            "created": self.created,
            "devices": {fp: section.to_json() for fp, section in self.devices.items()},
        }

    def dumps(self) -> str:
        """The table as JSON text (what ``save`` writes)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the table as JSON to ``path`` atomically (a temporary file, then a rename).

            >>> table().save("tune_table.json")
            PosixPath('tune_table.json')
        """
        path = Path(os.fspath(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.dumps())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, tuners: Iterable["Tuner"] | None = None) -> "TuneTable":
        """Read and validate a table file (see the module docstring). ``tuners`` are the
        tuners whose candidate sets decide which entries this build can use (default:
        ``current_tuners()``). A missing file raises ``FileNotFoundError``.

            >>> TuneTable.load("tune_table.json")
            TuneTable(1 devices, 12 entries)
        """
        path = Path(os.fspath(path))
        with open(path, "rb") as f:
            raw = f.read()
        return cls.loads(raw, tuners=tuners, origin=str(path))

    @classmethod
    def loads(cls, text: str | bytes, *, tuners: Iterable["Tuner"] | None = None,
              origin: str = "tune table") -> "TuneTable":
        """Parse and validate JSON text; ``origin`` names the source in errors and warnings."""
        try:
            if isinstance(text, bytes):
                text = text.decode("utf-8")
            data = json.loads(text)
        except (UnicodeDecodeError, ValueError) as err:
            raise TuneTableError(f"{origin}: not a JSON tune table ({err})") from None
        return cls.from_json(data, tuners=tuners, origin=origin)

    @classmethod
    def from_json(cls, data: Any, *, tuners: Iterable["Tuner"] | None = None,
                  origin: str = "tune table") -> "TuneTable":
        """Validate a decoded JSON object (see the module docstring for the rules)."""
        tuners = current_tuners() if tuners is None else list(tuners)
        return _parse(data, {t.device.fingerprint: t for t in tuners}, origin)


# ---------------------------------------------------------------- validation

_NUMBER = "number"


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


def _field(data: dict, name: str, expected, where: str, origin: str, *, required: bool = True):
    if name not in data:
        if required:
            raise TuneTableError(f"{origin}: {where}{name}: missing (expected {_type_name(expected)})")
        return None
    value = data[name]
    if not _matches(value, expected):
        shown = json.dumps(value)[:80] if _jsonable(value) else repr(value)[:80]
        raise TuneTableError(f"{origin}: {where}{name}: expected {_type_name(expected)}, got {shown}")
    return value


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


_RESULT_FIELDS = {"name": (str, True), "outcome": (str, True), "round": (str, False),
                  "samples": (list, False), "score": ((_NUMBER, type(None)), False),
                  "pruned": (bool, False), "rel_error": ((_NUMBER, type(None)), False),
                  "error": (str, False)}
_ENTRY_FIELDS = {"key": (dict, True), "key_string": (str, False), "problem": (dict, True),
                 "winner": (str, True), "results": (list, False),
                 "bounds": ((dict, type(None)), False), "limit": ((_NUMBER, type(None)), False),
                 "tuning_seconds": (_NUMBER, False), "timestamp": (_NUMBER, False),
                 "device": (str, False), "checksum": (str, False), "source": (str, False),
                 "reason": (str, False)}


def _parse_entry(data: Any, where: str, origin: str) -> Decision:
    if not isinstance(data, dict):
        raise TuneTableError(f"{origin}: {where.rstrip('.')}: expected an object, "
                             f"got {type(data).__name__}")
    for name, (expected, required) in _ENTRY_FIELDS.items():
        _field(data, name, expected, where, origin, required=required)
    for i, result in enumerate(data.get("results") or []):
        at = f"{where}results[{i}]."
        if not isinstance(result, dict):
            raise TuneTableError(f"{origin}: {at.rstrip('.')}: expected an object, "
                                 f"got {type(result).__name__}")
        for name, (expected, required) in _RESULT_FIELDS.items():
            _field(result, name, expected, at, origin, required=required)
        if result["outcome"] not in OUTCOMES:
            raise TuneTableError(f"{origin}: {at}outcome: expected one of {', '.join(OUTCOMES)}, "
                                 f"got {result['outcome']!r}")
        for j, sample in enumerate(result.get("samples") or []):
            if not _matches(sample, _NUMBER):
                raise TuneTableError(f"{origin}: {at}samples[{j}]: expected a number, got {sample!r}")
    try:
        return Decision.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise TuneTableError(f"{origin}: {where.rstrip('.')}: {err}") from None


def _parse(data: Any, live: Mapping[str, "Tuner"], origin: str) -> TuneTable:
    if not isinstance(data, dict):
        raise TuneTableError(f"{origin}: expected a JSON object at the top, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise TuneTableError(f"{origin}: schema: expected {SCHEMA!r}, got {schema!r}")
    version = _field(data, "schema_version", int, "", origin)
    if version != SCHEMA_VERSION:
        raise TuneTableError(f"{origin}: schema_version: this build reads version {SCHEMA_VERSION}, "
                             f"got {version} (upgrade jax_autotune to read it)")
    header = {name: _field(data, name, str, "", origin)
              for name in ("jax_autotune_version", "jax_version", "created")}
    raw_devices = _field(data, "devices", dict, "", origin)

    skipped: Counter[str] = Counter()
    devices: dict[str, DeviceTable] = {}
    for fingerprint, raw in raw_devices.items():
        where = f"devices[{json.dumps(fingerprint)}]."
        if not isinstance(raw, dict):
            raise TuneTableError(f"{origin}: {where.rstrip('.')}: expected an object, "
                                 f"got {type(raw).__name__}")
        checksum = _field(raw, "checksum", str, where, origin)
        candidates = _field(raw, "candidates", list, where, origin)
        for i, name in enumerate(candidates):
            if not isinstance(name, str):
                raise TuneTableError(f"{origin}: {where}candidates[{i}]: expected a string, got {name!r}")
        raw_entries = _field(raw, "entries", list, where, origin)
        tuner = live.get(fingerprint)
        known = set(candidates) if tuner is None else set(candidates) & set(tuner.candidate_set.names())
        kept: dict[MatmulKey, Decision] = {}
        for i, raw_entry in enumerate(raw_entries):
            decision = _parse_entry(raw_entry, f"{where}entries[{i}].", origin)
            if (decision.checksum and decision.checksum != checksum) or (
                    tuner is not None and checksum != tuner.checksum):
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
    if skipped:
        total = sum(skipped.values())
        reasons = "; ".join(f"{n} with {why}" for why, n in skipped.items())
        warnings.warn(f"jax_autotune: {origin}: skipped {total} tune-table "
                      f"entr{'y' if total == 1 else 'ies'} this build cannot use ({reasons}). "
                      f"Those keys are not installed; tune them on this device "
                      f"(jax_autotune.warmup) and export a new table.",
                      TuneTableWarning, stacklevel=4)
    return TuneTable(devices, **header)


# ---------------------------------------------------------------- this process's table

def current_tuners() -> list["Tuner"]:
    """The tuner of ``jax.default_backend()`` (built if needed) and every other live tuner."""
    import jax

    from jax_autotune.tuner import tuner_for
    default = tuner_for(jax.default_backend())
    return [default] + [t for t in built_tuners() if t is not default]


def _section_of(tuner: "Tuner") -> tuple[str, str, tuple[str, ...]]:
    return tuner.device.fingerprint, tuner.checksum, tuple(tuner.candidate_set.names())


def table(*, tuners: Iterable["Tuner"] | None = None) -> TuneTable:
    """The current environment's table: every decision of ``tuners`` (default: every tuner
    built so far in this process), plus the store's entries of this jax_autotune and jax
    version for any device fingerprint.

        >>> jat.warmup(train_step, params, batch, grad=True)
        >>> table().save("tune_table.json")

    For a device without a tuner in this process, the entries of its most recently written
    candidate set are taken (older sets' entries could not be installed anyway).
    """
    import jax

    from jax_autotune import __version__
    from jax_autotune.store import open_store

    tuners = built_tuners() if tuners is None else list(tuners)
    sections: dict[str, tuple[str, tuple[str, ...]]] = {}
    decisions: dict[str, dict[MatmulKey, Decision]] = {}
    for tuner in tuners:
        fingerprint, checksum, names = _section_of(tuner)
        sections[fingerprint] = (checksum, names)
        found = decisions.setdefault(fingerprint, {})
        for decision in tuner.decisions():
            if decision.source != "fallback" and decision.checksum in ("", checksum):
                found.setdefault(decision.key, dataclasses.replace(
                    decision, device=fingerprint, checksum=checksum))

    prefix = f"autotune/{__version__}/{jax.__version__}/"
    stores = {}
    for tuner in tuners:
        if tuner.store.available:
            stores.setdefault(tuner.store.path, (tuner.store, False))
    configured = open_store()
    if configured.available and configured.path not in stores:
        stores[configured.path] = (configured, True)
    rows = []
    for store, owned in stores.values():
        try:
            rows.extend(store.entries(namespace_prefix=prefix))
        finally:
            if owned:
                store.close()

    by_device: dict[str, list] = {}
    for row in rows:
        parts = row.namespace[len(prefix):].split("/")
        if len(parts) == 2 and parts[1] == "matmul" and parts[0]:
            by_device.setdefault(parts[0], []).append(row)
    for fingerprint, device_rows in by_device.items():
        if fingerprint in sections:
            checksum = sections[fingerprint][0]
        else:
            checksum = max(device_rows, key=lambda r: r.updated).checksum
        found = decisions.setdefault(fingerprint, {})
        names: set[str] = set()
        for row in device_rows:
            if row.checksum != checksum:
                continue
            try:
                decision = Decision.from_json(row.value)
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # a damaged row: the tuner re-tunes it too
            names.update([decision.winner, *(r.name for r in decision.results)])
            found.setdefault(decision.key, dataclasses.replace(
                decision.with_source("store"), device=fingerprint, checksum=checksum))
        if fingerprint not in sections:
            ordered = sorted(names - {XLA_DOT_NAME})
            sections[fingerprint] = (checksum, ((XLA_DOT_NAME,) if XLA_DOT_NAME in names else ())
                                     + tuple(ordered))

    return TuneTable({fp: DeviceTable(sections[fp][0], sections[fp][1],
                                      tuple(decisions.get(fp, {}).values()))
                      for fp in sections})


# ---------------------------------------------------------------- installing

def install_table(tune_table: TuneTable, *, tuners: Iterable["Tuner"] | None = None,
                  persist: bool = True) -> dict[str, int]:
    """Install the entries of every device that has a tuner in ``tuners`` (default:
    ``current_tuners()``) into its memory table and (``persist``) its store; returns
    {fingerprint: entries installed}. Entries of other devices are left alone.

        >>> install_table(TuneTable.load("tune_table.json"))
        {'cpu-Intel-R--Xeon-R--x16-mem0': 12}
    """
    tuners = current_tuners() if tuners is None else list(tuners)
    installed: dict[str, int] = {}
    refused = 0
    for tuner in tuners:
        fingerprint = tuner.device.fingerprint
        section = tune_table.devices.get(fingerprint)
        if section is None or fingerprint in installed:
            continue
        count = 0
        for decision in section.entries:
            if section.checksum != tuner.checksum:
                refused += 1
            elif tuner.install(decision.with_source("table"), persist=persist):
                count += 1
            else:
                refused += 1
        installed[fingerprint] = count
    if refused:
        warnings.warn(f"jax_autotune: {refused} tune-table entr{'y' if refused == 1 else 'ies'} "
                      f"not installed: a candidate-set checksum or winner unknown to this build.",
                      TuneTableWarning, stacklevel=2)
    return installed


def load_table(path_or_table: str | os.PathLike | TuneTable, install: bool = True, *,
               tuners: Iterable["Tuner"] | None = None) -> TuneTable:
    """Load (and validate) a tune table file, or take a ``TuneTable``; with ``install``,
    put the entries of the current device(s) into the memory table and the store, so
    ``JAX_AUTOTUNE_MODE=require`` finds them. Returns the table (every device's entries).

        >>> import jax_autotune as jat
        >>> jat.load_table("tune_table.json")
        TuneTable(2 devices, 41 entries)
    """
    tuners = current_tuners() if tuners is None else list(tuners)
    if isinstance(path_or_table, TuneTable):
        loaded = path_or_table
    elif isinstance(path_or_table, (str, os.PathLike)):
        loaded = TuneTable.load(path_or_table, tuners=tuners)
    else:
        raise TypeError(f"path_or_table: expected a path or a TuneTable, "
                        f"got {type(path_or_table).__name__}")
    if install:
        install_table(loaded, tuners=tuners)
    return loaded
