"""The tuner: a key's decision from memory, the store, or a fresh benchmark.

A key's decision is made here, in ``select``: ``Tuner`` asks what is known per key
(``tuning.known``: the memory table, the store, rejected entries), says what a miss means
under each mode, asks the other processes who decides (``tuning.consensus``, which deals
in JSON values and calls no tuner code but a predicate on a stored value) and benchmarks the key (``tuning.bench``). It also
says which candidate a lowering emits (``emitted``; under jax.export ranked by
``tuning.export_choice``).

``Tuner.select(problem, key, policy)`` decides, in order (``policy``: the settings of the
compile or warmup that asks, ``tuning.policy``; the tuner reads no setting itself):

0. mode ``off`` -> XLA's dot, nothing read or kept (not in ``record_decisions`` either);
1. the memory table (``memory_hits``);
2. the persistent store, under (canonical key, candidate-set checksum) (``store_hits``);
3. by mode: ``cached`` -> XLA's dot (nothing is tuned);
   ``require`` -> ``KeyNotTunedError``; ``tune`` -> decided once (``tuning.consensus``):
   benchmarked now (``tuned``) by the one process that claims the key in the shared store
   or the jax.distributed job, adopted by the others; kept in memory and on disk, logged.

A decision enters only if its winner can run the key here (``KnownDecisions.unusable``): a stored
entry or an installed table entry whose winner is unknown to this build, or whose
``supports`` says no for this device and key, is rejected with one warning naming the
key and the candidate; the key is then tuned again, or (``cached``, ``require``) runs
with XLA's dot: the key is in the table, so ``require`` does not raise for it.

A key being tuned is pending: another thread asking for it waits for that decision.
Errors never escape tuning: if anything fails, the decision is XLA's dot with the reason.
A tuning that measured nothing valid is a fallback, kept in memory only.

    >>> tuner = jax_autotune.registry.tuner_for("cpu")      # the registry builds tuners
    >>> decision = tuner.select(problem)
    >>> tuner.candidate_set.by_name(decision.winner).fn(lhs, rhs, problem)
    >>> tuner.known.lookup(decision.key)                     # what is known: memory, the store
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
import warnings
from typing import Callable, Iterable

import jax

from jax_autotune.errors import ConsensusWarning, KeyNotTunedError
from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem, problem_for
from jax_autotune.tuning import counters, export_choice, progress, reuse, xla_priming
from jax_autotune.tuning.bench import Setup, benchmark_key, xla_round
from jax_autotune.tuning.candidates import Candidate, CandidateSet
from jax_autotune.tuning.consensus import HostAgreement, JobAgreement, Settled, current_job
from jax_autotune.tuning.decision import CandidateResult, Decision, Outcome, Source, log_decision
from jax_autotune.tuning.known import Keep, KnownDecisions, Slot
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.export_safety import allowed_targets
from jax_autotune.tuning.plan import DEMOTED, make_plan
from jax_autotune.tuning.policy import DEFAULT_POLICY, Policy
from jax_autotune.tuning.probes import Probes
from jax_autotune.tuning.rules import DEFAULT_RULES, TuningRules
from jax_autotune.tuning.store import Store
from jax_autotune.tuning.timing import Timer, timer_for

_recorders: list[list] = []
_recorders_lock = threading.Lock()


@contextlib.contextmanager
def record_decisions():
    """Collect the decision of every key any tuner decides meanwhile (mode ``off`` decides
    none), from any thread (XLA's partitioner asks for per-shard keys while it compiles).

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


class Tuner:
    """Decisions for one device: what is known (``known``), what a miss means, the benchmark."""

    def __init__(self, device: DeviceInfo, candidate_set: CandidateSet, *, store: Store,
                 jax_device=None, timer: Timer | None = None,
                 rules: TuningRules | None = None, clock: Callable[[], float] = time.perf_counter,
                 probes: Probes | None = None, native=None):
        self.device, self.candidate_set, self.jax_device = device, candidate_set, jax_device
        self.timer = timer or timer_for(device.platform)
        self.known = KnownDecisions(device, candidate_set, store)
        self.namespace, self.checksum = self.known.namespace, self.known.checksum
        self.rules = rules or DEFAULT_RULES
        self.clock = clock
        self.probes = probes or Probes(
            device, jax_device, self.timer, self.store, native, baseline=candidate_set.baseline,
            quick=tuple(c for c in candidate_set.candidates if c.quick_compile))

    # ---------------------------------------------------------------- what is known
    # ``known`` answers what is known (``lookup``, ``install``, ``decisions``, ``forget``, ...);
    # the candidates are ``candidate_set``'s (``candidate_set.by_name(winner)``)
    @property
    def store(self) -> Store:
        return self.known.store

    def use_store(self, store: Store) -> None:
        """Switch to another store (decisions and probes are read from and written there)."""
        self.known.use_store(store)
        self.probes.store = store

    # ---------------------------------------------------------------- deciding
    def select(self, problem: MatmulProblem, key: MatmulKey | None = None,
               policy: Policy = DEFAULT_POLICY) -> Decision:
        """The key's decision: memory, the store, or by ``policy.mode`` (see the module
        docstring); ``key`` defaults to the problem's at ``policy.level``."""
        key = key or problem.key(policy.level)
        if policy.mode == "off":
            return self._fallback(key, problem, "mode off")
        with self.known.deciding(key, policy.mode) as slot:
            if slot.decision is None:
                slot.decision, slot.keep = self._decide(slot, problem, policy)
        return _record(slot.decision)

    def _decide(self, slot: Slot, problem: MatmulProblem, policy: Policy) -> tuple[Decision, Keep]:
        """A key missing from memory: by the mode, the store's decision (``slot.stored``), or
        one agreed once per host or per job (``tuning.consensus``): this process's stored
        or tuned one, or another's; and what to keep of it."""
        key, stored, mode, job = slot.key, slot.stored, policy.mode, current_job()
        if job is None and stored is not None:
            counters.bump("store_hits")
            return stored, Keep.MEMORY
        if stored is None and mode in ("cached", "require") and slot.rejected:
            # the key is in the table, but its kernel cannot run here
            return self._fallback(key, problem, f"mode {mode}: entry rejected: {slot.rejected}"), Keep.NOTHING
        if stored is None and mode == "require":
            raise KeyNotTunedError(_require_message(key, problem))
        if job is None and mode == "cached":
            return self._fallback(key, problem, "mode cached: key not in the table"), Keep.NOTHING
        if job is None:
            agreement = HostAgreement(self.store, self.namespace, self.checksum, self.rules.claim_lease_seconds,
                                      usable=functools.partial(self.known.usable, key=key))
            decision, settled = self._agreed(agreement, key, problem, stored, policy)
        else:
            try:
                decision, settled = self._agreed(JobAgreement(job, self.device.platform, self.checksum),
                                                 key, problem, stored, policy)
            except Exception as err:  # noqa: BLE001 - the job's store failed: never the user's matmul
                warnings.warn(f"jax_autotune: the job's key-value store failed ({type(err).__name__}: "
                              f"{str(err)[:200]}); XLA's dot for this key in this process",
                              ConsensusWarning, stacklevel=4)
                decision, settled = self._fallback(key, problem, "the job's key-value store failed"), Settled.FALLBACK
        if settled == Settled.STORED:
            counters.bump("store_hits")
            return decision.with_source(Source.STORE), Keep.MEMORY
        # in a job, a decision tuned here (or a peer's, when its source is tuned) is stored too,
        # unless the store holds a usable one; host agreements store theirs as they publish
        keep = Keep.MEMORY_AND_STORE if job is not None and stored is None and decision.source == Source.TUNED \
            else Keep.MEMORY
        if settled == Settled.ADOPTED:
            decision = dataclasses.replace(decision, source=Source.ADOPTED, device=self.device.fingerprint)
        log_decision(decision, policy.log_decisions)
        return decision, keep

    def _agreed(self, agreement: HostAgreement | JobAgreement, key: MatmulKey, problem: MatmulProblem, stored: Decision | None,
                policy: Policy) -> tuple[Decision, Settled]:
        """The decision the processes agree on: another's, or this one's (its stored
        decision in a job, XLA's dot under ``cached`` or after the wait, else tuned now)."""
        with agreement.turn(key.canonical(), self.rules.peer_wait(self._budget(policy))) as turn:
            if turn.settled in (Settled.STORED, Settled.ADOPTED):
                return Decision.from_json(turn.value), turn.settled
            if turn.settled == Settled.FALLBACK:
                mine = self._fallback(key, problem, turn.why)
            elif stored is not None:
                mine = stored
            elif policy.mode == "cached":
                mine = self._fallback(key, problem, "mode cached: key not in the table")
            else:
                mine = self._tune(key, problem, policy)
            value, settled = agreement.publish(turn, mine.to_json(), lasting=mine.source == Source.TUNED)
        if settled == Settled.ADOPTED:
            return Decision.from_json(value), settled
        return mine, Settled.STORED if settled == Settled.PROPOSED and stored is not None else settled

    def measure(self, problem: MatmulProblem, key: MatmulKey | None = None,
                policy: Policy = DEFAULT_POLICY) -> Decision:
        """Benchmark the key now and return the decision; nothing is stored or replaced
        (an export ranks a decision that holds no measured results with it).

            >>> tuner.measure(problem).results
        """
        return self._tune(key or problem.key(policy.level), problem, policy)

    def prime(self, work: Iterable[tuple[MatmulKey, MatmulProblem]], policy: Policy = DEFAULT_POLICY) -> int:
        """Ready the device for the keys of ``work`` that will be tuned: on a GPU, autotune
        their XLA dots in one compile (``tuning.xla_priming``; their tunings then take
        XLA's kept choices); then measure the probes they need (``tuning.probes``), so that
        no tuning waits for them behind other work that holds the device (``warmup``'s
        plain program compiling). How many XLA-based candidates it primed.

            >>> tuner.prime([(problem.key(), problem) for problem in problems])
            14
        """
        if not policy.tunes:
            return 0
        plans = [(problem, make_plan(self.candidate_set, key, self.device)) for key, problem in work
                 if self.known.lookup(key) is None]
        primed = 0
        if self.device.platform == "gpu":
            pairs = [(problem, candidate) for problem, plan in plans for candidate in xla_round(plan)]
            primed = xla_priming.prime(pairs, self._jax_device())
        for problem in dict.fromkeys(problem for problem, plan in plans if plan.runnable):
            try:
                self.probes.peaks_for(problem)  # measured once per device; the keys read them
            except Exception:  # noqa: BLE001 - the key's own tuning measures it again, and records a failure
                pass
        return primed

    # ---------------------------------------------------------------- what a lowering emits
    def emitted(self, problem: MatmulProblem, decision: Decision, for_export: bool,
                platform: str, policy: Policy = DEFAULT_POLICY) -> Candidate:
        """The candidate a lowering for ``platform`` emits for ``decision``: its winner, or
        under jax.export the fastest candidate jax.export takes (``tuning.export_choice``),
        the choice kept on the decision and logged.

            >>> tuner.emitted(problem, tuner.select(problem), for_export=True, platform="cpu").name
            'xla_dot'
        """
        if not for_export:
            return self.candidate_set.by_name(decision.winner)
        baseline = self.candidate_set.baseline.name
        try:
            measure = functools.partial(self.measure, problem, decision.key, policy) if policy.tunes else None
            name, reason = export_choice.choose(decision, functools.partial(self._export_safety, problem, platform),
                                                allowed_targets(), baseline, measure)
        except Exception as err:  # noqa: BLE001 - the user's export never fails because of the tuner
            name, reason = baseline, f"export choice failed ({type(err).__name__}: {err}): XLA's dot"[:500]
        recorded = dataclasses.replace(decision, export_kernel=name, export_reason=reason)
        if (name, reason) != (decision.export_kernel, decision.export_reason) and decision.source != Source.FALLBACK:
            self.known.install(recorded)  # a fallback decision (never stored) is only logged
        log_decision(recorded, policy.log_decisions, event="jax_autotune.export")
        return self.candidate_set.by_name(name)

    def _export_safety(self, problem: MatmulProblem, platform: str, name: str):
        try:
            return self.candidate_set.by_name(name).export_safety(problem, platform)
        except KeyError:  # a name this build does not know
            return None

    # ---------------------------------------------------------------- tuning
    def _fallback(self, key: MatmulKey, problem: MatmulProblem, reason: str) -> Decision:
        counters.bump("fallbacks")
        return Decision(key=key, problem=problem, winner=self.candidate_set.baseline.name,
                        device=self.device.fingerprint, checksum=self.checksum,
                        source=Source.FALLBACK, reason=reason)

    @progress.reported  # a log record per key; a line on a terminal while a long one runs
    def _tune(self, key: MatmulKey, problem: MatmulProblem, policy: Policy) -> Decision:
        started = self.clock()
        plan = make_plan(self.candidate_set, key, self.device)
        fields = dict(key=key, problem=problem, device=self.device.fingerprint,
                      checksum=self.checksum, source=Source.TUNED)
        # the device cannot run these for this key: recorded, never compiled
        unsupported = {c.name: CandidateResult(c.name, Outcome.SKIPPED, round=DEMOTED,
                                               error="cannot run this key on this device")
                       for c in plan.unsupported}
        if not plan.runnable:  # nothing to compare: XLA's dot, without a benchmark or probes
            return Decision(winner=plan.baseline.name, results=tuple(unsupported.values()),
                            reason=plan.reason or "no other candidate can run this key", **fields)
        ruled_out = self._ruled_out(key, plan)
        plan = plan.without(ruled_out)
        unsupported.update(ruled_out)
        budget = self._budget(policy)
        counters.bump("tuned")
        setup = Setup(self.device, self._jax_device(), self.timer, self.probes, self.rules, self.clock, key.level)
        try:
            with jax.transfer_guard("allow"):
                outcome = benchmark_key(plan, problem, setup, budget)
        except Exception as err:  # noqa: BLE001 - tuning must never break the user's program
            counters.bump("fallbacks")
            return Decision(**{**fields, "source": Source.FALLBACK}, winner=plan.baseline.name,
                            tuning_seconds=self.clock() - started,
                            reason=f"tuning failed: {type(err).__name__}: {err}"[:500])
        finally:
            counters.bump("tuning_seconds", self.clock() - started)
        details = dict(results=tuple({**outcome.results, **unsupported}.values()), bounds=outcome.bounds,
                       limit=outcome.limit, tuning_seconds=self.clock() - started)
        if outcome.winner is None:  # nothing was measured: not a decision to keep (the next process re-tunes)
            counters.bump("fallbacks")
            why = f" ({outcome.finish_reason})" if outcome.finish_reason else ""
            return Decision(winner=plan.baseline.name, reason=f"no candidate produced a valid timing{why}",
                            **details, **{**fields, "source": Source.FALLBACK})
        return Decision(winner=outcome.winner, **details, **fields)

    def _ruled_out(self, key: MatmulKey, plan) -> dict[str, CandidateResult]:
        """A context key's candidates that lost on its bare product's tuning (``tuning.reuse``),
        as skipped results; a bare key, or a product not tuned yet, rules out none."""
        if key.epilogue.is_bare or self.rules.reuse_ratio is None:
            return {}
        bare = self.known.lookup(reuse.product_key(key))
        if bare is None or bare.source == Source.FALLBACK:
            return {}
        rounds = {c.name: r.label for r in plan.runnable for c in r.candidates}
        lost = reuse.losers([c for r in plan.runnable for c in r.candidates], bare, self.rules.reuse_ratio)
        return {name: CandidateResult(name, Outcome.SKIPPED, round=rounds[name], error=why) for name, why in lost.items()}

    def _budget(self, policy: Policy) -> float:
        """Seconds a key's tuning may take: the rules', else the policy's."""
        return self.rules.budget_seconds or policy.budget_seconds

    def _jax_device(self):
        if self.jax_device is None:
            self.jax_device = jax.local_devices(backend=self.device.platform)[0]
        return self.jax_device


def _require_message(key: MatmulKey, problem: MatmulProblem) -> str:
    return (f"jax_autotune: mode 'require' and no tuned decision for key [{key.canonical()}]. "
            f"Pre-tune it with {tuning_call(key, problem, key.level)} (in mode 'tune'), or "
            f"jax_autotune.warmup(fn, *example_args) with the jat.autotune(...) function this "
            f"compile runs, or load a tune table with jax_autotune.load_table(path).")


def tuning_call(key: MatmulKey, problem: MatmulProblem, level: str) -> str:
    """A ``warmup`` call, as Python source, that tunes exactly ``key``: by shapes where
    they give this key, else by the problem itself (its epilogue, out dtype, ...).

        >>> tuning_call(problem.key("balanced"), problem, "balanced")
        "jax_autotune.warmup([(1, 1024, 1024, 1024)], dtype='float32', ...)"
    """
    shape = (problem.batch, problem.m, problem.n, problem.k)
    # lax's words: 'highest' is a level, 'HIGHEST'-like names are algorithm presets
    precision = problem.precision.value.lower() if problem.precision.algorithm is None else problem.precision.value
    options = (f"dtype={problem.lhs_dtype!r}, transpose_a={problem.transpose_a}, "
               f"transpose_b={problem.transpose_b}, precision={precision!r}")
    try:
        by_shapes = problem_for(jax.ShapeDtypeStruct(problem.lhs_shape, problem.lhs_dtype),
                                jax.ShapeDtypeStruct(problem.rhs_shape, problem.rhs_dtype),
                                transpose_a=problem.transpose_a, transpose_b=problem.transpose_b,
                                precision=precision)
        if by_shapes.key(level) == key:
            return f"jax_autotune.warmup([{shape}], {options})"
    except Exception:  # noqa: BLE001 - a message never fails: the exact form below
        pass
    fields = (*shape, problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype, problem.transpose_a,
              problem.transpose_b, problem.precision.value, str(problem.epilogue))
    # then the fields a plain dense problem leaves at their defaults, up to the last one set
    trailing = (problem.groups, problem.ragged, problem.lhs_copied, problem.rhs_copied)
    fields = (*fields, *trailing[:max((i + 1 for i, value in enumerate(trailing) if value), default=0)])
    return f"jax_autotune.warmup([jax_autotune.MatmulProblem{fields!r}])"
