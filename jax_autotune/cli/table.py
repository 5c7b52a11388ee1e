"""``jax-autotune show | explain | export | import | clear``: inspect and move tune tables.

    $ jax-autotune show [--device FP] [--key SUBSTR]   # one line per decision
    $ jax-autotune explain KEY                         # every candidate of one decision
    $ jax-autotune export tune_table.json [--force] [--device FP]
    $ jax-autotune import tune_table.json
    $ jax-autotune clear [--device FP] [--yes]         # decisions only; probes stay

KEY is an id or a compact key as ``show`` prints them, a canonical key string, or a
unique substring of one. The commands read this process's tuners and the configured
store (``JAX_AUTOTUNE_CACHE_DIR``, ``JAX_AUTOTUNE_ENVIRONMENT``, ``JAX_AUTOTUNE_STORE``);
each first says where it is on stderr (``database: PATH``: the SQLite file or the
directory store's folder; ``none`` for a memory-only store, where ``show`` lists nothing
and ``import`` and ``clear`` stop with status 1). Exit status: 0 done, 1 the store cannot be
read (show, explain, export) or written (import, clear), or clear was not confirmed, 2 a
bad argument (an unknown key or device, an unreadable table file, an existing export
file without ``--force``, clear without ``--yes`` when stdin is not a terminal). The
arguments themselves are defined in ``cli/parser.py``.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import sys

import jax_autotune.config as config
from jax_autotune.columns import LINE_WIDTH, aligned, fitted
from jax_autotune.kernels.gpu import cublas_grouped, cublaslt
from jax_autotune.tables.install import (clear_decisions, install_table, read_table, stored_devices,
                                         table)
from jax_autotune.tables.summary import SummaryRow, key_id
from jax_autotune.tables.table_file import TuneTable, TuneTableError
from jax_autotune.registry import current_tuners
from jax_autotune.tuning import compile_cache
from jax_autotune.tuning.decision import Decision


def format_seconds(seconds: float | None) -> str:
    """``1.5e-05`` -> ``'15.0us'``, ``2.5`` -> ``'2.50s'``; None -> ``'-'``."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.2f}{unit}" if unit == "s" else f"{seconds / scale:.1f}{unit}"
    return f"{seconds * 1e9:.0f}ns"


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _outcomes(counts: dict[str, int]) -> str:
    return " ".join(f"{name}={n}" for name, n in counts.items()) or "-"


SHOW_COLUMNS = ("id", "key", "winner", "time", "xla_dot", "speedup", "roofline", "samples",
                "outcomes")
_NARROW = SHOW_COLUMNS.index("samples")  # the columns shown without --wide: up to roofline
_NUMBERS = {SHOW_COLUMNS.index(name) for name in ("time", "xla_dot", "speedup", "roofline", "samples")}
# cut to fit: the winner to 26 characters first (``explain`` names it whole), then the key
_CUT = ((SHOW_COLUMNS.index("winner"), 26), (SHOW_COLUMNS.index("key"), 12))


def show_lines(rows: list[SummaryRow], wide: bool = False) -> list[str]:
    """The text table ``jax-autotune show`` prints, one block per device.

    ``key`` is the decision's key: its sizes bucketed (one key serves every shape of its
    bucket), its dtypes, layouts (N/T), precision, grouping and epilogue. ``time`` is the
    winner's, ``xla_dot`` XLA's own op's (its dot; for a grouped key its ragged_dot),
    ``speedup`` their ratio. ``roofline`` is the roofline limit (or floor) over the
    winner's time: >= 1.00x means inside the limit, below it the winner is that fraction of
    the hardware's peak for the key. ``samples`` counts the winner's kept timings,
    ``outcomes`` every candidate's. Lines fit ``columns.LINE_WIDTH`` characters (the winner, then
    the key cut, ending in ``…``), without ``samples`` and ``outcomes``; ``wide``: every
    column, nothing cut.
    """
    if not rows:
        return ["no tuned decisions (tune with jax_autotune.warmup or import a table)"]
    lines: list[str] = []
    shown = len(SHOW_COLUMNS) if wide else _NARROW
    for device in dict.fromkeys(row.device for row in rows):
        cells = [SHOW_COLUMNS[:shown]] + [
            (row.key_id, row.shape, row.winner, format_seconds(row.winner_seconds),
             format_seconds(row.xla_seconds), _ratio(row.speedup), _ratio(row.roofline_fraction),
             str(row.samples), _outcomes(row.outcomes))[:shown]
            for row in rows if row.device == device]
        if lines:
            lines.append("")
        lines.append(f"device {device}: {len(cells) - 1} decisions")
        lines.extend(aligned(cells if wide else fitted(cells, LINE_WIDTH, _CUT), right=_NUMBERS))
    return lines


def explain_lines(device: str, decision: Decision) -> list[str]:
    """Everything recorded about one decision: the key, the bounds and every candidate."""
    when = datetime.datetime.fromtimestamp(decision.timestamp, datetime.timezone.utc)
    lines = [
        f"device     {device}",
        f"key        {decision.key.canonical()}",
        f"id         {key_id(decision.key)}",
        f"problem    batch={decision.problem.batch} m={decision.problem.m} n={decision.problem.n} "
        f"k={decision.problem.k} {decision.problem.lhs_dtype} x {decision.problem.rhs_dtype} -> "
        f"{decision.problem.out_dtype} transpose_a={decision.problem.transpose_a} "
        f"transpose_b={decision.problem.transpose_b}",
        *([f"epilogue   {decision.key.epilogue.describe()}"] if not decision.key.epilogue.is_bare else []),
        f"winner     {decision.winner} ({format_seconds(decision.winner_seconds)})",
        f"source     {decision.source}, tuned {when:%Y-%m-%d %H:%M:%S} UTC in "
        f"{decision.tuning_seconds:.3f}s, candidate set {decision.checksum}",
        f"limit      {format_seconds(decision.limit)}",
    ]
    if decision.bounds:
        b = decision.bounds
        lines.append(f"bounds     compute {format_seconds(b.get('compute_seconds'))}, memory "
                     f"{format_seconds(b.get('memory_seconds'))}, threshold {b.get('threshold')}, "
                     f"launch {format_seconds(b.get('launch_overhead'))}")
    if decision.reason:
        lines.append(f"reason     {decision.reason}")
    for r in (r for r in decision.results if r.paired_ratio is not None):
        kept = "it won" if r.name == decision.winner else f"{decision.winner} kept"
        lines.append(f"in turns   {r.name}: the baseline took {r.paired_ratio:.2f}x its time, timed in turns ({kept})")
    if decision.export_kernel:
        why = f" ({decision.export_reason})" if decision.export_reason else ""
        lines.append(f"exported   {decision.export_kernel}{why}")
    if any(r.name.startswith("cublaslt") or "_cublaslt" in r.name for r in decision.results):
        lines.append(f"cublaslt   {cublaslt.describe()}")  # this process's library
    if any(r.name == "ragged_cublas_grouped" for r in decision.results):
        lines.append(f"cublas     {cublas_grouped.describe()}")
    header = ("", "candidate", "outcome", "round", "samples", "score", "pruned", "rel_error", "error")
    cells = [header]
    for r in sorted(decision.results, key=lambda r: (r.score is None, r.score or 0.0, r.name)):
        cells.append(("*" if r.name == decision.winner else "", r.name, r.outcome, r.round or "-",
                      str(len(r.samples)), format_seconds(r.score), "yes" if r.pruned else "no",
                      "-" if r.rel_error is None else f"{r.rel_error:.2e}",
                      r.error.replace("\n", " ")[:120] or "-"))
    if len(cells) == 1:
        lines.append("candidates none recorded (no benchmark ran for this key)")
        return lines
    return [*lines, "", *aligned(cells)]


# ---------------------------------------------------------------- commands

STORE_UNUSABLE, BAD_ARGUMENT = 1, 2  # exit statuses (parser.EXIT_STATUS says them)


def _error(message: str, status: int = BAD_ARGUMENT) -> int:
    """The reason on one line (stderr); returns the exit status."""
    print(f"jax-autotune: {message}", file=sys.stderr)
    return status


def _using_database(write: bool, create: bool = True):
    """Decorate a ``run_<command>``: say which database it uses and stop with
    ``STORE_UNUSABLE`` when that cannot be read (``write``: and written) now, or with
    ``BAD_ARGUMENT`` when ``--device`` names a device it does not know (``unknown_device``)."""
    def decorate(run):
        @functools.wraps(run)
        def checked(args) -> int:
            command = run.__name__.removeprefix("run_")
            problem = _database(write, create)
            if problem:
                return _error(f"{command}: {problem}", STORE_UNUSABLE)
            problem = unknown_device(getattr(args, "device", None))
            if problem:
                return _error(f"{command}: {problem}")
            return run(args)
        return checked
    return decorate


def unknown_device(device: str | None) -> str:
    """Why ``--device`` is not a device of the store or of this process ('' when it is, or
    when none was given); every command's ``--device`` is checked here.

        >>> unknown_device("bogus")
        "--device 'bogus' is not a device of this store or process; known: cpu-AMD-EPYC-x2-mem0-avx2"
    """
    if device is None:
        return ""
    known = sorted(set(stored_devices()) | {t.device.fingerprint for t in current_tuners()})
    if device in known:
        return ""
    return (f"--device {device!r} is not a device of this store or process; "
            f"known: {', '.join(known) or 'none'}")


def memory_only_setting() -> str:
    """The setting that keeps decisions in memory only, as it is written in the environment.

        >>> memory_only_setting()      # under JAX_AUTOTUNE_STORE=memory
        'JAX_AUTOTUNE_STORE=memory'
    """
    if not config.get("cache"):
        return "JAX_AUTOTUNE_CACHE=0"
    return "JAX_AUTOTUNE_STORE=memory" if config.get("store") == "memory" else "no disk store"


def _database(write: bool, create: bool = True) -> str:
    """Say where the command's store is (stderr: the database file, or the directory
    store's folder); '' when it can be read (``write``: and written) now, else why not. A
    missing store reads as empty; ``create=False``: a missing one is not created to be
    checked."""
    store = current_tuners()[0].store  # the configured store, as the command will use it
    if store.path is None:
        print(f"database: none ({memory_only_setting()}: memory only)", file=sys.stderr)
        return (f"there is no store to write ({memory_only_setting()}: decisions are kept in "
                f"memory only)") if write else ""
    print(f"database: {store.path}", file=sys.stderr)
    if not store.path.exists() and not (write and create):
        return ""
    return store.check(write=write)


def _clear_question(args) -> str:
    """What ``clear`` asks before it deletes: which decisions, of which database."""
    store = current_tuners()[0].store
    devices = [args.device] if args.device else stored_devices()
    what = (f"the stored decisions of {', '.join(devices)}" if devices else "every stored decision")
    if args.compilation_cache:
        what += f" and the compiled executables in {compile_cache.directory_for(config.get('cache_dir'))}"
    return f"Delete {what} from {store.path} (throughput probes stay)? [y/N] "


def _confirmed(question: str) -> bool:
    """Ask on stderr, read the answer from stdin: yes only for 'y' or 'yes'."""
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if not answer.endswith("\n"):
        print(file=sys.stderr)  # end the question's line (end of input, Ctrl-C)
    return answer.strip().lower() in ("y", "yes")


def _current_table() -> TuneTable:
    return table(tuners=current_tuners())


@_using_database(write=False)
def run_show(args) -> int:
    rows = _current_table().summary_rows(device=args.device, key=args.key)
    if not rows and current_tuners()[0].store.path is None:
        print(f"no stored decisions: {memory_only_setting()} keeps decisions in memory only, "
              f"so none outlive the process that tuned them")
        return 0
    for line in show_lines(rows, wide=args.wide):
        print(line)
    return 0


@_using_database(write=False)
def run_explain(args) -> int:
    found = _current_table().find(args.key, device=args.device)
    if not found:
        return _error(f"explain: no decision matches key {args.key!r} "
                      f"(see `jax-autotune show` for ids and keys)")
    if len({d.key for _, d in found}) > 1:
        listed = "\n  ".join(f"{key_id(d.key)}  {d.key.canonical()}" for _, d in found[:10])
        return _error(f"explain: key {args.key!r} matches {len(found)} decisions; give an id or a "
                      f"longer substring:\n  {listed}")
    for i, (device, decision) in enumerate(found):
        if i:
            print()
        for line in explain_lines(device, decision):
            print(line)
    return 0


@_using_database(write=False)
def run_export(args) -> int:
    folder = os.path.dirname(os.path.abspath(args.path))
    if os.path.isdir(args.path):
        return _error(f"export: {args.path} is a folder; give the path of a file to write")
    if not os.path.isdir(folder):
        return _error(f"export: the folder {folder} does not exist (export makes no folders)")
    exported = _current_table()
    if args.device is not None:
        exported = dataclasses.replace(exported, devices={args.device: exported.devices[args.device]}
                                       if args.device in exported.devices else {})
    try:
        path = exported.save(args.path, overwrite=args.force)
    except FileExistsError:
        return _error(f"export: {args.path} exists; pass --force to replace it")
    except OSError as err:
        return _error(f"export: cannot write {args.path}: {err}", STORE_UNUSABLE)
    print(f"exported {len(exported)} decisions of {len(exported.devices)} device(s) to {path}")
    return 0


@_using_database(write=True)
def run_import(args) -> int:
    tuners = current_tuners()
    try:
        imported = read_table(args.path, tuners=tuners)
    except (OSError, TuneTableError) as err:
        return _error(f"import: {err}")
    installed = install_table(imported, tuners=tuners)
    if not all(result.persisted for result in installed.values()):
        stores = ", ".join(sorted({str(t.store.path) for t in tuners}))
        return _error(f"import: nothing written: the tune store {stores} cannot be written "
                      f"(see the warning above)", STORE_UNUSABLE)
    for device, section in imported.devices.items():
        if device in installed:
            print(f"installed {installed[device].installed} decisions for {device}")
        else:
            print(f"kept {len(section.entries)} decisions for {device} (not this device: "
                  f"not installed)")
    return 0


@_using_database(write=True, create=False)
def run_clear(args) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            return _error("clear: pass --yes to delete when stdin is not a terminal (nothing deleted)")
        if not _confirmed(_clear_question(args)):
            return _error("clear: not confirmed; nothing deleted", STORE_UNUSABLE)
    deleted = clear_decisions(args.device)
    what = f"of {args.device}" if args.device else "of every device"
    print(f"deleted {deleted} stored decisions {what} (throughput probes kept)")
    if args.compilation_cache:
        directory = compile_cache.directory_for(config.get("cache_dir"))
        try:
            removed = compile_cache.clear(directory)
        except (OSError, ValueError) as err:
            return _error(f"clear: {err}")
        print(f"deleted {removed} compiled executables from {directory}")
    return 0

