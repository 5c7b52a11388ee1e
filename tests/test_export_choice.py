"""Export safety from what a candidate emits, and the candidate an export emits: the
fastest one jax.export takes, by the decision's results; recorded and logged. Fake
candidates only (a host callback stands in for a kernel jax.export does not take)."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from fakes import CPU, FakeClock, FakeTimer, candidate_set
from jax_autotune import config
from jax_autotune.kernels.xla import XLA_DOT, xla_dot
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import counters, export_choice, export_safety
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.decision import CandidateResult, Decision
from jax_autotune.tuning.export_choice import ranked
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.roofline import Peaks
from jax_autotune.tuning import tuner as tuner_module
from jax_autotune.tuning.tuner import Tuner

PROBLEM = MatmulProblem(1, 16, 8, 12, "float32", "float32", "float32")
CALLBACK = "xla_ffi_python_cpu_callback"  # what jax.pure_callback emits on CPUs
FFI_TARGET = "an_unregistered_ffi_target"


def host_matmul(lhs, rhs, problem):
    """Correct, and a custom call jax.export gives no compatibility guarantee for."""
    out = jax.ShapeDtypeStruct(problem.out_shape, np.dtype(problem.out_dtype))
    return jax.pure_callback(lambda a, b: np.matmul(a, b).astype(out.dtype), out, lhs, rhs)


def ffi_matmul(lhs, rhs, problem):
    """An FFI call (lowered only, never run): what a native kernel emits."""
    out = jax.ShapeDtypeStruct(problem.out_shape, np.dtype(problem.out_dtype))
    return jax.ffi.ffi_call(FFI_TARGET, out)(lhs, rhs)


def unsafe(name):
    return Candidate(name, host_matmul, params={"kind": "host"})


def safe(name):
    return Candidate(name, xla_dot, params={"kind": "xla"})


class FakeProbes:
    def peaks_for(self, problem):
        return Peaks(compute=1e12, bandwidth=1e11, launch_overhead=1e-6)


def make_tuner(store):
    """``host`` is fastest (1 s) and not export-safe; ``mid`` (1.2 s) beats ``slow`` (1.4 s)
    and XLA's dot (3 s); ``pruned`` and ``broken`` are faster on paper but cannot win."""
    names = [("host", unsafe), ("mid", safe), ("slow", safe), ("pruned", safe), ("broken", safe)]
    cset = candidate_set([("g", 1)], [(make(name), [("g", 1)]) for name, make in names])
    timer = FakeTimer({"xla_dot": [3.0], "host": [1.0], "mid": [1.2], "slow": [1.4],
                       "pruned": [9.0], "broken": [9.0]}, real_outputs=True)
    return Tuner(CPU, cset, jax_device=jax.devices("cpu")[0], timer=timer, store=store,
                 clock=FakeClock(), probes=FakeProbes())


def decision_of(tuner, results=None, winner="host"):
    results = [CandidateResult("host", "ok", score=1.0), CandidateResult("pruned", "ok", score=1.1, pruned=True),
               CandidateResult("broken", "wrong_result", score=1.1), CandidateResult("slow", "ok", score=1.4),
               CandidateResult("mid", "ok", score=1.2), CandidateResult("xla_dot", "ok", score=3.0)
               ] if results is None else results
    decision = Decision(key=PROBLEM.key(config.get("level")), problem=PROBLEM, winner=winner,
                        results=tuple(results), source="table")
    assert tuner.known.install(decision)
    return tuner.select(PROBLEM)


@pytest.fixture(autouse=True)
def clean():
    config.reset()
    counters.reset_stats()
    yield
    config.reset()


# ---------------------------------------------------------------- export safety

def test_export_safety_comes_from_what_a_candidate_emits():
    host, xla = unsafe("host"), safe("xla")
    before = export_safety.checks_run()
    verdict = host.export_safety(PROBLEM, "cpu")
    assert verdict.targets == verdict.unsafe == {CALLBACK} and not verdict.safe
    assert verdict.allowed({CALLBACK}) and not verdict.allowed({"other"})
    assert xla.export_safety(PROBLEM, "cpu").safe and xla.export_safety(PROBLEM, "cuda").safe
    assert host.export_safety(PROBLEM, "cpu") is verdict  # cached: lowered once
    assert export_safety.checks_run() - before == 3
    other = dataclasses.replace(PROBLEM, m=32)
    assert host.export_safety(other, "cpu") is not verdict  # per problem


def test_the_verdict_agrees_with_jax_export():
    for candidate in (Candidate("ffi", ffi_matmul), safe("xla"), XLA_DOT):
        fn = lambda a, b, c=candidate: c.fn(a, b, PROBLEM)  # noqa: E731
        operands = (jax.ShapeDtypeStruct(PROBLEM.lhs_shape, np.float32),
                    jax.ShapeDtypeStruct(PROBLEM.rhs_shape, np.float32))
        try:
            jax.export.export(jax.jit(fn))(*operands)
            exported = True
        except ValueError as err:
            assert export_safety.REJECTED in str(err)
            exported = False
        assert candidate.export_safety(PROBLEM, "cpu").safe == exported


def test_without_jax_allow_list_jax_export_itself_decides(monkeypatch):
    monkeypatch.setattr(export_safety, "stable_targets", lambda: None)
    assert Candidate("ffi", ffi_matmul).export_safety(PROBLEM, "cpu").unsafe == {FFI_TARGET}
    assert safe("xla").export_safety(PROBLEM, "cpu").safe


def test_a_candidate_that_cannot_lower_is_never_exported():
    def broken(lhs, rhs, problem):
        raise NotImplementedError("no lowering for this problem")
    verdict = Candidate("broken", broken).export_safety(PROBLEM, "cpu")
    assert "NotImplementedError" in verdict.error and not verdict.allowed({CALLBACK})


def test_allowing_nests_and_is_undone():
    assert export_safety.allowed_targets() == frozenset()
    with export_safety.allowing(["a"]):
        with export_safety.allowing({"b"}) as inner:
            assert inner == {"a", "b"}
        assert export_safety.allowed_targets() == {"a"}
    assert export_safety.allowed_targets() == frozenset()
    with pytest.raises(TypeError):
        with export_safety.allowing("ab"):
            pass


# ---------------------------------------------------------------- the choice

def test_ranked_is_the_winner_then_every_eligible_result_fastest_first(store):
    assert ranked(decision_of(make_tuner(store))) == ["host", "mid", "slow", "xla_dot"]


def test_jit_emits_the_winner_and_export_the_fastest_safe_candidate(store, tmp_path):
    tuner = make_tuner(store)
    decision = decision_of(tuner)
    log = tmp_path / "decisions.jsonl"
    policy = Policy(log_decisions=str(log))
    assert tuner.emitted(PROBLEM, decision, False, "cpu", policy).name == "host"
    assert not log.exists()  # jit lowerings log nothing
    assert tuner.emitted(PROBLEM, decision, True, "cpu", policy).name == "mid"
    recorded = tuner.known.lookup(decision.key)
    assert recorded.winner == "host" and recorded.export_kernel == "mid"
    assert CALLBACK in recorded.export_reason and "fastest measured" in recorded.export_reason
    tuner.known.forget()  # the store has it too, so tune tables carry it
    assert tuner.known.lookup(decision.key).export_kernel == "mid"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["event"], e["winner"], e["export_kernel"]) for e in events] == [
        ("jax_autotune.export", "host", "mid")]
    assert counters.stats()["tuned"] == 0  # ranked by the stored results: nothing measured


def test_a_safe_winner_is_exported_as_is(store):
    tuner = make_tuner(store)
    decision = decision_of(tuner, winner="mid")
    assert tuner.emitted(PROBLEM, decision, True, "cpu").name == "mid"
    assert tuner.known.lookup(decision.key).export_reason == ""


def test_the_opt_in_keeps_an_allowed_winner(store):
    tuner = make_tuner(store)
    decision = decision_of(tuner)
    with export_safety.allowing({CALLBACK}):
        assert tuner.emitted(PROBLEM, decision, True, "cpu").name == "host"
    assert "kept" in tuner.known.lookup(decision.key).export_reason
    assert tuner.emitted(PROBLEM, tuner.select(PROBLEM), True, "cpu").name == "mid"


def test_no_safe_measured_candidate_means_xla_dot(store):
    tuner = make_tuner(store)
    decision = decision_of(tuner, results=[CandidateResult("host", "ok", score=1.0),
                                           CandidateResult("mid", "runtime_error")])
    assert tuner.emitted(PROBLEM, decision, True, "cpu").name == "xla_dot"
    assert counters.stats()["tuned"] == 0  # something was measured: no new measurement


def test_a_decision_without_results_is_measured_at_export_in_mode_tune_only(store):
    tuner = make_tuner(store)
    decision = decision_of(tuner, results=[])
    assert tuner.emitted(PROBLEM, decision, True, "cpu", Policy(mode="cached")).name == "xla_dot"
    assert counters.stats()["tuned"] == 0
    decision = tuner.select(PROBLEM)
    assert tuner.emitted(PROBLEM, decision, True, "cpu").name == "mid"
    assert counters.stats()["tuned"] == 1
    recorded = tuner.known.lookup(decision.key)
    assert recorded.winner == "host" and not recorded.results  # the decision itself is kept
    assert "measured at export" in recorded.export_reason
    # the next export reuses the recorded kernel instead of measuring again
    assert tuner.emitted(PROBLEM, recorded, True, "cpu").name == "mid"
    assert counters.stats()["tuned"] == 1


def test_a_failing_choice_never_fails_the_export(store, monkeypatch):
    tuner = make_tuner(store)
    decision = decision_of(tuner)
    monkeypatch.setattr(tuner_module, "allowed_targets", lambda: 1 / 0)
    assert tuner.emitted(PROBLEM, decision, True, "cpu").name == "xla_dot"
    assert "ZeroDivisionError" in tuner.known.lookup(decision.key).export_reason


def test_a_fallback_decision_is_logged_but_not_stored(store, tmp_path):
    tuner = make_tuner(store)
    policy = Policy(mode="cached", log_decisions=str(tmp_path / "log.jsonl"))
    decision = tuner.select(PROBLEM, policy=policy)
    assert decision.source == "fallback"
    assert tuner.emitted(PROBLEM, decision, True, "cpu", policy).name == "xla_dot"
    assert tuner.known.lookup(decision.key) is None
    assert json.loads((tmp_path / "log.jsonl").read_text())["export_kernel"] == "xla_dot"


# ---------------------------------------------------------------- the record

def test_export_fields_round_trip_and_are_optional_on_read():
    decision = Decision(key=PROBLEM.key("balanced"), problem=PROBLEM, winner="host",
                        export_kernel="mid", export_reason="why")
    assert Decision.from_json(decision.to_json()) == decision
    old = {k: v for k, v in decision.to_json().items() if not k.startswith("export_")}
    assert Decision.from_json(old) == dataclasses.replace(decision, export_kernel="", export_reason="")
