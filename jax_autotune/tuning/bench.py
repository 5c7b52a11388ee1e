"""The adaptive benchmark of one key: compile, check, sample, prune, short-circuit.

For each round of the plan (see ``plan``), with XLA's dot as the baseline:

1. order the round: XLA's dot first (compiled and measured alone, so that when it
   short-circuits nothing else is compiled; on a GPU XLA autotunes the round's other
   XLA-based candidates in the same compile, ``xla_priming``), then the candidates that
   compile in milliseconds (``quick_compile``: library and FFI calls), then the rest by estimated
   cost; compile in parallel threads (``Timer.prepare``): all of a stage before timing
   with a host clock, a few ahead of the one being measured with a device timer;
   a costly-to-compile candidate whose estimate is over ``cost_skip_ratio`` x the best
   time measured so far is not compiled (``skipped``, "cost model");
2. run each once (the warm-up) and compare its output with the reference (and, with
   a sampled reference, the whole output with XLA's dot's once that passed): a wrong
   result is recorded as ``wrong_result`` and never timed;
3. sample candidates one after another in that order: the first sample is
   discarded, then 3 to 10 are kept; a candidate
   stops early once its kept samples are stable (median within 3% of the best);
4. pruning: after 3 kept samples a candidate whose best is over 1.5x the best so far
   is dropped (``pruned``), unless that would leave fewer than two measured survivors;
5. short-circuit: the first candidate with 2 samples inside the roofline limit ends
   the whole tuning; candidates not yet sampled are ``skipped``, except the quick ones
   of the round (a library GEMM can still beat XLA's dot near the roofline, and
   measuring one costs milliseconds);
6. the per-key budget ends tuning with the best so far (the rest ``skipped``); XLA's dot
   is measured even past it, so every decision rests on a measurement. The budget counts
   the key's own time: its thread's waits for the device lock (``DEVICE_LOCK``) are not in it.

The winner is the eligible candidate (outcome ``ok``, not pruned) with the lowest
SCORE, the median of its kept samples; it replaces XLA's dot only when it is faster by
more than ``baseline_margin`` (2%), so noise never trades XLA's dot for an equal kernel.
With a host clock the fastest other candidate (within the prune ratio of XLA's dot) is
then timed in turns with XLA's dot, and that comparison decides, by the same margin
(``KeyBenchmark.compare_in_turns``: up to 8 pairs, the median of their ratios). Every
constant is in ``rules.TuningRules``.

    >>> bench = KeyBenchmark(problem, inputs, reference, timer, limit=bounds.limit)
    >>> bench.run_round(plan.baseline, round.candidates, label="gemm/2")
    True
    >>> bench.winner(baseline="xla_dot")
    'native_gemm_avx2_6x16_t2'

``benchmark_key`` is the whole pipeline of one key on one device, its rounds included:
random operands, the exact reference, the probes' peaks and the roofline limit, XLA's dots
primed on a GPU; the tuner turns its ``BenchmarkResult`` into the key's decision.

    >>> outcome = benchmark_key(plan, problem, Setup(device, jax_device, timer, probes, rules))
    >>> outcome.winner, outcome.limit
    ('cublaslt_algo0', 3.1e-05)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Sequence

from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import host_blas, operand_copies, xla_priming
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.correctness import check, prepare_check, reference
from jax_autotune.tuning.decision import CandidateResult, Outcome
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.tuning.roofline import roofline_bounds
from jax_autotune.tuning.rules import DEFAULT_RULES, TuningRules
from jax_autotune.tuning.threads import carrying_x64
from jax_autotune.tuning.timing import Measurement, Timer, checked_problem, random_operands

HOST_COMPILE_THREADS = 16  # a CPU round (at most a dozen candidates) compiles all at once
_RESOURCE_MARKERS = ("resource_exhausted", "out of memory", "outofmemory", "memoryerror",
                     "shared memory", "smem", "too many resources")


def classify_error(error: BaseException, stage: str) -> str:
    """``resource_exhausted`` for memory / shared-memory overflows, else the stage's error."""
    text = f"{type(error).__name__}: {error}".lower()
    if any(marker in text for marker in _RESOURCE_MARKERS):
        return Outcome.RESOURCE_EXHAUSTED
    return Outcome.COMPILE_ERROR if stage == "compile" else Outcome.RUNTIME_ERROR


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 500 else text[:497] + "..."


class CompileQueue:
    """Candidates compiling in background threads (``Timer.prepare``), each at most once.

    The tuner starts XLA's dot here before the reference and the probes run, so that its
    compile overlaps them; the benchmark then starts and collects the rest. ``prime``
    first has XLA autotune the round's XLA-based candidates in one compile.

        >>> compiles = CompileQueue(timer, problem, inputs, threads=4)
        >>> compiles.prime([xla_dot, padded_barrier], jax_device)
        >>> compiles.start(candidate)
        >>> measurement, error = compiles.result(candidate)   # waits for the compile
    """

    def __init__(self, timer: Timer, problem: MatmulProblem, inputs: tuple[Any, ...], threads: int):
        self.timer, self.problem, self.inputs = timer, problem, inputs
        self.seconds: dict[str, float] = {}  # wall time of each compile
        self.waits: dict[str, float] = {}  # of which waiting for the device (``DEVICE_LOCK``)
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, threads))
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._priming: concurrent.futures.Future | None = None

    def prime(self, candidates: Sequence[Candidate], device) -> None:
        """Autotune the XLA dots of ``candidates`` together, in one compile, before any of
        them compiles on its own (``xla_priming``); call it before ``start``."""
        pairs = xla_priming.to_prime([(self.problem, c) for c in candidates], device)
        if len(pairs) >= 2:
            self._priming = self._pool.submit(carrying_x64(xla_priming.prime), pairs, device)

    def start(self, candidate: Candidate) -> None:
        if candidate.name not in self._futures:
            self._futures[candidate.name] = self._pool.submit(carrying_x64(self._prepare), candidate)

    def result(self, candidate: Candidate):
        """(measurement, None), or (None, the error the compile raised)."""
        self.start(candidate)
        return self._futures[candidate.name].result()

    def measured(self, name: str) -> Measurement | None:
        """The measurement of the candidate ``name`` compiled here; None when its compile failed."""
        return self._futures[name].result()[0]

    def close(self) -> None:
        """Drop compiles not begun; wait for those running (a thread cannot be stopped)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _prepare(self, candidate: Candidate):
        started, waited = time.perf_counter(), DEVICE_LOCK.waited_seconds()
        try:
            if candidate.xla_autotuned and self._priming is not None:
                self._priming.result()  # then XLA takes the choice it keeps
            return self.timer.prepare(candidate, self.problem, self.inputs), None
        except Exception as err:  # noqa: BLE001 - a failing candidate is recorded
            return None, err
        finally:
            self.seconds[candidate.name] = time.perf_counter() - started
            self.waits[candidate.name] = DEVICE_LOCK.waited_seconds() - waited


class KeyBenchmark:
    """Benchmarks candidates of one problem across rounds; keeps every result."""

    def __init__(self, problem: MatmulProblem, inputs: tuple[Any, ...], reference,
                 timer: Timer, *, limit: float | None, rules: TuningRules = DEFAULT_RULES,
                 clock: Callable[[], float] = time.perf_counter, budget_seconds: float = math.inf,
                 platform: str = "gpu", compiles: CompileQueue | None = None,
                 waited: Callable[[], float] = DEVICE_LOCK.waited_seconds):
        self.problem, self.inputs, self.reference = problem, inputs, reference
        self.platform = platform
        self.timer, self.limit, self.rules, self.clock = timer, limit, rules, clock
        self.deadline = clock() + budget_seconds
        # the budget is the key's own time: waiting for the device while other work holds
        # it (another key's timing, warmup's plain program compiling) does not spend it, so
        # how many keys tune at once never changes what a key measures
        self._waited, self._waited_before = waited, waited()
        self.results: dict[str, CandidateResult] = {}
        self.finished = False  # short-circuit or budget: no more rounds
        self.finish_reason = ""
        self.short_circuited = False  # finished by a short-circuit (not the budget)
        self._best = math.inf  # best single sample so far, for pruning
        self.trusted = None  # XLA's dot's output once it passed: the others are compared whole
        self._baseline: str | None = None
        self.compiles = compiles or CompileQueue(timer, problem, inputs, self.compile_threads(timer, rules))

    @staticmethod
    def compile_threads(timer: Timer, rules: TuningRules) -> int:
        """Threads for compiling: ``rules.compile_ahead`` with a device timer; with a host
        clock a whole round compiles at once, before any of it is timed."""
        return rules.compile_ahead if timer.measures_device_time else HOST_COMPILE_THREADS

    # ---------------------------------------------------------------- public
    def run_round(self, baseline: Candidate, candidates: Sequence[Candidate],
                  label: str = "") -> bool:
        """Benchmark the baseline (once) and the round's candidates, in three stages.

        The baseline is compiled and measured first, alone: when it short-circuits, no
        costly compile starts. Then the quick candidates (milliseconds to compile), then
        the others without those the cost model skips; within a stage by estimated cost.
        With a host wall-clock timer a stage is compiled whole (in parallel threads)
        before any of it is timed, so compiling never disturbs a measurement; with a
        device timer candidates compile at most ``rules.compile_ahead`` ahead of the one
        being measured, so compiling overlaps measuring and a short-circuit saves the
        remaining compiles. True when one of the round's own candidates produced a valid
        (``ok``) result.
        """
        self._baseline = baseline.name
        fresh = sorted((c for c in (baseline, *candidates) if c.name not in self.results),
                       key=lambda c: self._order(c, baseline))
        others = [c for c in fresh if c is not baseline]
        self._run_stage([c for c in fresh if c is baseline], label)
        self._run_stage([c for c in others if c.quick_compile], label)
        self._run_stage(self._skip_by_cost([c for c in others if not c.quick_compile], label), label)
        return any(self.results[c.name].outcome == Outcome.OK for c in candidates)

    def _skip_by_cost(self, stage: Sequence[Candidate], label: str) -> list[Candidate]:
        """The stage without the candidates the cost model is sure lose (recorded
        ``skipped``): estimated over ``rules.cost_skip_ratio`` x the best measured time."""
        ratio = self.rules.cost_skip_ratio
        if ratio is None or self.finished or not math.isfinite(self._best):
            return list(stage)
        kept = []
        for candidate in stage:
            estimate = candidate.cost(self.problem) if candidate.cost else None
            if estimate is not None and estimate > ratio * self._best:
                self._record(candidate.name, Outcome.SKIPPED, label,
                             error=f"cost model: estimated {estimate * 1e6:.3g} us > {ratio:g} x "
                                   f"the best measured {self._best * 1e6:.3g} us")
            else:
                kept.append(candidate)
        return kept

    def _stopped(self, candidate: Candidate) -> bool:
        """Tuning has ended for ``candidate``: a short-circuit still lets the quick
        candidates run (milliseconds each; a library GEMM can beat XLA's dot even near the
        roofline), the budget stops everything."""
        if not self.finished:
            return False
        return not (candidate.quick_compile and self.short_circuited and not self._past_budget())

    def _run_stage(self, stage: Sequence[Candidate], label: str) -> None:
        if not stage:
            return
        wait_for_all = not self.timer.measures_device_time
        ahead = len(stage) if wait_for_all else max(1, self.rules.compile_ahead)
        if all(self._stopped(c) for c in stage):
            for c in stage:
                self._record(c.name, Outcome.SKIPPED, label, error=self.finish_reason)
            return
        for c in stage[:ahead]:
            self.compiles.start(c)
        if wait_for_all:
            for c in stage:
                self.compiles.result(c)
        for index, candidate in enumerate(stage):
            # the budget never skips XLA's dot: every decision rests on at least its timing
            measured_anyway = candidate.name == self._baseline and candidate.name not in self.results
            if not self.finished and self._past_budget() and not measured_anyway:
                self._finish("budget")
            if self._stopped(candidate) and not measured_anyway:
                self._record(candidate.name, Outcome.SKIPPED, label, error=self.finish_reason)
                continue
            if index + ahead < len(stage):  # keep the compile window full
                self.compiles.start(stage[index + ahead])
            measurement, error = self.compiles.result(candidate)
            if error is not None:
                self._record(candidate.name, classify_error(error, "compile"), label,
                             error=_short(error))
            else:
                self._measure(candidate, measurement, label)

    def winner(self, baseline: str | None = None) -> str | None:
        """The eligible candidate with the lowest score; a candidate must beat an eligible
        ``baseline`` by ``rules.baseline_margin`` to replace it (noise is not a win). Where
        one was timed in turns with the baseline (``compare_in_turns``), that comparison
        decides between the two."""
        eligible = [r for r in self.results.values() if r.eligible]
        if not eligible:
            return None
        best = min(eligible, key=lambda r: r.score)
        base = self.results.get(baseline) if baseline else None
        if base is None or not base.eligible:
            return best.name
        paired = next((r for r in eligible if r.paired_ratio is not None), None)
        if paired is not None:
            return paired.name if paired.paired_ratio > self._bar else base.name
        return best.name if best.score * self._bar <= base.score else base.name

    @property
    def _bar(self) -> float:
        """How many times a candidate's time XLA's dot must take for it to win: 1 + margin."""
        return 1 + self.rules.baseline_margin

    def compare_in_turns(self, baseline: str) -> None:
        """With a host clock, the fastest other candidate timed again in turns with
        ``baseline`` (the order swapped every pair), up to ``rules.paired_samples`` pairs: a
        busy host drifts between one candidate's samples and the next's, and a pair sees
        one state. Each side runs once untimed before its sample: the first run after the
        other candidate's meets its threads still winding down. Only a candidate within
        ``rules.prune_ratio`` of the baseline's score takes part. The median of the pairs'
        ratios (baseline over candidate) is kept on its result as ``paired_ratio``, and
        decides ``winner``. Sampling stops after ``rules.min_samples`` pairs that all fall
        on one side of the margin. A failed sample leaves the results as they were."""
        base = self.results.get(baseline)
        others = [r for r in self.results.values() if r.eligible and r.name != baseline]
        if (self.timer.measures_device_time or not self.rules.paired_samples or not others
                or base is None or not base.eligible):
            return
        name = min(others, key=lambda r: r.score).name
        if self.results[name].score > self.rules.prune_ratio * base.score:
            return
        measurements = {name: self.compiles.measured(name), baseline: self.compiles.measured(baseline)}
        ratios: list[float] = []
        try:
            for pair in range(self.rules.paired_samples):
                order = (name, baseline) if pair % 2 == 0 else (baseline, name)
                seconds = {who: _after_one_untimed(measurements[who]) for who in order}
                if not all(s is not None and math.isfinite(s) and s > 0 for s in seconds.values()):
                    return
                ratios.append(seconds[baseline] / seconds[name])
                if len(ratios) >= self.rules.min_samples and len({r > self._bar for r in ratios}) == 1:
                    break
        except Exception:  # noqa: BLE001 - the results of the rounds stand
            return
        self.results[name] = dataclasses.replace(self.results[name], paired_ratio=statistics.median(ratios))

    # ---------------------------------------------------------------- steps
    def _order(self, candidate: Candidate, baseline: Candidate):
        # the baseline first (it sets the pruning bar), then by estimated cost
        if candidate is baseline:
            return (0, 0.0)
        cost = candidate.cost(self.problem) if candidate.cost else math.inf
        return (1, cost)

    def _measure(self, candidate: Candidate, measurement: Measurement, label: str) -> None:
        rules = self.rules
        try:
            out = measurement.output()
            verdict = check(out, self.reference, checked_problem(self.problem), self.platform,
                            trusted=self.trusted)
        except Exception as err:  # noqa: BLE001
            self._record(candidate.name, classify_error(err, "run"), label, error=_short(err))
            return
        if verdict.ok and self.trusted is None and candidate.name == self._baseline:
            self.trusted = out
        if not verdict.ok:
            self._record(candidate.name, Outcome.WRONG_RESULT, label, rel_error=verdict.rel_error,
                         error=f"relative error {verdict.rel_error:.3g} > {verdict.tolerance:.3g}")
            return
        kept: list[float] = []
        taken = in_bound = 0
        pruned = False
        try:
            while len(kept) < rules.max_samples:
                seconds = measurement.sample()
                taken += 1
                if taken <= rules.discard_first:
                    continue
                if seconds is None or not math.isfinite(seconds) or seconds <= 0:
                    self._record(candidate.name, Outcome.NO_TIMING, label, rel_error=verdict.rel_error,
                                 error=f"sample {seconds!r} is not a positive time")
                    return
                kept.append(seconds)
                if self.limit is not None and seconds <= self.limit:
                    in_bound += 1
                    if in_bound >= rules.short_circuit_hits:
                        self._finish(f"short-circuit: {candidate.name} within the roofline limit",
                                     short_circuit=True)
                        break
                if len(kept) >= rules.min_samples:
                    if min(kept) > rules.prune_ratio * self._best and self._survivors() >= rules.keep_at_least:
                        pruned = True
                        break
                    if statistics.median(kept) <= min(kept) * (1 + rules.stable_spread):
                        break
                if self._past_budget():
                    self._finish("budget")
                    break
        except Exception as err:  # noqa: BLE001
            self._record(candidate.name, classify_error(err, "run"), label, error=_short(err))
            return
        self._best = min(self._best, min(kept)) if kept else self._best
        self._record(candidate.name, Outcome.OK, label, samples=kept,
                     score=statistics.median(kept) if kept else None, pruned=pruned,
                     rel_error=verdict.rel_error)

    def _past_budget(self) -> bool:
        return self.clock() - (self._waited() - self._waited_before) > self.deadline

    def _survivors(self) -> int:
        return sum(1 for r in self.results.values() if r.eligible)

    def _finish(self, reason: str, short_circuit: bool = False) -> None:
        if not self.finished:
            self.finished, self.finish_reason = True, reason
            self.short_circuited = short_circuit

    def _record(self, name: str, outcome: str, label: str, **fields) -> None:
        self.results[name] = CandidateResult(name=name, outcome=outcome, round=label,
                                             compile_seconds=self.compiles.seconds.get(name),
                                             compile_wait_seconds=self.compiles.waits.get(name), **fields)


def _after_one_untimed(measurement) -> float | None:
    """A sample of ``measurement`` taken after one it discards."""
    measurement.sample()
    return measurement.sample()


# ---------------------------------------------------------------- one key, end to end

class PhaseClock:
    """Wall seconds per named phase of a tuning: ``with phases("reference"): ...``."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.seconds = clock, {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where and how a key is benchmarked: the device, its timer and probes (anything with
    ``peaks_for(problem)``), the rules, the clock of the budget and the bucketing level."""

    device: DeviceInfo
    jax_device: Any
    timer: Timer
    probes: Any
    rules: TuningRules = DEFAULT_RULES
    clock: Callable[[], float] = time.perf_counter
    level: str = "balanced"


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
    """A key's benchmark: every planned candidate's result, the winner (None: nothing was
    measured), why tuning ended early, and the roofline bounds with each phase's seconds."""

    results: dict[str, CandidateResult]
    winner: str | None
    finish_reason: str
    bounds: dict
    limit: float | None


def xla_round(plan) -> tuple[Candidate, ...]:
    """What to prime for a key: its baseline and, where the first round's group says so
    (``Group.primes_xla``), that round's candidates that run XLA's GEMM autotuner."""
    first = plan.runnable[0] if plan.runnable else None
    beside = first.candidates if first is not None and first.primes_xla else ()
    return tuple(c for c in (plan.baseline, *beside) if c.xla_autotuned)


def benchmark_key(plan, problem: MatmulProblem, setup: Setup, budget_seconds: float = math.inf) -> BenchmarkResult:
    """Run the plan's rounds for ``problem`` on ``setup``'s device until one round has a
    valid candidate, the short-circuit or the budget (see the module docstring). With a
    host clock numpy's BLAS runs on one thread meanwhile (``host_blas``): the reference and
    each check run just before a candidate is timed, and must leave no thread spinning."""
    quiet = contextlib.nullcontext() if setup.timer.measures_device_time else host_blas.single_threaded()
    with quiet:
        return _benchmarked(plan, problem, setup, budget_seconds)


def _benchmarked(plan, problem: MatmulProblem, setup: Setup, budget_seconds: float) -> BenchmarkResult:
    phases = PhaseClock()
    with phases("operands"):
        inputs = random_operands(problem, setup.jax_device)
        timed_inputs = operand_copies.held(problem, inputs)  # the reference reads ``inputs``
    compiles = CompileQueue(setup.timer, problem, timed_inputs,
                            KeyBenchmark.compile_threads(setup.timer, setup.rules))
    side = concurrent.futures.ThreadPoolExecutor(1)
    try:
        peaks_future = None
        if setup.timer.measures_device_time:
            # device time is not disturbed by host work: XLA's dot compiles and the probes
            # run while the reference is computed (with a host clock, the probes run alone)
            if setup.device.platform == "gpu":
                compiles.prime(xla_round(plan), setup.jax_device)
            compiles.start(plan.baseline)
            peaks_future = side.submit(carrying_x64(setup.probes.peaks_for), problem)
        with phases("reference"):
            ref = _reference(problem, inputs, setup)
        with phases("probes"):  # the wait for them, when they ran beside the reference
            peaks = _peaks(peaks_future, setup, problem)
        bounds = roofline_bounds(problem, peaks, setup.level, setup.rules)
        bench = KeyBenchmark(problem, timed_inputs, ref, setup.timer, limit=bounds.limit, rules=setup.rules,
                             clock=setup.clock, budget_seconds=budget_seconds,
                             platform=setup.device.platform, compiles=compiles)
        with phases("rounds"):
            for round_ in plan.runnable:
                if bench.run_round(plan.baseline, round_.candidates, round_.label) or bench.finished:
                    break
        with phases("paired"):
            bench.compare_in_turns(plan.baseline.name)
    finally:
        side.shutdown(wait=True)
        compiles.close()
        setup.timer.release()
    planned = {c.name for r in plan.runnable for c in r.candidates}
    for name in sorted(planned - set(bench.results)):
        bench.results[name] = CandidateResult(name, Outcome.SKIPPED, error="later round not needed")
    return BenchmarkResult(bench.results, bench.winner(baseline=plan.baseline.name), bench.finish_reason,
                   {**bounds.to_json(), "phase_seconds": phases.seconds}, bounds.limit)


def _peaks(future, setup: Setup, problem: MatmulProblem):
    """The probes' peaks: those measured beside the reference, or, where that failed (a
    CUPTI count disturbed by kernels of another thread), measured again now."""
    if future is not None:
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - measured again below; a second failure is raised
            pass
    return setup.probes.peaks_for(problem)


def _reference(problem: MatmulProblem, inputs: tuple, setup: Setup):
    """The exact reference of what the gate checks (the context, or its product when it
    reduces), its comparison compiled ahead on the device."""
    on_host = setup.device.platform == "cpu"
    checked = checked_problem(problem)
    ref = reference(checked, *inputs[:len(checked.input_specs())], **({} if on_host else {"host_max_macs": 0}))
    prepare_check(checked, ref, setup.jax_device)
    return ref
