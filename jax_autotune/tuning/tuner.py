"""The tuner: a key's decision from memory, the store, or a fresh benchmark.

``Tuner.select(problem, key)`` looks up, in order:

1. the memory table (``memory_hits``);
2. the persistent store, under (canonical key, candidate-set checksum); an entry whose
   winner this build does not know is ignored (``store_hits``);
3. by mode: ``off`` -> XLA's dot; ``cached`` -> XLA's dot (nothing is tuned);
   ``require`` -> ``KeyNotTunedError``; ``tune`` -> benchmark now (``tuned``), store the
   decision in memory and on disk, and log it.

A key being tuned is pending: another thread asking for it waits for that decision.
Errors never escape tuning: if anything fails, the decision is XLA's dot with the reason.

    >>> tuner = jax_autotune.tuners.tuner_for("cpu")      # the registry builds tuners
    >>> decision = tuner.select(problem)
    >>> tuner.candidate(decision.winner).fn(lhs, rhs, problem)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from typing import Callable

import jax

import jax_autotune.config as config
from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import counters
from jax_autotune.tuning.bench import CompileQueue, KeyBenchmark
from jax_autotune.tuning.candidates import Candidate, CandidateSet
from jax_autotune.tuning.correctness import prepare_check, reference
from jax_autotune.tuning.decision import CandidateResult, Decision, log_decision
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.plan import make_plan
from jax_autotune.tuning.probes import Probes
from jax_autotune.tuning.roofline import roofline_bounds
from jax_autotune.tuning.rules import DEFAULT_RULES, TuningRules
from jax_autotune.tuning.store import TuneStore, decision_namespace, open_store
from jax_autotune.tuning.timing import Timer, random_operands, timer_for

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


class KeyNotTunedError(RuntimeError):
    """Mode ``require`` met a key that is not in the tune table."""


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
        self.rules = rules
        self.clock = clock
        self.probes = probes or Probes(device, jax_device, self.timer, self.store, native,
                                       baseline=candidate_set.baseline)
        self.namespace = decision_namespace(device.fingerprint)
        self.checksum = candidate_set.checksum()
        self._memory: dict[MatmulKey, Decision] = {}
        self._pending: dict[MatmulKey, threading.Event] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- lookups
    def candidate(self, name: str) -> Candidate:
        return self.candidate_set.by_name(name)

    def lookup(self, key: MatmulKey) -> Decision | None:
        """Memory, then store; None on a miss (no tuning, no counters)."""
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        return self._from_store(key)

    def _from_store(self, key: MatmulKey) -> Decision | None:
        data = self.store.get(self.namespace, key.canonical(), self.checksum)
        if data is None:
            return None
        try:
            decision = Decision.from_json(data)
            self.candidate(decision.winner)
        except (ValueError, KeyError):
            return None  # unknown winner or damaged value: re-tune
        return decision.with_source("store")

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
                    return self._memory[key].with_source("memory")
                pending = self._pending.get(key)
                if pending is None:
                    stored = self._from_store(key)
                    if stored is not None:
                        counters.bump("store_hits")
                        self._memory[key] = stored
                        return stored
                    if mode == "cached":
                        return self._fallback(key, problem, "mode cached: key not in the table")
                    if mode == "require":
                        raise KeyNotTunedError(_require_message(key, problem))
                    event = self._pending[key] = threading.Event()
                    break
            pending.wait()  # another thread is tuning this key
        try:
            decision = self._tune(key, problem)
            with self._lock:
                self._memory[key] = decision
            if decision.source == "tuned":  # a failed tuning is retried by the next process
                self.store.put(self.namespace, key.canonical(), self.checksum, decision.to_json())
            log_decision(decision, config.get("log_decisions"))
            return decision
        finally:
            with self._lock:
                self._pending.pop(key, None)
            event.set()

    def install(self, decision: Decision, persist: bool = True) -> bool:
        """Put a decision (e.g. from a tune table) into memory and the store.

        False if its winner is unknown to this candidate set.
        """
        try:
            self.candidate(decision.winner)
        except KeyError:
            return False
        decision = dataclasses.replace(decision, checksum=self.checksum, device=self.device.fingerprint)
        with self._lock:
            self._memory[decision.key] = decision
        if persist:
            self.store.put(self.namespace, decision.key.canonical(), self.checksum, decision.to_json())
        return True

    def decisions(self) -> list[Decision]:
        """Every decision this tuner knows: memory, then the store's for this device."""
        with self._lock:
            known = dict(self._memory)
        for entry in self.store.entries(self.namespace):
            if entry.checksum != self.checksum:
                continue
            try:
                decision = Decision.from_json(entry.value)
            except ValueError:
                continue
            known.setdefault(decision.key, decision.with_source("store"))
        return list(known.values())

    def use_store(self, store: TuneStore) -> None:
        """Switch to another store (decisions and probes are read from and written there)."""
        old, self.store, self.probes.store = self.store, store, store
        old.close()

    def forget(self) -> None:
        """Drop the memory table (the store is untouched)."""
        with self._lock:
            self._memory.clear()

    # ---------------------------------------------------------------- tuning
    def _fallback(self, key: MatmulKey, problem: MatmulProblem, reason: str) -> Decision:
        counters.bump("fallbacks")
        return Decision(key=key, problem=problem, winner=self.candidate_set.baseline.name,
                        device=self.device.fingerprint, checksum=self.checksum,
                        source="fallback", reason=reason)

    def _tune(self, key: MatmulKey, problem: MatmulProblem) -> Decision:
        started = self.clock()
        plan = make_plan(self.candidate_set, key, self.device)
        fields = dict(key=key, problem=problem, device=self.device.fingerprint,
                      checksum=self.checksum, source="tuned")
        if not plan.rounds:  # nothing to compare: XLA's dot, without a benchmark
            return Decision(winner=plan.baseline.name,
                            reason=plan.reason or "no other candidate for this key", **fields)
        counters.bump("tuned")
        try:
            with jax.transfer_guard("allow"):
                return self._benchmark(plan, problem, started, fields)
        except Exception as err:  # noqa: BLE001 - tuning must never break the user's program
            counters.bump("fallbacks")
            return Decision(**{**fields, "source": "fallback"}, winner=plan.baseline.name,
                            tuning_seconds=self.clock() - started,
                            reason=f"tuning failed: {type(err).__name__}: {err}"[:500])
        finally:
            counters.bump("tuning_seconds", self.clock() - started)

    def _benchmark(self, plan, problem: MatmulProblem, started: float, fields: dict) -> Decision:
        rules = self.rules or DEFAULT_RULES
        budget = rules.budget_seconds or config.get("budget_seconds")
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
                compiles.start(plan.baseline)
                peaks_future = side.submit(self.probes.peaks_for, problem)
            with phases("reference"):
                on_host = self.device.platform == "cpu"
                ref = reference(problem, *inputs, **({} if on_host else {"host_max_macs": 0}))
                prepare_check(problem, ref, self._jax_device())
            with phases("probes"):  # the wait for them, when they ran beside the reference
                peaks = peaks_future.result() if peaks_future else self.probes.peaks_for(problem)
            bounds = roofline_bounds(problem, peaks, config.get("level"), rules)
            bench = KeyBenchmark(problem, inputs, ref, self.timer, limit=bounds.limit, rules=rules,
                                 clock=self.clock, budget_seconds=budget, platform=self.device.platform,
                                 compiles=compiles)
            with phases("rounds"):
                for round_ in plan.rounds:
                    if bench.run_round(plan.baseline, round_.candidates, round_.label) or bench.finished:
                        break
        finally:
            side.shutdown(wait=True)
            compiles.close()
        planned = {c.name for r in plan.rounds for c in r.candidates}
        for name in sorted(planned - set(bench.results)):
            bench.results[name] = CandidateResult(name, "skipped", error="later round not needed")
        winner = bench.winner(baseline=plan.baseline.name)
        reason = ""
        if winner is None:
            winner, reason = plan.baseline.name, "no candidate produced a valid timing"
            counters.bump("fallbacks")
        return Decision(winner=winner, results=tuple(bench.results.values()),
                        bounds={**bounds.to_json(), "phase_seconds": phases.seconds}, limit=bounds.limit,
                        tuning_seconds=self.clock() - started, reason=reason, **fields)

    def _jax_device(self):
        if self.jax_device is None:
            self.jax_device = jax.devices(self.device.platform)[0]
        return self.jax_device


def _require_message(key: MatmulKey, problem: MatmulProblem) -> str:
    shape = (problem.batch, problem.m, problem.n, problem.k)
    return (f"jax_autotune: mode 'require' and no tuned decision for key [{key.canonical()}]. "
            f"Pre-tune it with jax_autotune.warmup([{shape}], dtype={problem.lhs_dtype!r}, "
            f"transpose_a={problem.transpose_a}, transpose_b={problem.transpose_b}, "
            f"precision={problem.precision.value!r}) or jax_autotune.warmup(fn, *example_args), "
            f"or load a tune table with jax_autotune.load_table(path).")
