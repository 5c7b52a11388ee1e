"""The tuner: a key's decision from memory, the store, or a fresh benchmark.

``Tuner.select(problem, key)`` looks up, in order:

1. the memory table (``memory_hits``);
2. the persistent store, under (canonical key, candidate-set checksum) (``store_hits``);
3. by mode: ``off`` -> XLA's dot; ``cached`` -> XLA's dot (nothing is tuned);
   ``require`` -> ``KeyNotTunedError``; ``tune`` -> decided once (``tuning.consensus``):
   benchmarked now (``tuned``) by the one process that claims the key in the shared store
   or the jax.distributed job, adopted by the others; kept in memory and on disk, logged.

A decision enters only if its winner can run the key here (``Tuner.unusable``): a stored
entry or an installed table entry whose winner is unknown to this build, or whose
``supports`` says no for this device and key, is rejected with one warning naming the
key and the candidate; the key is then tuned again, or (``cached``, ``require``) runs
with XLA's dot: the key is in the table, so ``require`` does not raise for it.

A key being tuned is pending: another thread asking for it waits for that decision.
Errors never escape tuning: if anything fails, the decision is XLA's dot with the reason
(a bad setting, e.g. ``budget_seconds``, is the user's: its ``ConfigError`` propagates).
A tuning that measured nothing valid is a fallback, kept in memory only.

    >>> tuner = jax_autotune.registry.tuner_for("cpu")      # the registry builds tuners
    >>> decision = tuner.select(problem)
    >>> tuner.candidate(decision.winner).fn(lhs, rhs, problem)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import threading
import time
import warnings
from typing import Callable, Iterable

import jax

from jax_autotune.errors import KeyNotTunedError
import jax_autotune.config as config
from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import counters, progress, xla_priming
from jax_autotune.tuning.bench import CompileQueue, KeyBenchmark
from jax_autotune.tuning.candidates import Candidate, CandidateSet
from jax_autotune.tuning.consensus import (ConsensusWarning, current_job, decide_in_job,
                                           decide_on_host, job_key)
from jax_autotune.tuning.correctness import prepare_check, reference
from jax_autotune.tuning.decision import CandidateResult, Decision, log_decision
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.plan import DEMOTED, make_plan
from jax_autotune.tuning.probes import Probes
from jax_autotune.tuning.roofline import roofline_bounds
from jax_autotune.tuning.rules import DEFAULT_RULES, TuningRules
from jax_autotune.tuning.namespaces import decision_namespace
from jax_autotune.tuning.store import StoreWarning, TuneStore, open_store
from jax_autotune.tuning.threads import carrying_x64
from jax_autotune.tuning.timing import Timer, checked_problem, random_operands, timer_for
from jax_autotune.tuning.validation import TuneTableError, parse_entry

class PhaseClock:
    """Wall seconds per named phase of a tuning: ``with phases("reference"): ...``."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.seconds = clock, {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start


def stored_decision(store: TuneStore, namespace: str, key: str, checksum: str,
                    value: dict) -> Decision | None:
    """A store row's value as a Decision when it meets the rules of a tune-table entry
    (``validation.parse_entry``); None, with the store's one bad-row warning, otherwise.

        >>> stored_decision(store, entry.namespace, entry.key, entry.checksum, entry.value)
    """
    try:
        return parse_entry(value, "", "value")
    except TuneTableError as err:
        store.skip_row(namespace, key, checksum, str(err))
        return None


_recorders: list[list] = []
_recorders_lock = threading.Lock()


@contextlib.contextmanager
def record_decisions():
    """Collect the decision of every key any tuner is asked for meanwhile, from any
    thread (XLA's partitioner asks for per-shard keys while it compiles).

        >>> with record_decisions() as asked:
        ...     jax.jit(step).lower(params, batch).compile()
        >>> [d.key for d in asked]
    """
    asked: list = []
    with _recorders_lock:
        _recorders.append(asked)
    try:
        yield asked
    finally:
        with _recorders_lock:
            _recorders.remove(asked)


def _record(decision: Decision) -> Decision:
    if not _recorders:  # the common case, without the lock: nobody is recording
        return decision
    with _recorders_lock:
        for asked in _recorders:
            asked.append(decision)
    return decision


@dataclasses.dataclass(frozen=True)
class Installed:
    """What ``Tuner.install_many`` did: decisions installed, why others were rejected, and
    whether the store took them (False: they live in memory only)."""

    installed: int
    rejected: tuple[str, ...]
    persisted: bool


def _instead(mode: str | None) -> str:
    """What a rejected decision is replaced with under ``mode``."""
    return "the key is tuned again" if mode == "tune" else "XLA's dot runs it"


class Tuner:
    """Decisions for one device: memory table, store, plan, benchmark."""

    def __init__(self, device: DeviceInfo, candidate_set: CandidateSet, *, jax_device=None,
                 timer: Timer | None = None, store: TuneStore | None = None,
                 rules: TuningRules | None = None, clock: Callable[[], float] = time.perf_counter,
                 probes: Probes | None = None, native=None):
        self.device = device
        self.candidate_set = candidate_set
        self.jax_device = jax_device
        self.timer = timer or timer_for(device.platform)
        self.store = store if store is not None else open_store()
        self.rules = rules or DEFAULT_RULES
        self.clock = clock
        self.probes = probes or Probes(
            device, jax_device, self.timer, self.store, native, baseline=candidate_set.baseline,
            quick=tuple(c for c in candidate_set.candidates if c.quick_compile))
        self.namespace = decision_namespace(device.fingerprint)
        self.checksum = candidate_set.checksum()
        self._memory: dict[MatmulKey, Decision] = {}
        self._pending: dict[MatmulKey, threading.Event] = {}
        self._rejected: dict[MatmulKey, str] = {}  # keys whose table or store entry was rejected: why
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- lookups
    def candidate(self, name: str) -> Candidate:
        return self.candidate_set.by_name(name)

    def lookup(self, key: MatmulKey) -> Decision | None:
        """Memory, then store; None on a miss or a rejected entry (no tuning, no counters)."""
        with self._lock:
            found = self._memory.get(key)
        return found if found is not None else self._from_store(key)[0]

    def unusable(self, decision: Decision, key: MatmulKey | None = None) -> str:
        """Why ``decision``'s winner cannot run ``key`` (default: the decision's) here, or
        '' when it can: the winner is not in this candidate set, or its ``supports`` says
        no for this device and key (a hand-edited row, another machine's table).

            >>> tuner.unusable(dataclasses.replace(decision, winner="native_small_avx2_t1"))
            "winner 'native_small_avx2_t1' cannot run key [m=512 ...] on cpu-...-avx2"
        """
        key = key or decision.key
        try:
            candidate = self.candidate(decision.winner)
        except KeyError:
            return f"winner {decision.winner!r} is not a candidate of this build (key [{key.canonical()}])"
        if candidate.runs(self.device, key):
            return ""
        return f"winner {decision.winner!r} cannot run key [{key.canonical()}] on {self.device.fingerprint}"

    def _from_store(self, key: MatmulKey, mode: str | None = None) -> tuple[Decision | None, str]:
        """(the stored decision, '') or (None, why the stored entry was rejected: '' for a
        plain miss). A rejected entry warns once per key."""
        data = self.store.get(self.namespace, key.canonical(), self.checksum)
        decision = None if data is None else self._stored(key.canonical(), data)
        if decision is None:  # missing, or a damaged value: a miss, re-tuned
            return None, ""
        reason = self.unusable(decision, key)
        if reason:
            if key not in self._rejected:
                self._rejected[key] = reason
                warnings.warn(f"jax_autotune: ignoring the stored decision of {self.store.path}: "
                              f"{reason}; {_instead(mode or config.get('mode'))}", StoreWarning,
                              stacklevel=4)
            return None, reason
        return decision.with_source("store"), ""

    def _usable(self, data: dict, key: MatmulKey) -> bool:
        """Whether a stored value is a decision this build can run for ``key`` (a stored
        value that is not is tuned again and replaced)."""
        decision = self._stored(key.canonical(), data)
        return decision is not None and not self.unusable(decision, key)

    def _stored(self, key_string: str, data: dict) -> Decision | None:
        return stored_decision(self.store, self.namespace, key_string, self.checksum, data)

    def select(self, problem: MatmulProblem, key: MatmulKey | None = None,
               mode: str | None = None) -> Decision:
        key = key or problem.key(config.get("level"))
        mode = mode or config.get("mode")
        if mode == "off":
            return self._fallback(key, problem, "mode off")
        while True:
            with self._lock:
                if key in self._memory:
                    counters.bump("memory_hits")
                    return _record(self._memory[key].with_source("memory"))
                pending = self._pending.get(key)
                if pending is None:
                    event = self._pending[key] = threading.Event()
                    break
            pending.wait()  # another thread is deciding this key
        try:
            decision, remember = self._decide(key, problem, mode)
            if remember:
                with self._lock:
                    self._memory[key] = decision
            return _record(decision)
        finally:
            with self._lock:
                self._pending.pop(key, None)
            event.set()

    def _decide(self, key: MatmulKey, problem: MatmulProblem, mode: str) -> tuple[Decision, bool]:
        """A key missing from memory: the store's decision, or one made now, once per
        host (claims in the store) or per job (``tuning.consensus``); and whether to keep
        it in memory (not XLA's dot standing in under cached or require: a table loaded
        later serves the key)."""
        stored, rejected = self._from_store(key, mode)
        rejected = rejected or self._rejected.get(key, "")
        job = current_job()
        if job is None and stored is not None:
            counters.bump("store_hits")
            return stored, True
        if stored is None and mode in ("cached", "require") and rejected:
            # the key is in the table, but its kernel cannot run here
            return self._fallback(key, problem, f"mode {mode}: entry rejected: {rejected}"), False
        if stored is None and mode == "require":
            raise KeyNotTunedError(_require_message(key, problem))
        if job is None and mode == "cached":
            return self._fallback(key, problem, "mode cached: key not in the table"), False
        wait = self.rules.peer_wait(self._budget())
        fallback = functools.partial(self._fallback, key, problem)
        tune = functools.partial(self._tune, key, problem)
        usable = functools.partial(self._usable, key=key)
        if job is None:
            decision, how = decide_on_host(self.store, self.namespace, key.canonical(), self.checksum,
                                           tune, fallback, self.rules.claim_lease_seconds, wait, usable=usable)
        else:
            propose = (lambda: stored) if stored is not None else (
                (lambda: fallback("mode cached: key not in the table")) if mode == "cached" else tune)
            try:
                decision, how = decide_in_job(job, job_key(self.device.platform, self.checksum, key.canonical()),
                                              propose, fallback, wait)
            except Exception as err:  # noqa: BLE001 - the job's store failed: never the user's matmul
                warnings.warn(f"jax_autotune: the job's key-value store failed ({type(err).__name__}: "
                              f"{str(err)[:200]}); XLA's dot for this key in this process",
                              ConsensusWarning, stacklevel=3)
                decision, how = fallback("the job's key-value store failed"), "fallback"
            if how == "proposed" and stored is not None:
                how = "stored"
            if stored is None and decision.source in ("tuned", "adopted"):
                self.store.put_if_absent(self.namespace, key.canonical(), self.checksum,
                                         dataclasses.replace(decision, device=self.device.fingerprint).to_json(),
                                         keep=usable)
        if how == "stored":
            counters.bump("store_hits")
            return decision.with_source("store"), True
        if how == "adopted":
            decision = dataclasses.replace(decision, source="adopted", device=self.device.fingerprint)
        log_decision(decision, config.get("log_decisions"))
        return decision, True

    def measure(self, problem: MatmulProblem, key: MatmulKey | None = None) -> Decision:
        """Benchmark the key now and return the decision; nothing is stored or replaced
        (an export ranks a decision that holds no measured results with it).

            >>> tuner.measure(problem).results
        """
        return self._tune(key or problem.key(config.get("level")), problem)

    def install(self, decision: Decision, persist: bool = True) -> bool:
        """``install_many([decision])``; False if the decision was rejected."""
        return not self.install_many([decision], persist=persist).rejected

    def install_many(self, decisions: Iterable[Decision], persist: bool = True) -> Installed:
        """Put decisions (e.g. a tune table's) into memory and (``persist``) the store, all
        in one transaction. A decision whose winner cannot run its key here is rejected:
        ``Installed.rejected`` says why, naming the key and the candidate.

            >>> tuner.install_many(table_entries)
            Installed(installed=120, rejected=(), persisted=True)
        """
        accepted, rejected = [], {}
        for decision in decisions:
            reason = self.unusable(decision)
            if reason:
                rejected[decision.key] = reason
                continue
            accepted.append(dataclasses.replace(decision, checksum=self.checksum,
                                                device=self.device.fingerprint))
        with self._lock:
            self._rejected.update(rejected)
            for decision in accepted:
                self._memory[decision.key] = decision
                self._rejected.pop(decision.key, None)
        persisted = not persist or not accepted or self.store.put_many(
            (self.namespace, d.key.canonical(), self.checksum, d.to_json()) for d in accepted)
        return Installed(len(accepted), tuple(rejected.values()), persisted)

    def memory_decisions(self) -> list[Decision]:
        """The decisions this tuner holds in memory (tuned, installed or read this process)."""
        with self._lock:
            return list(self._memory.values())

    def decisions(self) -> list[Decision]:
        """Every decision this tuner knows: memory, then the store's for this device."""
        known = {d.key: d for d in self.memory_decisions()}
        for entry in self.store.entries(self.namespace):
            if entry.checksum != self.checksum:
                continue
            decision = self._stored(entry.key, entry.value)
            if decision is not None:
                known.setdefault(decision.key, decision.with_source("store"))
        return list(known.values())

    def use_store(self, store: TuneStore) -> None:
        """Switch to another store (decisions and probes are read from and written there)."""
        old, self.store, self.probes.store = self.store, store, store
        old.close()

    def forget(self) -> None:
        """Drop the memory table and the rejected keys (the store is untouched)."""
        with self._lock:
            self._memory.clear()
            self._rejected.clear()

    # ---------------------------------------------------------------- tuning
    def _fallback(self, key: MatmulKey, problem: MatmulProblem, reason: str) -> Decision:
        counters.bump("fallbacks")
        return Decision(key=key, problem=problem, winner=self.candidate_set.baseline.name,
                        device=self.device.fingerprint, checksum=self.checksum,
                        source="fallback", reason=reason)

    @progress.reported  # a log record per key; a line on a terminal while a long one runs
    def _tune(self, key: MatmulKey, problem: MatmulProblem) -> Decision:
        started = self.clock()
        plan = make_plan(self.candidate_set, key, self.device)
        fields = dict(key=key, problem=problem, device=self.device.fingerprint,
                      checksum=self.checksum, source="tuned")
        # the device cannot run these for this key: recorded, never compiled
        unsupported = {c.name: CandidateResult(c.name, "skipped", round=DEMOTED,
                                               error="cannot run this key on this device")
                       for c in plan.unsupported}
        if not plan.runnable:  # nothing to compare: XLA's dot, without a benchmark or probes
            return Decision(winner=plan.baseline.name, results=tuple(unsupported.values()),
                            reason=plan.reason or "no other candidate can run this key", **fields)
        budget = self._budget()
        counters.bump("tuned")
        try:
            with jax.transfer_guard("allow"):
                return self._benchmark(plan, problem, started, fields, budget, unsupported)
        except Exception as err:  # noqa: BLE001 - tuning must never break the user's program
            counters.bump("fallbacks")
            return Decision(**{**fields, "source": "fallback"}, winner=plan.baseline.name,
                            tuning_seconds=self.clock() - started,
                            reason=f"tuning failed: {type(err).__name__}: {err}"[:500])
        finally:
            counters.bump("tuning_seconds", self.clock() - started)

    def _budget(self) -> float:
        """Seconds a key's tuning may take: the rules', else the setting (a bad one raises)."""
        return self.rules.budget_seconds or config.get("budget_seconds")

    def _benchmark(self, plan, problem: MatmulProblem, started: float, fields: dict,
                   budget: float, unsupported: dict[str, CandidateResult]) -> Decision:
        rules = self.rules
        phases = PhaseClock(time.perf_counter)
        with phases("operands"):
            inputs = random_operands(problem, self._jax_device())
        compiles = CompileQueue(self.timer, problem, inputs, KeyBenchmark.compile_threads(self.timer, rules))
        side = concurrent.futures.ThreadPoolExecutor(1)
        try:
            peaks_future = None
            if self.timer.measures_device_time:
                # device time is not disturbed by host work: XLA's dot compiles and the
                # probes run while the reference is computed (with a host clock, the probes
                # must run alone)
                if self.device.platform == "gpu":
                    compiles.prime(_xla_round(plan), self._jax_device())
                compiles.start(plan.baseline)
                peaks_future = side.submit(carrying_x64(self.probes.peaks_for), problem)
            with phases("reference"):
                on_host = self.device.platform == "cpu"
                checked = checked_problem(problem)  # the context, or its product when it reduces
                ref = reference(checked, *inputs[:len(checked.input_specs())],
                                **({} if on_host else {"host_max_macs": 0}))
                prepare_check(checked, ref, self._jax_device())
            with phases("probes"):  # the wait for them, when they ran beside the reference
                peaks = peaks_future.result() if peaks_future else self.probes.peaks_for(problem)
            bounds = roofline_bounds(problem, peaks, config.get("level"), rules)
            bench = KeyBenchmark(problem, inputs, ref, self.timer, limit=bounds.limit, rules=rules,
                                 clock=self.clock, budget_seconds=budget, platform=self.device.platform,
                                 compiles=compiles)
            with phases("rounds"):
                for round_ in plan.runnable:
                    if bench.run_round(plan.baseline, round_.candidates, round_.label) or bench.finished:
                        break
        finally:
            side.shutdown(wait=True)
            compiles.close()
        planned = {c.name for r in plan.runnable for c in r.candidates}
        for name in sorted(planned - set(bench.results)):
            bench.results[name] = CandidateResult(name, "skipped", error="later round not needed")
        results = tuple({**bench.results, **unsupported}.values())
        details = dict(results=results, bounds={**bounds.to_json(), "phase_seconds": phases.seconds},
                       limit=bounds.limit, tuning_seconds=self.clock() - started)
        winner = bench.winner(baseline=plan.baseline.name)
        if winner is None:  # nothing was measured: not a decision to keep (the next process re-tunes)
            counters.bump("fallbacks")
            reason = f"no candidate produced a valid timing{f' ({bench.finish_reason})' if bench.finish_reason else ''}"
            return Decision(winner=plan.baseline.name, reason=reason, **details,
                            **{**fields, "source": "fallback"})
        return Decision(winner=winner, **details, **fields)

    def prime(self, work: Iterable[tuple[MatmulKey, MatmulProblem]]) -> int:
        """On a GPU, autotune in one compile the XLA dots of every key of ``work`` that
        will be tuned (``tuning.xla_priming``): their tunings then take XLA's kept
        choices. How many XLA-based candidates it primed.

            >>> tuner.prime([(problem.key(), problem) for problem in problems])
            14
        """
        if self.device.platform != "gpu" or config.get("mode") != "tune":
            return 0
        pairs = [(problem, candidate) for key, problem in work if self.lookup(key) is None
                 for candidate in _xla_round(make_plan(self.candidate_set, key, self.device))]
        return xla_priming.prime(pairs, self._jax_device())

    def _jax_device(self):
        if self.jax_device is None:
            self.jax_device = jax.local_devices(backend=self.device.platform)[0]
        return self.jax_device


def _xla_round(plan) -> tuple[Candidate, ...]:
    """What to prime for a key: its baseline and, where the first round's group says so
    (``Group.primes_xla``), that round's candidates that run XLA's GEMM autotuner."""
    first = plan.runnable[0] if plan.runnable else None
    beside = first.candidates if first is not None and first.primes_xla else ()
    return tuple(c for c in (plan.baseline, *beside) if c.xla_autotuned)


def _require_message(key: MatmulKey, problem: MatmulProblem) -> str:
    shape = (problem.batch, problem.m, problem.n, problem.k)
    return (f"jax_autotune: mode 'require' and no tuned decision for key [{key.canonical()}]. "
            f"Pre-tune it with jax_autotune.warmup([{shape}], dtype={problem.lhs_dtype!r}, "
            f"transpose_a={problem.transpose_a}, transpose_b={problem.transpose_b}, "
            f"precision={problem.precision.value!r}) or jax_autotune.warmup(fn, *example_args), "
            f"or load a tune table with jax_autotune.load_table(path).")
