"""Tune tables and this process's runtime: harvest a table, install one, forget decisions.

``table()`` gathers every decision of the live tuners and of the stores they (and the
configuration) use; ``load_table`` / ``install_table`` put a table's entries for this
process's devices into their memory tables and stores; ``clear_decisions`` deletes stored
decisions. The file format itself (``table_file``) knows nothing of any of this.

    >>> from jax_autotune.tables.install import load_table, table
    >>> table().save("tune_table.json")                  # this process + the store
    >>> load_table("tune_table.json")                    # another process or machine
    TuneTable(2 devices, 41 entries)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from typing import Iterable, Iterator

import jax_autotune.config as config
from jax_autotune.kernels.xla import XLA_DOT_NAME
from jax_autotune.key import MatmulKey
from jax_autotune.tables.table_file import KEPT, CandidateSetInfo, DeviceTable, KeptRow, TuneTable, TuneTableWarning
from jax_autotune.registry import built_tuners, current_tuners
from jax_autotune.tuning.decision import Decision, Source
from jax_autotune.tuning import attention_decisions, programs
from jax_autotune.tuning.attention_decisions import AttentionDecision
from jax_autotune.tuning.namespaces import (ATTENTION, PROGRAMS, DecisionNamespace, current_decision_prefix,
                                            current_device, current_prefix, kept_device)
from jax_autotune.tuning.programs import ProgramRecord
from jax_autotune.tuning.store import Store, open_store
from jax_autotune.tuning.known import Installed, stored_decision
from jax_autotune.tuning.tuner import Tuner

_NAMED_REJECTIONS = 3  # rejected entries a warning names one by one
_KEPT_NAMESPACES = {"attention": ATTENTION, "programs": PROGRAMS}  # a table field (KEPT): its store namespaces
GROUPED_SECTION = "{device}/grouped"  # a device's grouped matmuls' decisions: another candidate set


def section_name(fingerprint: str, grouped: bool) -> str:
    """The table section of a device's decisions: its fingerprint for dense matmuls,
    ``<fingerprint>/grouped`` for grouped ones (``lax.ragged_dot``), whose candidate set
    is another (a table section holds one candidate set).

        >>> section_name("cpu-AMD-EPYC-x2-mem0-avx512", grouped=True)
        'cpu-AMD-EPYC-x2-mem0-avx512/grouped'
    """
    return GROUPED_SECTION.format(device=fingerprint) if grouped else fingerprint


def section_of(tuner: Tuner) -> str:
    """The table section ``tuner``'s decisions go to (a grouped tuner's baseline is not XLA's dot)."""
    return section_name(tuner.device.fingerprint, tuner.candidate_set.baseline.name != XLA_DOT_NAME)


def _row_section(fingerprint: str, key: str) -> str:
    try:
        grouped = MatmulKey.parse(key).groups > 0
    except Exception:  # noqa: BLE001 - a damaged key: its dense section reports it
        grouped = False
    return section_name(fingerprint, grouped)


def known_sets(tuners: Iterable[Tuner]) -> dict[str, CandidateSetInfo]:
    """The candidate set of each tuner's section, as ``TuneTable.load(known=...)`` takes it."""
    return {section_of(t): CandidateSetInfo(t.checksum, frozenset(t.candidate_set.names())) for t in tuners}


def read_table(path: str | os.PathLike, *, tuners: Iterable[Tuner] | None = None) -> TuneTable:
    """Read and validate a table file against ``tuners`` (default: ``current_tuners()``):
    entries their candidate sets cannot use are skipped, with one warning.

        >>> read_table("tune_table.json")
        TuneTable(1 devices, 12 entries)
    """
    tuners = current_tuners() if tuners is None else list(tuners)
    return TuneTable.load(path, known=known_sets(tuners))


@contextlib.contextmanager
def stores_in_use(tuners: Iterable[Tuner]) -> Iterator[list[Store]]:
    """The distinct working stores of ``tuners`` plus the configured one, once each; the
    configured one is closed afterwards when no tuner holds it.

        >>> with stores_in_use(built_tuners()) as stores:
        ...     rows = [row for store in stores for row in store.entries()]
    """
    stores: dict = {}
    for tuner in tuners:
        if tuner.store.available:
            stores.setdefault(tuner.store.path, tuner.store)
    configured = open_store(config.store_choice())
    owned = configured.available and configured.path not in stores
    if owned:
        stores[configured.path] = configured
    try:
        yield list(stores.values())
    finally:
        if owned:
            configured.close()


def table(*, tuners: Iterable[Tuner] | None = None) -> TuneTable:
    """The current environment's table: every decision of ``tuners`` (default: every tuner
    built so far in this process), plus the store's entries of this jax_autotune and jax
    version for any device fingerprint.

        >>> jat.warmup(train_step, params, batch, grad=True)
        >>> table().save("tune_table.json")

    A device's grouped matmuls' decisions (another candidate set) are the section
    ``<fingerprint>/grouped`` (``section_name``). The stores' attention decisions and
    whole-program checks of this version come along (``TuneTable.attention``,
    ``TuneTable.programs``), so that a shipped ``jat.autotune`` program decides nothing again. For a section without a tuner in this
    process, the entries of its most recently written candidate set are taken (older sets'
    entries could not be installed anyway).
    """
    tuners = built_tuners() if tuners is None else list(tuners)
    sections: dict[str, tuple[str, tuple[str, ...]]] = {}
    decisions: dict[str, dict[MatmulKey, Decision]] = {}
    for tuner in tuners:
        fingerprint, checksum = section_of(tuner), tuner.checksum
        sections[fingerprint] = (checksum, tuple(tuner.candidate_set.names()))
        found = decisions.setdefault(fingerprint, {})
        for decision in tuner.known.memory_decisions():  # its store's rows are read below
            if decision.source != Source.FALLBACK and decision.checksum in ("", checksum):
                found.setdefault(decision.key, dataclasses.replace(
                    decision, device=fingerprint, checksum=checksum))

    prefix = current_decision_prefix()
    with stores_in_use(tuners) as stores:
        rows = [(store, row) for store in stores for row in store.entries(namespace_prefix=prefix)]
    by_device: dict[str, list] = {}
    for store, row in rows:
        namespace = DecisionNamespace.parse(row.namespace)
        if namespace is not None:
            by_device.setdefault(_row_section(namespace.device, row.key), []).append((store, row))
    for fingerprint, device_rows in by_device.items():  # a section: a device's dense or grouped rows
        if fingerprint in sections:
            checksum = sections[fingerprint][0]
        else:
            checksum = max(device_rows, key=lambda pair: pair[1].updated)[1].checksum
        found = decisions.setdefault(fingerprint, {})
        names: set[str] = set()
        for store, row in device_rows:
            if row.checksum != checksum:
                continue
            decision = stored_decision(store, row.namespace, row.key, row.checksum, row.value)
            if decision is None:
                continue  # a damaged row (one warning): the tuner re-tunes it too
            names.update([decision.winner, *(r.name for r in decision.results)])
            found.setdefault(decision.key, dataclasses.replace(
                decision.with_source("store"), device=fingerprint, checksum=checksum))
        if fingerprint not in sections:
            ordered = sorted(names - {XLA_DOT_NAME})
            sections[fingerprint] = (checksum, ((XLA_DOT_NAME,) if XLA_DOT_NAME in names else ())
                                     + tuple(ordered))

    return TuneTable({fp: DeviceTable(sections[fp][0], sections[fp][1],
                                      tuple(decisions.get(fp, {}).values()))
                      for fp in sections}, **_kept_rows(tuners))


def _kept_rows(tuners: list[Tuner]) -> dict[str, dict[str, tuple[KeptRow, ...]]]:
    """The attention decisions and program checks of this package and jax version in the
    stores in use, per table field (``table_file.KEPT``) and device fingerprint."""
    found: dict[str, dict[str, dict[tuple[str, str], KeptRow]]] = {name: {} for name in KEPT}
    with stores_in_use(tuners) as stores:
        for name, kind in _KEPT_NAMESPACES.items():
            for store in stores:
                for row in store.entries(namespace_prefix=current_prefix(kind)):
                    device = current_device(row.namespace, kind)
                    if device is not None:
                        found[name].setdefault(device, {}).setdefault(
                            (row.key, row.checksum), KeptRow(row.key, row.checksum, row.value))
    return {name: {fp: tuple(rows.values()) for fp, rows in devices.items()} for name, devices in found.items()}


def _install_kept(tune_table: TuneTable, tuner: Tuner, persist: bool) -> None:
    """Keep the table's attention decisions and program checks of ``tuner``'s device, as
    its own trace and warmup would have (the rows were validated when the table was read)."""
    for row in tune_table.attention.get(tuner.device.fingerprint, ()):
        decision = AttentionDecision.from_json(row.value, source="table")
        if decision is not None:
            attention_decisions.remember(tuner, decision, row.checksum, persist=persist)
    for row in tune_table.programs.get(tuner.device.fingerprint, ()):
        record = ProgramRecord.from_json(row.value)
        if record is not None and row.checksum == tuner.checksum:  # checked with this candidate set
            programs.remember(tuner, row.key, record, persist=persist)


def install_table(tune_table: TuneTable, *, tuners: Iterable[Tuner] | None = None,
                  persist: bool = True) -> dict[str, Installed]:
    """Install the entries of every device that has a tuner in ``tuners`` (default:
    ``current_tuners()``) into its memory table and (``persist``) its store, one
    transaction per device; returns {section: Installed} (a device's fingerprint, or
    ``<fingerprint>/grouped`` for its grouped matmuls: ``section_name``). The table's attention
    decisions and program checks of those devices are kept too (a program check only under
    the candidate set it was made with). Entries of other devices are left alone; an entry of another candidate set, or whose winner cannot run its key here,
    is not installed (one ``TuneTableWarning`` names them).

        >>> install_table(TuneTable.load("tune_table.json"))
        {'cpu-Intel-R--Xeon-R--x16-mem0-avx2': Installed(installed=12, rejected=(), persisted=True)}
    """
    tuners = current_tuners() if tuners is None else list(tuners)
    installed: dict[str, Installed] = {}
    other_set = 0
    rejected: list[str] = []
    for tuner in tuners:
        fingerprint = section_of(tuner)
        section = tune_table.devices.get(fingerprint)
        if section is None or fingerprint in installed:
            continue
        if section.checksum != tuner.checksum:
            other_set += len(section.entries)
            installed[fingerprint] = Installed(0, (), True)
            continue
        installed[fingerprint] = result = tuner.known.install_many(
            (d.with_source("table") for d in section.entries), persist=persist)
        rejected.extend(result.rejected)
    dense = {t.device.fingerprint: t for t in tuners if section_of(t) == t.device.fingerprint}
    for tuner in dense.values():  # a device's attentions and programs: its dense tuner's
        _install_kept(tune_table, tuner, persist)
    if other_set or rejected:
        total = other_set + len(rejected)
        parts = [f"{other_set} of a candidate set this build does not have"] if other_set else []
        if rejected:
            named = "; ".join(rejected[:_NAMED_REJECTIONS])
            more = f" and {len(rejected) - _NAMED_REJECTIONS} more" if len(rejected) > _NAMED_REJECTIONS else ""
            parts.append(f"{len(rejected)} whose kernel cannot run here ({named}{more})")
        warnings.warn(f"jax_autotune: {total} tune-table entr{'y' if total == 1 else 'ies'} not "
                      f"installed: {', '.join(parts)}. Those keys are tuned on first use "
                      f"(mode tune) or run with XLA's dot (cached, require).",
                      TuneTableWarning, stacklevel=2)
    return installed


def load_table(path_or_table: str | os.PathLike | TuneTable, install: bool = True, *,
               tuners: Iterable[Tuner] | None = None) -> TuneTable:
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
        loaded = read_table(path_or_table, tuners=tuners)
    else:
        raise TypeError(f"path_or_table: expected a path or a TuneTable, "
                        f"got {type(path_or_table).__name__}")
    if install:
        install_table(loaded, tuners=tuners)
    return loaded


def _device_of(namespace: str) -> str | None:
    """The device of a namespace ``clear_decisions`` deletes (decisions, program checks,
    attention decisions, of any version); None for any other (probes)."""
    parsed = DecisionNamespace.parse(namespace)
    return parsed.device if parsed is not None else kept_device(namespace)


def stored_devices() -> list[str]:
    """The device fingerprints with decisions (of any version) in the stores in use.

        >>> stored_devices()
        ['cpu-AMD-EPYC-x16-mem0-avx2']
    """
    with stores_in_use(built_tuners()) as stores:
        namespaces = [DecisionNamespace.parse(ns) for store in stores for ns in store.namespaces()]
    return sorted({ns.device for ns in namespaces if ns is not None})


def clear_decisions(device: str | None = None) -> int:
    """Delete stored decisions (every jax_autotune and jax version) of one device fingerprint
    or of all, the attention decisions and program checks with them (a check judged the
    decisions deleted), and forget what this process holds of them; throughput probes
    stay. Returns the number of rows deleted.

        >>> clear_decisions("cpu-AMD-EPYC-x16-mem0")
        12
    """
    tuners = built_tuners()
    for tuner in tuners:
        if device is None or tuner.device.fingerprint == device:
            tuner.known.forget()
    attention_decisions.forget()  # every device's, in memory: the stores keep the others'
    programs.forget()
    deleted = 0
    with stores_in_use(tuners) as stores:
        for store in stores:
            doomed = [namespace for namespace in store.namespaces()
                      if (owner := _device_of(namespace)) is not None and device in (None, owner)]
            deleted += store.delete_namespaces(doomed)
    return deleted
