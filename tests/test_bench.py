"""The adaptive benchmark's rules, checked exactly with a scripted timer and clock."""

import dataclasses
import math

import pytest

from fakes import REFERENCE, FakeClock, FakeTimer, fake_candidate
from jax_autotune.tuning.bench import KeyBenchmark, classify_error
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.rules import TuningRules

PROBLEM = MatmulProblem(1, 2, 3, 4, "float32", "float32", "float32")
BASE = fake_candidate("xla_dot")


def bench(timer, limit=None, rules=TuningRules(), budget=math.inf, clock=None, cost_model=False):
    """A benchmark of fakes; their costs only order a round unless ``cost_model``."""
    clock = clock or FakeClock()
    if not cost_model:
        rules = dataclasses.replace(rules, cost_skip_ratio=None)
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


def test_the_cost_model_skips_a_candidate_estimated_over_the_ratio_times_the_best_measured():
    timer = FakeTimer({"xla_dot": [1.0], "close": [0.9], "hopeless": [0.1]})
    b = bench(timer, rules=TuningRules(cost_skip_ratio=1.3), cost_model=True)
    b.run_round(BASE, [fake_candidate("close", cost=1.29), fake_candidate("hopeless", cost=1.31)])
    assert "hopeless" not in timer.prepared  # never compiled
    assert b.results["hopeless"].outcome == "skipped"
    assert "cost model" in b.results["hopeless"].error
    assert b.results["close"].outcome == "ok"
    assert b.winner() == "close"


def test_quick_candidates_run_right_after_the_baseline_and_set_the_cost_bar():
    timer = FakeTimer({"xla_dot": [4.0], "library": [1.0], "kernel": [0.5], "slow_kernel": [0.5]})
    b = bench(timer, rules=TuningRules(cost_skip_ratio=1.3), cost_model=True)
    b.run_round(BASE, [fake_candidate("kernel", cost=1.2),
                       fake_candidate("slow_kernel", cost=2.0),
                       fake_candidate("library", cost=9.0, quick_compile=True)])
    assert list(dict.fromkeys(timer.sampled)) == ["xla_dot", "library", "kernel"]
    # estimated 2.0 > 1.3 x library's 1.0 (it would pass XLA's 4.0 alone)
    assert b.results["slow_kernel"].outcome == "skipped"
    assert b.winner() == "kernel"


def test_a_quick_candidate_is_never_skipped_by_the_cost_model():
    timer = FakeTimer({"xla_dot": [1.0], "library": [0.8]})
    b = bench(timer, rules=TuningRules(cost_skip_ratio=1.0), cost_model=True)
    b.run_round(BASE, [fake_candidate("library", cost=50.0, quick_compile=True)])
    assert b.results["library"].outcome == "ok"


def test_nothing_is_skipped_by_cost_before_a_time_is_measured():
    timer = FakeTimer({"xla_dot": [1.0], "a": [1.0]}, compile_errors={"xla_dot": RuntimeError("boom")})
    b = bench(timer, rules=TuningRules(cost_skip_ratio=1.0), cost_model=True)
    b.run_round(BASE, [fake_candidate("a", cost=1e9)])
    assert b.results["a"].outcome == "ok"


def test_the_cost_skip_ratio_must_be_at_least_one_or_none():
    with pytest.raises(ValueError, match="cost_skip_ratio"):
        TuningRules(cost_skip_ratio=0.9)
    assert TuningRules(cost_skip_ratio=None).cost_skip_ratio is None


def test_a_short_circuit_still_measures_the_quick_candidates_and_one_may_win():
    timer = FakeTimer({"xla_dot": [1.0], "library": [0.9], "kernel": [0.1]})
    b = bench(timer, limit=1.0)
    b.run_round(BASE, [fake_candidate("kernel", cost=0.1),
                       fake_candidate("library", cost=5.0, quick_compile=True)])
    assert b.finished and b.finish_reason.startswith("short-circuit: xla_dot")
    assert b.results["library"].outcome == "ok" and b.results["kernel"].outcome == "skipped"
    assert "kernel" not in timer.prepared
    assert b.winner(baseline="xla_dot") == "library"


def test_past_the_budget_even_the_quick_candidates_are_skipped():
    clock = FakeClock()
    timer = FakeTimer({"xla_dot": [1.0], "library": [0.5]})
    b = bench(timer, limit=1.0, budget=10.0, clock=clock)
    original = timer.prepare

    def slow_prepare(candidate, problem, args):  # XLA's dot takes the whole budget
        if candidate.name == "xla_dot":
            clock.advance(11.0)
        return original(candidate, problem, args)

    timer.prepare = slow_prepare
    b.run_round(BASE, [fake_candidate("library", quick_compile=True)])
    assert b.results["xla_dot"].outcome == "ok"
    assert b.results["library"].outcome == "skipped"


def test_probes_that_fail_beside_the_reference_are_measured_again_alone():
    """A CUPTI count disturbed by another thread's kernels fails the probes run beside the
    reference; the key is not lost for it: the peaks are measured again."""
    import concurrent.futures
    import types

    from jax_autotune.tuning.bench import _peaks
    from jax_autotune.tuning.roofline import Peaks

    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("The number of kernel launches is not divisible by the number of iterations"))
    calls = []
    peaks = Peaks(1e15, 4e12, 5e-6)
    setup = types.SimpleNamespace(probes=types.SimpleNamespace(peaks_for=lambda p: calls.append(p) or peaks))
    problem = MatmulProblem(1, 64, 64, 64, "float32", "float32", "float32")
    assert _peaks(failed, setup, problem) is peaks and calls == [problem]
    done = concurrent.futures.Future()
    done.set_result(peaks)
    assert _peaks(done, setup, problem) is peaks and len(calls) == 1  # not measured twice

    def broken(p):
        raise RuntimeError("still disturbed")
    with pytest.raises(RuntimeError, match="still disturbed"):  # the tuner falls back to XLA's dot
        _peaks(failed, types.SimpleNamespace(probes=types.SimpleNamespace(peaks_for=broken)), problem)


# ---------------------------------------------------------------- host clocks: in turns

def host_bench(scripts, rules=TuningRules()):
    """A host-clock benchmark of XLA's dot and "fast", timed alone then in turns."""
    timer = FakeTimer(scripts, device_time=False)
    b = bench(timer, rules=rules)
    b.run_round(BASE, [fake_candidate("fast")])
    b.compare_in_turns("xla_dot")
    return b, timer


def test_a_winner_timed_alone_that_loses_in_turns_with_xla_s_dot_leaves_xla_s_dot():
    # alone: 3.0 against 2.0; in turns the host drifted, and XLA's dot is 1.9 to its 2.0
    # (the 100.0 is its first turn's untimed run: kept, it would have put a pair above the bar)
    b, timer = host_bench({"xla_dot": [3.0, 3.0, 3.0, 3.0, 100.0, 1.9], "fast": [2.0]})
    assert b.results["fast"].score == 2.0 and b.results["xla_dot"].score == 3.0
    assert b.results["fast"].paired_ratio == pytest.approx(0.95)
    assert b.winner("xla_dot") == "xla_dot"
    # three pairs all under the margin end it: four samples each alone, then two a turn
    assert timer.samples_of("fast") == 4 + 3 * 2 and timer.samples_of("xla_dot") == 4 + 3 * 2


def test_a_winner_that_stays_ahead_in_turns_keeps_its_place_and_the_order_swaps_every_pair():
    b, timer = host_bench({"xla_dot": [3.0], "fast": [2.0]})
    assert b.results["fast"].paired_ratio == pytest.approx(1.5)
    assert b.winner("xla_dot") == "fast"
    in_turns = [name for kind, name in timer.events if kind == "sample"][8:]
    assert in_turns == ["fast", "fast", "xla_dot", "xla_dot", "xla_dot", "xla_dot", "fast", "fast",
                        "fast", "fast", "xla_dot", "xla_dot"]  # each turn: one untimed run, one sample


def test_pairs_on_both_sides_of_the_margin_run_to_the_most_pairs_and_the_median_decides():
    drifting = [3.0] * 4 + [2.1, 2.1, 1.9, 1.9] * 4  # ratios to fast's 2.0: 1.05, 0.95, ...
    b, timer = host_bench({"xla_dot": drifting, "fast": [2.0]}, TuningRules(paired_samples=8))
    assert timer.samples_of("fast") == 4 + 8 * 2
    assert b.results["fast"].paired_ratio == pytest.approx(1.0)
    assert b.winner("xla_dot") == "xla_dot"


def test_a_device_timer_or_no_pairs_times_nothing_in_turns():
    b, timer = host_bench({"xla_dot": [3.0], "fast": [2.0]}, TuningRules(paired_samples=0))
    assert b.results["fast"].paired_ratio is None and timer.samples_of("fast") == 4
    device = FakeTimer({"xla_dot": [3.0], "fast": [2.0]})
    b = bench(device)
    b.run_round(BASE, [fake_candidate("fast")])
    b.compare_in_turns("xla_dot")
    assert b.results["fast"].paired_ratio is None and device.samples_of("fast") == 4
    assert b.winner("xla_dot") == "fast"


def test_a_candidate_level_with_xla_s_dot_alone_but_ahead_in_turns_wins():
    b, timer = host_bench({"xla_dot": [1.0], "fast": [1.01, 1.01, 1.01, 1.01, 0.9]})
    assert b.winner() == "xla_dot"  # alone: 1.0 against 1.01
    assert b.results["fast"].paired_ratio == pytest.approx(1.0 / 0.9)
    assert b.winner("xla_dot") == "fast" and timer.samples_of("xla_dot") == 4 + 3 * 2


def test_a_candidate_beyond_the_prune_ratio_of_xla_s_dot_is_not_timed_again():
    b, timer = host_bench({"xla_dot": [1.0], "fast": [1.6]})
    assert b.winner("xla_dot") == "xla_dot" and timer.samples_of("xla_dot") == 4
    assert all(r.paired_ratio is None for r in b.results.values())


def test_a_sample_that_fails_in_turns_leaves_the_rounds_results():
    b, _ = host_bench({"xla_dot": [3.0, 3.0, 3.0, 3.0, RuntimeError("busy")], "fast": [2.0]})
    assert b.results["fast"].paired_ratio is None and b.results["fast"].outcome == "ok"
    assert b.winner("xla_dot") == "fast"
    b, _ = host_bench({"xla_dot": [3.0, 3.0, 3.0, 3.0, None], "fast": [2.0]})
    assert b.results["fast"].paired_ratio is None and b.winner("xla_dot") == "fast"


def test_paired_samples_must_not_be_negative():
    with pytest.raises(ValueError, match="paired_samples"):
        TuningRules(paired_samples=-1)


def test_the_budget_counts_the_keys_own_time_not_its_waits_for_the_device():
    """Each timing waits 100 s for the device held by other work (another key's timing,
    warmup's plain program compiling): the budget ends tuning where it does without them."""
    clock, waits = FakeClock(), [0.0]
    timer = FakeTimer({"xla_dot": [4.0], "a": [1.0], "b": [0.01]})
    timer.clock = clock
    original = timer.prepare

    def waiting_prepare(candidate, problem, args):
        measurement = original(candidate, problem, args)
        sample = measurement.sample

        def waited_sample(*a, **k):
            clock.advance(100.0)
            waits[0] += 100.0
            return sample(*a, **k)

        measurement.sample = waited_sample
        return measurement

    timer.prepare = waiting_prepare
    b = KeyBenchmark(PROBLEM, (None, None), REFERENCE, timer, limit=None,
                     rules=TuningRules(cost_skip_ratio=None), clock=clock, budget_seconds=19.5,
                     waited=lambda: waits[0])
    b.run_round(BASE, [fake_candidate("a", cost=1), fake_candidate("b", cost=2)])
    # as in test_the_budget_ends_tuning_with_the_best_so_far, though the clock ran past
    # the budget at the first wait
    assert b.finished and b.finish_reason == "budget"
    assert b.results["a"].outcome == "ok" and b.results["b"].outcome == "skipped"
    assert b.winner() == "a"
