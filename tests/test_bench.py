"""The adaptive benchmark's rules, checked exactly with a scripted timer and clock."""

import math

import pytest

from fakes import REFERENCE, FakeClock, FakeTimer, fake_candidate
from jax_autotune.tuning.bench import KeyBenchmark, classify_error
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.rules import TuningRules

PROBLEM = MatmulProblem(1, 2, 3, 4, "float32", "float32", "float32")
BASE = fake_candidate("xla_dot")


def bench(timer, limit=None, rules=TuningRules(), budget=math.inf, clock=None):
    clock = clock or FakeClock()
    timer.clock = clock
    return KeyBenchmark(PROBLEM, (None, None), REFERENCE, timer, limit=limit, rules=rules,
                        clock=clock, budget_seconds=budget)


def test_the_first_sample_is_discarded_and_the_score_is_the_median_of_the_kept():
    timer = FakeTimer({"xla_dot": [100.0, 5.0, 4.0, 6.0, 5.0, 4.0, 6.0, 5.0, 4.0, 6.0, 5.0, 1.0]})
    b = bench(timer, rules=TuningRules(stable_spread=0.0))
    b.run_round(BASE, [])
    result = b.results["xla_dot"]
    assert 100.0 not in result.samples
    assert len(result.samples) == 10  # never stable with spread 0: max samples
    assert result.score == 5.0


def test_sampling_stops_at_three_once_samples_are_stable():
    timer = FakeTimer({"xla_dot": [9.0, 2.0, 2.0, 2.0, 2.0]})
    b = bench(timer)
    b.run_round(BASE, [])
    assert b.results["xla_dot"].samples == (2.0, 2.0, 2.0)
    assert timer.samples_of("xla_dot") == 4


def test_pruning_drops_a_candidate_over_one_and_a_half_times_the_best_after_three_samples():
    timer = FakeTimer({
        "xla_dot": [1.0, 1.0],
        "b": [2.0, 2.0],
        "slow": [1.6, 1.6, 1.6, 1.6, 1.6, 1.6, 1.5],
    }, )
    b = bench(timer, rules=TuningRules(stable_spread=0.0))
    b.run_round(BASE, [fake_candidate("b", cost=1), fake_candidate("slow", cost=2)])
    slow = b.results["slow"]
    assert slow.pruned and len(slow.samples) == 3
    assert not b.results["b"].pruned  # pruning would leave a single survivor: kept
    assert b.winner() == "xla_dot"


def test_an_eliminated_candidate_never_wins_on_its_shorter_sample_set():
    # "lucky" has a median that would win on its 3 samples, but its best is over 1.5x
    timer = FakeTimer({
        "xla_dot": [9.0, 1.0, 3.0],  # best 1.0, median 3.0
        "b": [2.0, 2.0],
        "lucky": [1.6, 1.6, 1.6, 1.6],
    })
    b = bench(timer, rules=TuningRules(stable_spread=0.0))
    b.run_round(BASE, [fake_candidate("b", cost=1), fake_candidate("lucky", cost=2)])
    assert b.results["lucky"].pruned
    assert b.results["xla_dot"].score == 3.0
    assert b.results["lucky"].score == 1.6
    assert b.winner() == "b"


def test_short_circuit_fires_on_the_second_in_bound_sample_not_the_first():
    timer = FakeTimer({
        "xla_dot": [5.0, 5.0],
        "fast": [0.5, 0.5, 3.0, 0.5, 0.5],  # discarded, in, out, in -> stop
        "never": [0.1],
    })
    b = bench(timer, limit=1.0)
    b.run_round(BASE, [fake_candidate("fast", cost=1), fake_candidate("never", cost=2)])
    assert b.results["fast"].samples == (0.5, 3.0, 0.5)
    assert b.finished and "short-circuit" in b.finish_reason
    assert b.results["never"].outcome == "skipped"
    assert timer.samples_of("never") == 0
    assert b.winner() == "fast"


def test_a_short_circuit_ends_later_rounds_too():
    timer = FakeTimer({"xla_dot": [0.1]})
    b = bench(timer, limit=1.0)
    assert b.run_round(BASE, []) is False
    assert b.finished
    assert b.run_round(BASE, [fake_candidate("later")]) is False
    assert b.results["later"].outcome == "skipped"
    assert "later" not in timer.prepared


def test_after_a_short_circuit_candidates_outside_the_compile_window_are_never_compiled():
    timer = FakeTimer({"xla_dot": [2.0], "c0": [0.1]})
    b = bench(timer, limit=1.0, rules=TuningRules(compile_ahead=2))
    b.run_round(BASE, [fake_candidate(f"c{i}", cost=i) for i in range(6)])
    assert b.finished and b.winner() == "c0"
    # c0 short-circuited while c1 (and at most c2) compiled ahead; c3..c5 never compiled
    assert timer.prepared[:2] == ["xla_dot", "c0"] and len(timer.prepared) <= 4
    assert all(b.results[f"c{i}"].outcome == "skipped" for i in range(1, 6))


def test_with_a_host_clock_every_candidate_compiles_before_any_is_timed():
    scripts = {"xla_dot": [5.0], "a": [1.0], "b": [2.0], "c": [3.0]}
    timer = FakeTimer(scripts, device_time=False)
    b = bench(timer, rules=TuningRules(compile_ahead=1))
    b.run_round(BASE, [fake_candidate(n, cost=i) for i, n in enumerate("abc")])
    first_sample_of_a = timer.events.index(("sample", "a"))
    assert {("prepare", n) for n in "abc"} <= set(timer.events[:first_sample_of_a])
    assert timer.events[0] == ("prepare", "xla_dot")  # the baseline alone first
    assert timer.events[1] == ("sample", "xla_dot")


def test_a_baseline_short_circuit_compiles_nothing_else_with_either_timer():
    for device_time in (True, False):
        timer = FakeTimer({"xla_dot": [0.1]}, device_time=device_time)
        b = bench(timer, limit=1.0)
        b.run_round(BASE, [fake_candidate("a"), fake_candidate("b")])
        assert timer.prepared == ["xla_dot"]


def test_the_budget_ends_tuning_with_the_best_so_far():
    timer = FakeTimer({"xla_dot": [4.0], "a": [1.0], "b": [0.01]})
    b = bench(timer, budget=19.5)
    b.run_round(BASE, [fake_candidate("a", cost=1), fake_candidate("b", cost=2)])
    # xla_dot: 1 discarded + 3 kept = 16 s; "a" passes the deadline on its 4th sample (20 s)
    assert b.finished and b.finish_reason == "budget"
    assert b.results["b"].outcome == "skipped"
    assert b.winner() == "a"


@pytest.mark.parametrize("time, expected", [(0.99, "xla_dot"), (0.97, "near")])
def test_a_candidate_must_beat_the_baseline_by_the_margin(time, expected):
    timer = FakeTimer({"xla_dot": [1.0], "near": [time]})
    b = bench(timer, rules=TuningRules(baseline_margin=0.02))
    b.run_round(BASE, [fake_candidate("near")])
    assert b.winner() == "near"  # without a baseline: the plain fastest
    assert b.winner(baseline="xla_dot") == expected


def test_a_wrong_result_never_wins_even_when_fastest():
    timer = FakeTimer({"xla_dot": [1.0], "wrong": [0.001]}, wrong={"wrong"})
    b = bench(timer)
    b.run_round(BASE, [fake_candidate("wrong")])
    assert b.results["wrong"].outcome == "wrong_result"
    assert b.results["wrong"].rel_error > 0
    assert timer.samples_of("wrong") == 0
    assert b.winner() == "xla_dot"


@pytest.mark.parametrize("where, error, outcome", [
    ("compile", RuntimeError("Mosaic failed to compile"), "compile_error"),
    ("compile", RuntimeError("RESOURCE_EXHAUSTED: shared memory 262144 > 232448"), "resource_exhausted"),
    ("run", RuntimeError("INTERNAL: kernel launch failed"), "runtime_error"),
    ("run", MemoryError("out of memory"), "resource_exhausted"),
    ("sample", RuntimeError("CUDA error"), "runtime_error"),
])
def test_every_kind_of_failure_is_captured_per_candidate(where, error, outcome):
    scripts = {"xla_dot": [1.0], "bad": [1.0]}
    if where == "sample":
        scripts["bad"] = [error]
    timer = FakeTimer(scripts, compile_errors={"bad": error} if where == "compile" else None,
                      run_errors={"bad": error} if where == "run" else None)
    b = bench(timer)
    valid = b.run_round(BASE, [fake_candidate("bad")])
    assert valid is False
    assert b.results["bad"].outcome == outcome
    assert str(error) in b.results["bad"].error
    assert b.winner() == "xla_dot"


def test_a_candidate_without_a_timing_is_no_timing():
    timer = FakeTimer({"xla_dot": [1.0], "silent": [None]})
    b = bench(timer)
    b.run_round(BASE, [fake_candidate("silent")])
    assert b.results["silent"].outcome == "no_timing"


def test_nothing_valid_means_no_winner():
    timer = FakeTimer({"xla_dot": [1.0]}, compile_errors={"xla_dot": RuntimeError("boom")})
    b = bench(timer)
    b.run_round(BASE, [])
    assert b.winner() is None


def test_candidates_are_sampled_baseline_first_then_cheapest_first():
    timer = FakeTimer({"xla_dot": [1.0], "costly": [1.0], "cheap": [1.0]})
    b = bench(timer)
    b.run_round(BASE, [fake_candidate("costly", cost=5.0), fake_candidate("cheap", cost=0.1)])
    order = list(dict.fromkeys(timer.sampled))
    assert order == ["xla_dot", "cheap", "costly"]


def test_the_baseline_is_measured_once_across_rounds():
    timer = FakeTimer({"xla_dot": [1.0], "a": [2.0], "b": [2.0]})
    b = bench(timer)
    b.run_round(BASE, [fake_candidate("a")])
    b.run_round(BASE, [fake_candidate("b")])
    assert timer.prepared.count("xla_dot") == 1


def test_classify_error_spots_resource_exhaustion():
    assert classify_error(RuntimeError("RESOURCE_EXHAUSTED: out of memory"), "run") == "resource_exhausted"
    assert classify_error(ValueError("bad block shape"), "compile") == "compile_error"


def test_a_candidate_wrong_off_the_sample_fails_against_xla_dots_whole_output():
    import jax
    from jax_autotune.tuning.candidates import Candidate
    from jax_autotune.tuning.correctness import reference
    from jax_autotune.tuning.timing import random_operands
    from jax_autotune.kernels.xla import xla_dot

    problem = MatmulProblem(2, 200, 150, 70, "float32", "float32", "float32")
    lhs, rhs = random_operands(problem, jax.devices()[0], seed=8)
    ref = reference(problem, lhs, rhs, host_max_macs=0)  # sampled
    row = next(r for r in range(200) if r not in set(ref.rows.tolist()))
    off_sample = Candidate("off_sample", lambda a, b, p: xla_dot(a, b, p).at[:, row, :].multiply(3.0))
    timer = FakeTimer({"xla_dot": [2.0], "off_sample": [1.0]}, real_outputs=True)
    b = KeyBenchmark(problem, (lhs, rhs), ref, timer, limit=None, platform="cpu")
    b.run_round(fake_candidate("xla_dot"), [off_sample])
    b.compiles.close()
    assert b.results["xla_dot"].outcome == "ok"
    assert b.results["off_sample"].outcome == "wrong_result"
    assert b.winner(baseline="xla_dot") == "xla_dot"
