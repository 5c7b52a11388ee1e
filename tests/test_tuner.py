"""The tuner's lookup order, modes, store checks and pending de-duplication."""

import dataclasses
import threading

import jax
import pytest

from fakes import CPU, FakeClock, FakeTimer, candidate_set, fake_candidate
from jax_autotune import config
from jax_autotune.tuning import counters
from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.decision import DecisionLogWarning
from jax_autotune.tuning.namespaces import decision_namespace
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.roofline import Peaks
from jax_autotune.tuning.rules import TuningRules
from jax_autotune.tuning.store import JaxAutotuneStoreWarning, store_at
from jax_autotune.tuning.tuner import KeyNotTunedError, Tuner
from jax_autotune.epilogue import Epilogue
from jax_autotune.kernels.xla import xla_dot

PROBLEM = MatmulProblem(1, 16, 8, 12, "float32", "float32", "float32")


class FakeProbes:
    def __init__(self, error=None):
        self.error = error

    def peaks_for(self, problem):
        if self.error:
            raise self.error
        return Peaks(compute=1e12, bandwidth=1e11, launch_overhead=1e-6)


def two_candidates(extra=()):
    return candidate_set([("g", 1)], [(fake_candidate("fast"), [("g", 1)]),
                                      (fake_candidate("slow"), [("g", 1)]), *extra])


def make_tuner(store, cset=None, timer=None, probes=None):
    timer = timer or FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0]}, real_outputs=True)
    return Tuner(CPU, cset or two_candidates(), jax_device=jax.devices("cpu")[0], timer=timer,
                 store=store, clock=FakeClock(), probes=probes or FakeProbes())


@pytest.fixture(autouse=True)
def clean(tmp_path):
    config.reset()
    counters.reset_stats()
    yield
    config.reset()


def test_lookup_order_is_memory_then_store_then_tune(store):
    tuner = make_tuner(store)
    first = tuner.select(PROBLEM)
    assert first.source == "tuned" and first.winner == "fast"
    assert tuner.select(PROBLEM).source == "memory"
    fresh = make_tuner(store)  # a new process: empty memory, same database
    again = fresh.select(PROBLEM)
    assert again.source == "store" and again.winner == "fast"
    counts = counters.stats()
    assert (counts["tuned"], counts["memory_hits"], counts["store_hits"]) == (1, 1, 1)


def test_the_decision_keeps_every_candidate_result_bounds_and_limit(store):
    decision = make_tuner(store).select(PROBLEM)
    assert {r.name for r in decision.results} == {"xla_dot", "fast", "slow"}
    assert decision.limit == pytest.approx(decision.bounds["limit"])
    assert decision.bounds["ops"] == 16 * 8 * (2 * 12 - 1)
    stored = store.entries()[0].value
    assert stored["winner"] == "fast" and len(stored["results"]) == 3


def test_a_changed_candidate_set_invalidates_stored_decisions(store):
    make_tuner(store).select(PROBLEM)
    grown = two_candidates(extra=[(fake_candidate("new"), [("g", 1)])])
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0], "new": [0.5]}, real_outputs=True)
    decision = make_tuner(store, grown, timer).select(PROBLEM)
    assert decision.source == "tuned" and decision.winner == "new"
    assert counters.stats()["tuned"] == 2


def test_a_stored_winner_unknown_to_this_build_is_retuned(store):
    tuner = make_tuner(store)
    decision = tuner.select(PROBLEM)
    data = decision.to_json()
    data["winner"] = "renamed_kernel"
    store.put(tuner.namespace, decision.key.canonical(), tuner.checksum, data)
    with pytest.warns(JaxAutotuneStoreWarning, match="'renamed_kernel' is not a candidate"):
        assert make_tuner(store).select(PROBLEM).source == "tuned"


def test_mode_off_always_uses_xla_dot_without_tuning(store):
    decision = make_tuner(store).select(PROBLEM, policy=Policy(mode="off"))
    assert decision.winner == "xla_dot" and decision.source == "fallback"
    assert counters.stats()["tuned"] == 0


def test_mode_cached_never_tunes_but_uses_what_is_stored(store):
    miss = make_tuner(store).select(PROBLEM, policy=Policy(mode="cached"))
    assert miss.winner == "xla_dot" and counters.stats()["tuned"] == 0
    make_tuner(store).select(PROBLEM)  # tune once
    hit = make_tuner(store).select(PROBLEM, policy=Policy(mode="cached"))
    assert hit.winner == "fast" and hit.source == "store"


def test_mode_require_names_the_key_and_how_to_pretune_it(store):
    with pytest.raises(KeyNotTunedError) as info:
        make_tuner(store).select(PROBLEM, policy=Policy(mode="require"))
    message = str(info.value)
    assert PROBLEM.key().canonical() in message
    assert "jax_autotune.warmup" in message
    assert counters.stats()["tuned"] == 0


def test_nothing_valid_falls_back_to_xla_dot_with_the_reason(store):
    boom = RuntimeError("boom")
    timer = FakeTimer({"xla_dot": [1.0]}, compile_errors={"xla_dot": boom, "fast": boom, "slow": boom},
                      real_outputs=True)
    decision = make_tuner(store, timer=timer).select(PROBLEM)
    assert decision.winner == "xla_dot"
    assert "no candidate" in decision.reason
    assert {r.outcome for r in decision.results} == {"compile_error"}


def test_an_error_outside_the_candidates_never_escapes_and_is_not_stored(store):
    failing = make_tuner(store, probes=FakeProbes(RuntimeError("probe failed")))
    decision = failing.select(PROBLEM)
    assert decision.winner == "xla_dot" and decision.source == "fallback"
    assert "probe failed" in decision.reason
    assert failing.select(PROBLEM).source == "memory"  # not retried in this process
    assert store.entries() == []  # the next process tunes again
    assert make_tuner(store).select(PROBLEM).source == "tuned"


def test_a_key_being_tuned_is_pending_and_a_second_thread_waits_for_it(store):
    entered, release = threading.Event(), threading.Event()
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0]}, real_outputs=True)
    original = timer.prepare

    def slow_prepare(candidate, problem, args):
        entered.set()
        release.wait()
        return original(candidate, problem, args)

    timer.prepare = slow_prepare
    tuner = make_tuner(store, timer=timer)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", tuner.select(PROBLEM)))
    second = threading.Thread(target=lambda: results.setdefault("second", tuner.select(PROBLEM)))
    first.start()
    entered.wait()
    second.start()
    second.join(timeout=0.2)
    assert second.is_alive()  # blocked on the pending key, not tuning it again
    release.set()
    first.join()
    second.join()
    assert counters.stats()["tuned"] == 1
    assert results["second"].winner == results["first"].winner == "fast"
    assert timer.prepared.count("xla_dot") == 1


def test_install_rejects_a_decision_whose_winner_is_unknown(store):
    tuner = make_tuner(store)
    decision = tuner.select(PROBLEM)
    other = make_tuner(store_at(None))
    assert other.known.install(decision)
    assert other.select(PROBLEM).source == "memory"
    assert not other.known.install(dataclasses.replace(decision, winner="nope"))


def test_decisions_are_logged_as_one_json_line_each(store, tmp_path):
    import json
    log = tmp_path / "decisions.jsonl"
    make_tuner(store).select(PROBLEM, policy=Policy(log_decisions=str(log)))
    lines = log.read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["winner"] == "fast" and record["key_string"] == PROBLEM.key().canonical()
    assert {r["name"] for r in record["results"]} == {"xla_dot", "fast", "slow"}


def test_tuner_for_follows_a_changed_cache_dir_without_a_reset(tmp_path):
    from jax_autotune.registry import RUNTIME, tuner_for
    RUNTIME.reset()
    config.update("cache_dir", str(tmp_path / "first"))
    tuner = tuner_for("cpu")
    assert str(tuner.store.path).startswith(str(tmp_path / "first"))
    config.update("cache_dir", str(tmp_path / "second"))
    assert tuner_for("cpu") is tuner
    assert str(tuner.store.path).startswith(str(tmp_path / "second"))
    assert tuner.probes.store is tuner.store
    config.update("cache", False)
    assert tuner_for("cpu").store.path is None
    RUNTIME.reset()


class ProbesThatWaitForACompile(FakeProbes):
    """Probes that return once a compile has begun (or after 5 s) and log their end."""

    def __init__(self, timer: FakeTimer, compiling: threading.Event):
        super().__init__()
        self.timer, self.compiling = timer, compiling

    def peaks_for(self, problem):
        self.compiling.wait(timeout=5.0)
        self.timer.events.append(("probes done", ""))
        return super().peaks_for(problem)


def test_each_tuned_key_releases_its_timer_once_after_its_last_measurement(store):
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0]}, real_outputs=True)
    tuner = make_tuner(store, timer=timer)
    tuner.select(PROBLEM)
    assert timer.events[-1] == ("release", "") and timer.events.count(("release", "")) == 1
    tuner.select(PROBLEM)  # from memory: nothing measured, nothing released
    assert timer.events.count(("release", "")) == 1
    tuner.select(dataclasses.replace(PROBLEM, m=64))
    assert timer.events.count(("release", "")) == 2 and timer.events[-1] == ("release", "")


@pytest.mark.parametrize("device_time", [True, False])
def test_the_baseline_compiles_during_the_probes_only_with_a_device_timer(store, device_time):
    compiling = threading.Event()
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0]}, real_outputs=True,
                      device_time=device_time)
    original = timer.prepare

    def prepare(candidate, problem, args):
        compiling.set()
        return original(candidate, problem, args)

    timer.prepare = prepare
    if not device_time:
        compiling.set()  # a host clock times the probes: nothing compiles meanwhile
    decision = make_tuner(store, timer=timer, probes=ProbesThatWaitForACompile(timer, compiling)).select(PROBLEM)
    assert decision.winner == "fast" and timer.prepared.count("xla_dot") == 1
    compiled, probed = timer.events.index(("prepare", "xla_dot")), timer.events.index(("probes done", ""))
    assert (compiled < probed) == device_time


# ---------------------------------------------------------------- decisions that cannot run

def with_tiny_only():
    """A set whose 'tiny_only' kernel supports keys with m <= 8 only (PROBLEM has m = 16)."""
    tiny = Candidate("tiny_only", fake_candidate("x").fn, supports=lambda device, key: key.m <= 8)
    return two_candidates(extra=[(tiny, [("g", 1)])])


def store_warnings(record):
    return [w for w in record if issubclass(w.category, JaxAutotuneStoreWarning)]


def hand_edit_winner(store, tuner, winner):
    decision = tuner.select(PROBLEM)
    data = decision.to_json()
    data["winner"] = winner
    store.put(tuner.namespace, decision.key.canonical(), tuner.checksum, data)


def test_a_stored_winner_that_cannot_run_the_key_is_rejected_with_one_warning_and_retuned(store):
    hand_edit_winner(store, make_tuner(store, with_tiny_only()), "tiny_only")
    fresh = make_tuner(store, with_tiny_only())
    with pytest.warns(JaxAutotuneStoreWarning) as record:
        decision = fresh.select(PROBLEM)
    [warning] = store_warnings(record)
    assert "'tiny_only' cannot run key" in str(warning.message)
    assert PROBLEM.key().canonical() in str(warning.message)
    assert decision.source == "tuned" and decision.winner == "fast"
    assert make_tuner(store, with_tiny_only()).select(PROBLEM).winner == "fast"  # the row was replaced


@pytest.mark.parametrize("mode", ["cached", "require"])
def test_under_cached_or_require_a_rejected_entry_runs_with_xla_dot_and_warns_once(store, recwarn, mode):
    hand_edit_winner(store, make_tuner(store, with_tiny_only()), "tiny_only")
    counters.reset_stats()
    serving = make_tuner(store, with_tiny_only())
    first, second = serving.select(PROBLEM, policy=Policy(mode=mode)), serving.select(PROBLEM, policy=Policy(mode=mode))
    assert first.winner == second.winner == "xla_dot" and first.source == "fallback"
    assert "tiny_only" in first.reason and counters.stats()["tuned"] == 0
    assert len(store_warnings(recwarn)) == 1
    other = MatmulProblem(1, 64, 8, 12, "float32", "float32", "float32")
    if mode == "require":  # a key that is genuinely missing is still an error
        with pytest.raises(KeyNotTunedError):
            serving.select(other, policy=Policy(mode=mode))


def test_install_rejects_a_winner_that_cannot_run_the_key_and_require_then_uses_xla_dot(store):
    tuner = make_tuner(store, with_tiny_only())
    decision = tuner.select(PROBLEM)
    serving = make_tuner(store_at(None), with_tiny_only())
    result = serving.known.install_many([dataclasses.replace(decision, winner="tiny_only")])
    assert result.installed == 0 and "'tiny_only' cannot run key" in result.rejected[0]
    assert serving.known.lookup(PROBLEM.key()) is None
    assert serving.select(PROBLEM, policy=Policy(mode="require")).winner == "xla_dot"
    assert serving.known.install(decision)  # a usable one goes in
    assert serving.select(PROBLEM, policy=Policy(mode="require")).winner == "fast"


def test_install_many_writes_every_decision_in_one_transaction(store):
    tuner = make_tuner(store)
    decision = tuner.select(PROBLEM)
    other = dataclasses.replace(decision, key=MatmulProblem(1, 64, 8, 12, "float32", "float32",
                                                            "float32").key())
    fresh_store = store_at(store.path.parent / "fresh.db")
    calls = []
    original = fresh_store.put_many
    fresh_store.put_many = lambda rows: calls.append(list(rows)) or original(calls[-1])
    result = make_tuner(fresh_store).known.install_many([decision, other])
    assert (result.installed, result.persisted) == (2, True)
    assert len(calls) == 1 and len(calls[0]) == 2
    assert len(fresh_store.entries()) == 2


# ---------------------------------------------------------------- candidates the key cannot use

def test_candidates_the_device_cannot_run_are_never_compiled_and_recorded_as_skipped(store):
    cset = two_candidates(extra=[(fake_candidate("unsupported", supported=False), [("g", 1)])])
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0], "unsupported": [0.1]},
                      real_outputs=True)
    decision = make_tuner(store, cset, timer).select(PROBLEM)
    assert "unsupported" not in timer.prepared
    result = decision.result("unsupported")
    assert result.outcome == "skipped" and "cannot run this key" in result.error
    assert decision.winner == "fast"


def test_a_key_only_xla_dot_can_run_is_decided_without_benchmark_or_probes(store):
    cset = candidate_set([("g", 1)], [(fake_candidate("float_only", supported=False), [("g", 1)])])
    timer = FakeTimer({"xla_dot": [1.0], "float_only": [0.1]}, real_outputs=True)
    probes = FakeProbes(AssertionError("the probes must not run"))
    decision = make_tuner(store, cset, timer, probes).select(PROBLEM)
    assert timer.prepared == [] and decision.winner == "xla_dot" and decision.source == "tuned"
    assert decision.result("float_only").outcome == "skipped"
    assert counters.stats()["candidate_compiles"] == 0 and store.entries() != []


# ---------------------------------------------------------------- budget and logging

def test_the_tuner_reads_no_setting_only_the_policy_it_is_handed(store):
    config.update("mode", "require")
    config.update("budget_seconds", 1e-9)
    tuner = make_tuner(store)
    assert tuner.select(PROBLEM).source == "tuned"  # the default policy, whatever the settings say
    other = MatmulProblem(1, 64, 8, 12, "float32", "float32", "float32")
    with pytest.raises(KeyNotTunedError):
        tuner.select(other, policy=config.policy())


def test_a_key_is_tuned_at_the_level_it_was_bucketed_at_not_the_policys(store, monkeypatch):
    import jax_autotune.tuning.tuner as tuner_module
    levels = []
    real = tuner_module.benchmark_key

    def recording(plan, problem, setup, budget):
        levels.append(setup.level)
        return real(plan, problem, setup, budget)

    monkeypatch.setattr(tuner_module, "benchmark_key", recording)
    key = PROBLEM.key("full")
    assert key.level == "full" and "level" not in key.to_json() and key == MatmulKey.parse(key.canonical())
    make_tuner(store).select(PROBLEM, key, Policy(level="minimal"))
    assert levels == ["full"]


def test_a_budget_spent_before_any_timing_still_measures_xla_dot_and_skips_the_rest(store):
    clock = FakeClock()
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0]}, real_outputs=True)
    prepare = timer.prepare
    timer.prepare = lambda *args: clock.advance(10.0) or prepare(*args)  # each compile: 10 s
    tuner = Tuner(CPU, two_candidates(), jax_device=jax.devices("cpu")[0], timer=timer, store=store,
                  clock=clock, probes=FakeProbes(), rules=TuningRules(budget_seconds=1e-6))
    decision = tuner.select(PROBLEM)
    assert decision.winner == "xla_dot" and decision.result("xla_dot").outcome == "ok"
    assert {decision.result(n).outcome for n in ("fast", "slow")} == {"skipped"}
    assert decision.source == "tuned"  # it rests on XLA's dot's measured time


def test_a_tuning_that_measured_nothing_is_not_stored(store):
    boom = RuntimeError("boom")
    timer = FakeTimer({"xla_dot": [1.0]}, run_errors={"xla_dot": boom, "fast": boom, "slow": boom},
                      real_outputs=True)
    decision = make_tuner(store, timer=timer).select(PROBLEM)
    assert decision.source == "fallback" and "no candidate produced a valid timing" in decision.reason
    assert store.entries(decision_namespace(CPU.fingerprint)) == []


def test_a_decision_log_that_cannot_be_written_warns_once_and_never_raises(store, tmp_path):
    policy = Policy(log_decisions=str(tmp_path / "missing-folder" / "decisions.jsonl"))
    tuner = make_tuner(store)
    with pytest.warns(DecisionLogWarning, match="missing-folder") as record:
        assert tuner.select(PROBLEM, policy=policy).winner == "fast"
        tuner.select(MatmulProblem(1, 64, 8, 12, "float32", "float32", "float32"), policy=policy)
    assert len([w for w in record if issubclass(w.category, DecisionLogWarning)]) == 1
    assert not (tmp_path / "missing-folder").exists()


# ---------------------------------------------------------------- a key in its context

BIAS_RESIDUAL = Epilogue.parse("row:float32,full:float32|add(y,$0);add(%0,$1)")
IN_CONTEXT = dataclasses.replace(PROBLEM, epilogue=BIAS_RESIDUAL)


def custom_call_loses_its_fusion(name, problem):
    """XLA's dot fuses the epilogue for free; the custom call's runs as a kernel of its own."""
    bare = {"xla_dot": 3.0, "fast": 2.0, "slow": 4.0}[name]
    return [bare + (0.0 if name == "xla_dot" or problem.epilogue.is_bare else 2.0)]


def test_a_custom_call_that_wins_bare_loses_in_context_to_xlas_fused_dot(store):
    tuner = make_tuner(store, timer=FakeTimer(custom_call_loses_its_fusion, real_outputs=True))
    assert tuner.select(PROBLEM).winner == "fast"
    in_context = tuner.select(IN_CONTEXT)
    assert in_context.winner == "xla_dot" and in_context.key.epilogue == BIAS_RESIDUAL
    assert in_context.result("fast").score == 4.0 and in_context.result("xla_dot").score == 3.0


def test_candidates_are_prepared_with_the_epilogues_operands_as_the_program_runs(store):
    timer = FakeTimer(custom_call_loses_its_fusion, real_outputs=True)
    seen = []
    prepare = timer.prepare
    timer.prepare = lambda c, p, args: seen.append((p, [tuple(a.shape) for a in args])) or prepare(c, p, args)
    make_tuner(store, timer=timer).select(IN_CONTEXT)
    assert seen and all(p == IN_CONTEXT for p, _ in seen)
    assert all(shapes == [(1, 16, 12), (1, 12, 8), (8,), (1, 16, 8)] for _, shapes in seen)


def _skips_the_epilogue(lhs, rhs, problem, *operands):
    return xla_dot(lhs, rhs, problem.bare())


def _reverses_the_columns(lhs, rhs, problem):
    return xla_dot(lhs, rhs, problem)[..., ::-1]


def test_a_fused_candidate_is_checked_on_the_whole_context(store):
    fused = Candidate("fused", _skips_the_epilogue, applies_epilogue=True)
    tuner = make_tuner(store, cset=two_candidates([(fused, [("g", 1)])]),
                       timer=FakeTimer({"xla_dot": [3.0], "fast": [2.0], "slow": [4.0], "fused": [0.5]},
                                       real_outputs=True))
    decision = tuner.select(IN_CONTEXT)
    assert decision.result("fused").outcome == "wrong_result" and decision.winner == "fast"


def test_a_reducing_context_checks_the_product_a_sum_would_hide(store):
    reversed_columns = Candidate("reversed", _reverses_the_columns)
    problem = dataclasses.replace(PROBLEM, epilogue=Epilogue.parse("|reduce_sum{axes=n}(y)"))
    tuner = make_tuner(store, cset=two_candidates([(reversed_columns, [("g", 1)])]),
                       timer=FakeTimer({"xla_dot": [3.0], "fast": [2.0], "slow": [4.0], "reversed": [0.5]},
                                       real_outputs=True))
    decision = tuner.select(problem)
    assert decision.result("reversed").outcome == "wrong_result" and decision.winner == "fast"


def test_a_context_keys_decision_is_stored_and_read_back_under_its_own_key(store):
    make_tuner(store, timer=FakeTimer(custom_call_loses_its_fusion, real_outputs=True)).select(IN_CONTEXT)
    again = make_tuner(store).select(IN_CONTEXT)
    assert again.source == "store" and again.winner == "xla_dot"
    assert make_tuner(store).known.lookup(PROBLEM.key()) is None  # the bare key is another one


def test_a_context_key_does_not_time_again_what_lost_its_bare_product_by_a_wide_margin(store):
    """Bare: xla 3, fast 2, slow 4 (2x the best, over the 1.5x reuse ratio)."""
    timer = FakeTimer(custom_call_loses_its_fusion, real_outputs=True)
    tuner = make_tuner(store, timer=timer)
    tuner.select(PROBLEM)
    timer.prepared.clear(), timer.sampled.clear()
    in_context = tuner.select(IN_CONTEXT)
    assert "slow" not in timer.prepared + timer.sampled and {"xla_dot", "fast"} <= set(timer.sampled)
    skipped = in_context.result("slow")
    assert skipped.outcome == "skipped" and "lost by 2.00x to fast" in skipped.error
    assert PROBLEM.key().canonical()[:60] in skipped.error


@pytest.mark.parametrize("rules, bare_first", [(TuningRules(), False), (TuningRules(reuse_ratio=None), True),
                                               (TuningRules(reuse_ratio=2.5), True)])
def test_every_candidate_is_timed_without_a_bare_tuning_or_a_wide_enough_loss(store, rules, bare_first):
    timer = FakeTimer(custom_call_loses_its_fusion, real_outputs=True)
    tuner = make_tuner(store, timer=timer)
    tuner.rules = rules
    if bare_first:
        tuner.select(PROBLEM)
    timer.sampled.clear()
    assert tuner.select(IN_CONTEXT).result("slow").outcome == "ok" and "slow" in timer.sampled


def test_a_fused_candidate_is_judged_by_its_products_kernel_and_a_wrong_one_stays_out(store):
    fused = dataclasses.replace(fake_candidate("slow_fused"), product="slow",
                                supports=lambda device, key: not key.epilogue.is_bare)
    cset = candidate_set([("g", 1)], [(fake_candidate("fast"), [("g", 1)]), (fake_candidate("slow"), [("g", 1)]),
                                      (fake_candidate("bad"), [("g", 1)]), (fused, [("g", 1)])])
    scripts = {"xla_dot": [3.0], "fast": [2.0], "slow": [4.0], "bad": [1.0], "slow_fused": [1.0]}
    timer = FakeTimer(scripts, real_outputs=True, wrong={"bad"})
    tuner = make_tuner(store, cset=cset, timer=timer)
    assert tuner.select(PROBLEM).result("bad").outcome == "wrong_result"
    timer.prepared.clear()
    in_context = tuner.select(IN_CONTEXT)
    assert {"slow", "slow_fused", "bad"}.isdisjoint(timer.prepared)
    assert "wrong_result on the same product" in in_context.result("bad").error
    assert "lost by 2.00x" in in_context.result("slow_fused").error and in_context.winner == "fast"


class CountingProbes(FakeProbes):
    def __init__(self, error=None):
        super().__init__(error)
        self.asked: list[MatmulProblem] = []

    def peaks_for(self, problem):
        self.asked.append(problem)
        return super().peaks_for(problem)


def test_prime_measures_the_probes_of_the_keys_it_will_tune_and_no_others(store):
    """warmup's prime phase measures the probes before anything else may hold the device
    (the plain program's compile): a key's tuning must not wait for them behind it."""
    other = MatmulProblem(1, 32, 8, 12, "float32", "float32", "float32")
    known = MatmulProblem(1, 48, 8, 12, "float32", "float32", "float32")
    probes = CountingProbes()
    tuner = make_tuner(store, probes=probes)
    tuner.select(known)  # decided already: nothing to measure for it
    probes.asked.clear()
    work = [(p.key(), p) for p in (PROBLEM, other, known, PROBLEM)]
    assert tuner.prime(work) == 0  # no XLA priming on a CPU
    assert probes.asked == [PROBLEM, other]
    assert tuner.prime(work, Policy(mode="cached")) == 0 and probes.asked == [PROBLEM, other]  # tunes nothing


def test_prime_leaves_a_failing_probe_to_the_keys_own_tuning(store):
    tuner = make_tuner(store, probes=FakeProbes(error=RuntimeError("CUPTI busy")))
    assert tuner.prime([(PROBLEM.key(), PROBLEM)]) == 0  # no exception
    decision = tuner.select(PROBLEM)
    assert decision.source == "fallback" and "CUPTI busy" in decision.reason
