"""A tuned program against the same program plain: never slower where users look.

Each key is decided alone (or in its epilogue's context), but a program is more than its
keys: a custom call takes its operands in one layout, so the transposes and converts XLA
folds into its own dot become copies around it, and XLA fuses across a dot what it cannot
fuse across a custom call. ``warmup(jat.autotune(fn), *args, grad=...)`` therefore ends with
``check``: it compiles the whole program (``fn``, or the training step
``jax.value_and_grad``) tuned and plain (every dot left to lax), times both, interleaved,
by the wall clock around each run, on arguments that move between runs as a loop's do
(what a training loop sees), and unless tuned is faster
than plain by at least ``MARGIN`` it finds the keys that cost it and leaves their dots
plain in that program (a program whose keys gain nothing measurable runs as written):

* the keys are ordered by what their tunings claim to gain in the program
  (``claimed_order``: XLA's dot winning first, as such a key claims no gain; then by
  (XLA's time - the winner's) x the key's uses);
* the keys whose winner is XLA's dot run as written from the first trial on: bound, such
  a key is XLA's dot on the canonical layout, a layout change no tuning measured, which
  may cost the program copies or save some, so the check starts from the program as
  written for them (binding the copy-free ones instead ran ViT no faster on an H100:
  ``benchmarks/results/model_step_2026-12-07.md``);
* the tuned and the plain programs compile at once (under ``warmup`` on a GPU the plain
  one compiles earlier, while the keys tune: ``WallClock.start_plain``); where tuned is
  faster, that is all (an extra trial with the minor keys plain beside them gained
  nothing on GPT-2 or Llama on an H100 and cost a third whole-program compile:
  ``benchmarks/results/``);
* where tuned is not faster, the minor keys, the shortest-claiming prefix whose claims together
  are at most ``MINOR_SHARE`` of all the keys' claims, are tried left plain first: a claim
  measured on a key alone does not count the copies and lost fusions a custom call costs
  the program, which are of the size of a minor key's claim;
* when that is still not faster than plain, the keys are left plain as a longer prefix of the
  order, the shortest with which the program is faster than plain (a binary search:
  about log2(keys) compiles; leaving every key plain *is* the plain program);
* a softmax attention ``jat.autotune`` fused is one of the program's keys too (its
  ``AttentionKey``, claiming what its decision measured against it as written): left
  plain, it runs as written, and the plain program has every attention as written;
* where every key's winner is XLA's dot, nothing is compiled: the tuned program could only
  add layout ops to plain's, so every key is left plain;
* the result is kept with the program's identity (``tuning.programs``), in the store too,
  so the next process's trace leaves the same dots plain; a later warmup that tunes
  nothing new reads it instead of checking again.

    >>> report = jat.warmup(jat.autotune(loss), params, batch, grad=True)
    >>> print(report.program)
    program: plain 3.52 ms, tuned 5.26 ms (0.67x); 10 of 10 keys left plain: 3.52 ms (1.00x) [5 compiles, 14.7 s]
    >>> print(big_report.program)
    program: plain 38.2 ms, tuned 31.5 ms (1.21x) [2 compiles, 14.6 s]
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import math
import statistics
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jax_autotune.dtypes import is_floating
from jax_autotune.errors import JaxAutotuneWarning
from jax_autotune.key import MatmulKey
from jax_autotune.tuning import programs
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.tuning.threads import carrying_x64

MARGIN = 0.01  # tuned must be this much faster than plain to count as faster (timing noise)
ROUNDS = 7  # timed runs of each program at least, interleaved, after two untimed ones
TIMED_SECONDS = 1.0  # the timed rounds fill about this much: a short program's median rests on more runs
MAX_ROUNDS = 100
MINOR_SHARE = 0.1  # the minor keys claim at most this share of all keys' claims together

# a key of JAX's own caches (``jax.make_user_context``): a trace made within ``fresh_traces``
# is shared with no other, so a jitted function the target calls traces again per trial
_FRESH = jax.make_user_context(None) if hasattr(jax, "make_user_context") else None
_fresh_tokens = itertools.count()


def fresh_traces():
    """A context in which JAX's trace and compile caches serve no trace made outside it,
    and keep none for a call outside it (where this JAX has no user contexts: its caches
    cleared instead).

        >>> with fresh_traces():
        ...     lowered = jax.jit(lambda *a: step(*a)).lower(*args)   # step's own jit traces again
    """
    if _FRESH is None:
        jax.clear_caches()
        return contextlib.nullcontext()
    return _FRESH(next(_fresh_tokens))


@dataclasses.dataclass(frozen=True)
class ProgramCheck:
    """What ``check`` found for one program: the times plain, tuned, and with the keys
    ``left_plain``; ``compiles`` made and ``seconds`` spent; ``source`` "checked",
    "stored" (an earlier check's result, nothing compiled) or "xla" (every key's winner is
    XLA's dot: every key left plain, nothing compiled or timed, the times 0);
    ``plain_compile_seconds`` where the plain program compiled early, beside the tunings;
    ``written``: how many of ``left_plain`` ran as written from the first trial on, their
    winner being XLA's dot (``tuned_seconds`` is the program with them so)."""

    plain_seconds: float
    tuned_seconds: float
    final_seconds: float
    keys: int
    left_plain: tuple[MatmulKey, ...] = ()
    compiles: int = 0
    seconds: float = 0.0
    source: str = "checked"
    # the plain program's compile where it began while the keys tuned (``WallClock.start_plain``):
    # its wall seconds, and of those the seconds it waited for the device
    plain_compile_seconds: float | None = None
    plain_compile_wait_seconds: float | None = None
    written: int = 0  # of ``left_plain``, the keys whose winner is XLA's dot: as written in every trial

    def __str__(self) -> str:
        def ms(seconds):
            return f"{seconds * 1e3:.3g} ms"

        if self.source == "xla":
            return (f"program: every key's winner is XLA's dot: its {_count(self.keys)} left plain "
                    f"(the program as written) [no compile]")

        text = (f"program: plain {ms(self.plain_seconds)}, tuned {ms(self.tuned_seconds)} "
                f"({self.plain_seconds / self.tuned_seconds:.2f}x)")
        if self.written:
            text += f", its {_count(self.written)} XLA's dot won as written"
        if len(self.left_plain) > self.written:
            text += (f"; {len(self.left_plain)} of {self.keys} keys left plain: {ms(self.final_seconds)} "
                     f"({self.plain_seconds / self.final_seconds:.2f}x)")
        how = f"{self.compiles} compiles, {self.seconds:.1f} s" if self.source == "checked" else "stored"
        return f"{text} [{how}]"


def _count(keys: int) -> str:
    return f"{keys} key" if keys == 1 else f"{keys} keys"


Measure = Callable[..., list]  # sets of keys left plain -> [(seconds, plain's seconds)], one per set


def check(target: Callable, args: Sequence[Any], program_ids: set[str], uses: dict[MatmulKey, int],
          gains: dict[MatmulKey, float], tuner, measure: Measure | None = None,
          xla_won: frozenset = frozenset(), donate: tuple[int, ...] = ()) -> ProgramCheck:
    """Compare ``target(*args)`` tuned and plain; leave the keys that cost it plain in the
    programs ``program_ids`` (see the module docstring). ``uses``: how many dots of each
    key the program has; ``gains``: seconds each key's tuning claims per use; ``xla_won``:
    the keys whose winner is XLA's dot. When that is every key, the tuned program differs
    from plain's only by layout ops around the same dots: every key is left plain without
    compiling anything.
    ``measure(*sets)`` compiles the program with each set of keys left plain and times
    each beside the plain program (default: the wall clock, ``WallClock``, with the
    arguments at positions ``donate`` donated)."""
    started = time.perf_counter()
    keys = claimed_order(uses, gains)
    written = [k for k in keys if k in xla_won]  # as written from the start (the order's first)
    keys = written + [k for k in keys if k not in xla_won]
    if keys and len(written) == len(keys):
        record = programs.ProgramRecord(0.0, 0.0, 0.0, tuple(k.canonical() for k in keys))
        for program in program_ids:
            programs.remember(tuner, program, record)
        return ProgramCheck(0.0, 0.0, 0.0, len(keys), tuple(keys), 0, time.perf_counter() - started, "xla")
    timed = measure or WallClock(target, args, program_ids, tuner, frozenset(keys), donate)
    minor = _minor(keys, uses, gains)
    try:
        (tuned, plain), = timed(frozenset(written))
        left, final = tuple(written), tuned
        if not _faster(tuned, plain):
            faster = False
            if len(minor) > len(written):  # minor keys beyond the written ones (all of them, if any)
                (with_minor, plain_now), = timed(frozenset(minor))
                if _faster(with_minor, plain_now):
                    left, final, faster = tuple(minor), with_minor, True
            if not faster:  # no minor keys, or with them plain still not faster than plain
                left, final = _shortest_prefix(keys, timed, plain, low=max(len(minor), len(written)) + 1)
    finally:
        _leave(program_ids, tuner, frozenset(), persist=False)  # the trials' sets are gone
    early_seconds, early_wait = getattr(timed, "plain_compile", None) or (None, None)
    found = ProgramCheck(plain, tuned, final, len(keys), tuple(left), getattr(timed, "compiles", 0),
                         time.perf_counter() - started, plain_compile_seconds=early_seconds,
                         plain_compile_wait_seconds=early_wait, written=len(written))
    record = programs.ProgramRecord(plain, tuned, final, tuple(k.canonical() for k in left))
    for program in program_ids:
        programs.remember(tuner, program, record)
    return found


def claimed_order(uses: dict[MatmulKey, int], gains: dict[MatmulKey, float]) -> list[MatmulKey]:
    """The keys of ``uses`` by what their tunings claim to gain in the program, least
    first: ``gains`` (seconds per use, none or negative counting 0) x uses."""
    return sorted(uses, key=lambda k: (_claim(k, uses, gains), k.canonical()))


def _claim(key: MatmulKey, uses: dict[MatmulKey, int], gains: dict[MatmulKey, float]) -> float:
    return max(gains.get(key, 0.0), 0.0) * uses[key]


def _minor(keys: list[MatmulKey], uses, gains) -> list[MatmulKey]:
    """The longest prefix of ``keys`` (in claimed order) whose claims together are at most
    ``MINOR_SHARE`` of all of them; empty where that is none or every key."""
    total = sum(_claim(k, uses, gains) for k in keys)
    claimed, prefix = 0.0, []
    for key in keys:
        claimed += _claim(key, uses, gains)
        if claimed > MINOR_SHARE * total:
            break
        prefix.append(key)
    return prefix if len(prefix) < len(keys) else []


def stored(program_ids: set[str], tuner, keys: int) -> ProgramCheck | None:
    """The kept result of an earlier check of every one of ``program_ids``, or None.
    ``keys``: how many keys the program traces tuned now, beside the ones the record leaves
    plain (which a trace no longer binds)."""
    records = [programs.record(tuner, program) for program in program_ids]
    if not records or any(r is None for r in records):
        return None
    first = records[0]
    left = tuple(sorted(set().union(*(r.keys() for r in records)), key=lambda k: k.canonical()))
    return ProgramCheck(first.plain_seconds, first.tuned_seconds, first.final_seconds, keys + len(left), left,
                        source="stored" if first.plain_seconds else "xla")


def _shortest_prefix(keys: list[MatmulKey], timed: Measure, plain: float,
                     low: int = 1) -> tuple[list[MatmulKey], float]:
    """The shortest prefix of ``keys``, of at least ``low``, whose dots left plain make the
    program faster than plain (all of them is the plain program itself), and the
    program's time with it."""
    high, seconds_at_high = len(keys), plain
    while low < high:
        middle = (low + high) // 2
        (seconds, plain_now), = timed(frozenset(keys[:middle]))
        if _faster(seconds, plain_now):
            high, seconds_at_high = middle, seconds
        else:
            low = middle + 1
    return keys[:high], seconds_at_high


def _faster(seconds: float, plain: float) -> bool:
    """Whether a program's ``seconds`` beat ``plain``'s by ``MARGIN`` at least: a gain within
    the timing noise is none, and the program as written risks nothing."""
    return seconds * (1 + MARGIN) <= plain


def _leave(program_ids: set[str], tuner, keys: frozenset, persist: bool) -> None:
    record = programs.ProgramRecord(0.0, 0.0, 0.0, tuple(k.canonical() for k in keys))
    for program in program_ids:
        programs.remember(tuner, program, record, persist=persist)


class WallClock:
    """Compiles ``target`` with sets of keys left plain (``programs``, in memory only) and
    times each against the plain program (every key left plain), interleaved: the median
    wall time of ``ROUNDS`` runs each or more (as many as fill ``TIMED_SECONDS``, at most
    ``MAX_ROUNDS``), every run waited for. Each set is compiled and
    timed once; the sets of one call, and the plain program on the first, compile at once,
    unless ``start_plain`` compiled the plain program earlier, on a thread: ``warmup``
    starts it as the keys start tuning, since it needs no decision (on a GPU, whose
    timings the host's load does not skew). Pass the clock to ``check`` as ``measure``,
    or ``close()`` it. Every program donates the arguments at positions ``donate``, as
    the user's jitted step does (a decode step's cache, updated in place, not written
    anew): each run gets fresh copies of them, made before its timing, so no array of
    the caller's is ever donated. The other arguments move between runs, as in a loop
    that feeds each step's outputs to the next and a new batch each step: a program's
    runs alternate between the arguments and one copy of them (``_arguments``).

        >>> clock = WallClock(step, args, program_ids, tuner, frozenset(keys))
        >>> clock.start_plain()                       # then tune the keys meanwhile
        >>> check(step, args, program_ids, uses, gains, tuner, measure=clock)
    """

    def __init__(self, target: Callable, args: Sequence[Any], program_ids: set[str], tuner,
                 every_key: frozenset, donate: tuple[int, ...] = ()):
        self.target, self.args, self.donate = target, tuple(_concrete(args)), tuple(donate)
        self.program_ids, self.tuner, self.every_key = program_ids, tuner, every_key
        self.compiles = 0
        self._plain = None
        self._plain_future: concurrent.futures.Future | None = None
        self.plain_compile: tuple[float, float] | None = None  # start_plain's (seconds, device wait)
        self._lowering = threading.Lock()  # one lowering at a time: each reads its set from ``programs``
        self._timed: dict[frozenset, tuple[float, float]] = {}
        self._moved: tuple | None = None  # the arguments' copy, made at the first run
        self._turns: dict[int, int] = {}  # id(program): its runs so far

    def start_plain(self) -> None:
        """Lower and compile the plain program on a thread; ``_time`` takes it from there.
        The compile holds the device alone (``DEVICE_LOCK``): XLA's GEMM autotuner times
        the program's dots on the device meanwhile, as it does in a candidate's compile."""
        def plain():
            started, waited = time.perf_counter(), DEVICE_LOCK.waited_seconds()
            lowered = self._lowered(self.every_key)
            try:
                with DEVICE_LOCK.exclusive():
                    return lowered.compile()
            finally:
                self.plain_compile = (time.perf_counter() - started, DEVICE_LOCK.waited_seconds() - waited)

        pool = concurrent.futures.ThreadPoolExecutor(1)
        self.compiles += 1
        self._plain_future = pool.submit(carrying_x64(plain))
        pool.shutdown(wait=False)  # returns at once; the thread runs on

    def close(self) -> None:
        """Wait for a plain compile ``start_plain`` began (a check that compiles nothing);
        free the arguments' copy."""
        if self._plain_future is not None:
            self._plain_future.exception()
        self._moved = None

    def _lowered(self, left: frozenset):
        with self._lowering:
            _leave(self.program_ids, self.tuner, left, persist=False)  # read while it lowers
            try:
                with fresh_traces():  # a jitted target kept the trace of another set
                    return jax.jit(lambda *a: self.target(*a), donate_argnums=self.donate).lower(*self.args)
            finally:  # between lowerings, the program as tuned (never a trial's set)
                _leave(self.program_ids, self.tuner, frozenset(), persist=False)

    def _compiled(self, *lowered):
        """Each of ``lowered`` compiled, at once on threads: XLA compiles without the GIL."""
        self.compiles += len(lowered)
        if len(lowered) == 1:
            return [lowered[0].compile()]
        with concurrent.futures.ThreadPoolExecutor(len(lowered)) as pool:
            return list(pool.map(carrying_x64(lambda program: program.compile()), lowered))

    def __call__(self, *lefts: frozenset) -> list[tuple[float, float]]:
        new = [left for left in dict.fromkeys(lefts) if left not in self._timed]
        if new:
            self._time(new)
        return [self._timed[left] for left in lefts]

    def _time(self, lefts: list[frozenset]) -> None:
        if self._plain is None and self._plain_future is not None:
            compiled = self._compiled(*(self._lowered(left) for left in lefts))
            self._plain = self._plain_future.result()
        else:
            sets = ([self.every_key] if self._plain is None else []) + lefts
            compiled = self._compiled(*(self._lowered(left) for left in sets))
            if self._plain is None:
                self._plain, compiled = compiled[0], compiled[1:]
        executables = [*compiled, self._plain]
        for program in executables:  # untimed: caches, allocations
            self._run(program)
        rounds = min(MAX_ROUNDS, max(ROUNDS, math.ceil(  # untimed too: how long a round takes
            TIMED_SECONDS / sum(self._run(program) for program in executables))))
        runs: list[list[float]] = [[] for _ in executables]
        for _ in range(rounds):
            for which, program in enumerate(executables):
                runs[which].append(self._run(program))
        plain = statistics.median(runs[-1])
        for left, seconds in zip(lefts, runs):
            self._timed[left] = statistics.median(seconds), plain

    def _run(self, program) -> float:
        """Wall seconds of one run of ``program``, waited for; its arguments made first,
        outside the timing."""
        args, moved = self._arguments(program)
        start = time.perf_counter()
        try:
            jax.block_until_ready(program(*args))
        except Exception as error:  # noqa: BLE001 - out of device memory beside the copy, say
            if not moved:  # the caller's arrays: the program's own failure
                raise
            self._stay(error)
            return self._run(program)
        return time.perf_counter() - start

    def _arguments(self, program) -> tuple[list, bool]:
        """The arguments of ``program``'s next run, and whether they are the copy: the donated
        ones fresh copies, the others the caller's arrays and a copy of them in turns. A
        training loop that does not donate gives its step arrays at new addresses every step
        (the last step's outputs, a new batch), and XLA:GPU updates a program's CUDA graphs
        for every buffer that moved before it runs it, a cost runs on the same buffers never
        show. Where the copy cannot be made or run (no memory for it), every run takes the
        caller's arrays."""
        turn = self._turns[id(program)] = self._turns.get(id(program), -1) + 1
        if turn % 2 and self._moved is None:
            self._moved = self._copied()
        moved = bool(turn % 2) and self._moved is not self.args
        args = list(self._moved if moved else self.args)
        for position in self.donate:
            args[position] = jax.block_until_ready(jax.tree_util.tree_map(_copy, self.args[position]))
        return args, moved

    def _copied(self) -> tuple:
        """A copy of the arguments but the donated ones (each run copies those anyway)."""
        try:
            return tuple(arg if position in self.donate else
                         jax.block_until_ready(jax.tree_util.tree_map(_copy, arg))
                         for position, arg in enumerate(self.args))
        except Exception as error:  # noqa: BLE001 - out of device memory, say: time as before
            return self._stay(error)

    def _stay(self, error: Exception) -> tuple:
        """Every later run on the caller's arrays (the copy freed), with a warning."""
        self._moved = self.args
        warnings.warn(f"jax_autotune: the program check could not run on a copy of the arguments "
                      f"({type(error).__name__}: {error}); it times every run on the same buffers, "
                      f"which a loop that feeds its outputs back does not",
                      JaxAutotuneWarning, stacklevel=3)
        return self.args


def _copy(leaf):
    return jax.numpy.array(leaf, copy=True) if isinstance(leaf, jax.Array) else leaf


def _concrete(args):
    """Arrays for every abstract leaf (``jax.ShapeDtypeStruct``): small random floats, zeros
    otherwise (integer tokens, masks)."""
    rng = np.random.default_rng(0)

    def leaf(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if is_floating(x.dtype):
            return jax.numpy.asarray(rng.standard_normal(x.shape) * 0.02, x.dtype)
        return jax.numpy.zeros(x.shape, x.dtype)

    return jax.tree_util.tree_map(leaf, args)


__all__ = ["ProgramCheck", "check", "claimed_order", "WallClock", "stored", "fresh_traces", "MARGIN", "MINOR_SHARE"]
