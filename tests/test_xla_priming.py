"""Priming: XLA's GEMM autotuner run over many XLA-based candidates in one compile first."""

import dataclasses
import threading

import jax
import pytest

from fakes import CPU, FakeClock, FakeTimer, fake_candidate
from jax_autotune import config
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import counters, xla_priming
from jax_autotune.tuning.bench import CompileQueue
from jax_autotune.tuning.candidates import CandidateSetBuilder
from jax_autotune.tuning.compile_options import TUNER_COMPILER_OPTIONS
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.roofline import Peaks
from jax_autotune.tuning.tuner import Tuner

P1 = MatmulProblem(1, 16, 8, 12, "float32", "float32", "float32")
P2 = MatmulProblem(1, 7, 5, 3, "float32", "float32", "float32")
GPU = DeviceInfo("gpu", "fake-gpu", 1 << 30, (9, 0), frozenset())
DEVICE = jax.devices("cpu")[0]


def xla_like(name: str):
    return dataclasses.replace(fake_candidate(name), xla_autotuned=True)


XLA, PADDED, PALLAS = xla_like("xla_dot"), xla_like("padded_like"), fake_candidate("pallas_like")


@pytest.fixture(autouse=True)
def clean():
    config.reset()
    counters.reset_stats()
    xla_priming.forget()
    yield
    xla_priming.forget()
    config.reset()


@pytest.fixture
def compiled(monkeypatch):
    """The pairs of each priming compile, in order (nothing is compiled)."""
    calls = []
    monkeypatch.setattr(xla_priming, "_compile_together", lambda pairs, device: calls.append(
        [(p, c.name) for p, c in pairs]))
    return calls


def test_prime_compiles_each_xla_autotuned_pair_once_and_only_once(compiled):
    pairs = [(P1, XLA), (P1, PALLAS), (P2, XLA), (P1, XLA), (P1, PADDED)]
    assert xla_priming.prime(pairs, DEVICE) == 3
    assert compiled == [[(P1, "xla_dot"), (P2, "xla_dot"), (P1, "padded_like")]]
    assert xla_priming.is_primed(P2, XLA, DEVICE) and not xla_priming.is_primed(P1, PALLAS, DEVICE)
    assert counters.stats()["xla_primed"] == 3
    # primed already: XLA keeps those choices for the process, nothing to compile again
    assert xla_priming.prime(pairs + [(P2, PADDED)], DEVICE) == 0
    assert len(compiled) == 1 and not xla_priming.is_primed(P2, PADDED, DEVICE)


def test_a_long_list_is_primed_in_bounded_compiles_and_a_failing_one_loses_only_its_own(monkeypatch):
    problems = [MatmulProblem(1, 8 + i, 8, 8, "float32", "float32", "float32") for i in range(7)]
    calls = []

    def compile_together(pairs, device):
        calls.append(len(pairs))
        if len(calls) == 2:
            raise RuntimeError("XLA rejected one of them")

    monkeypatch.setattr(xla_priming, "_compile_together", compile_together)
    monkeypatch.setattr(xla_priming, "PAIRS_PER_COMPILE", 3)
    assert xla_priming.prime([(p, XLA) for p in problems], DEVICE) == 4
    assert calls == [3, 3, 1]
    assert [xla_priming.is_primed(p, XLA, DEVICE) for p in problems] == [True] * 3 + [False] * 3 + [True]
    assert counters.stats()["xla_primed"] == 4


def test_a_single_dot_is_not_worth_a_priming_compile(compiled):
    assert xla_priming.prime([(P1, XLA), (P1, PALLAS)], DEVICE) == 0
    assert compiled == [] and not xla_priming.is_primed(P1, XLA, DEVICE)


def test_a_failing_priming_compile_costs_only_its_time(monkeypatch):
    def fail(pairs, device):
        raise RuntimeError("XLA could not compile it")
    monkeypatch.setattr(xla_priming, "_compile_together", fail)
    assert xla_priming.prime([(P1, XLA), (P2, XLA)], DEVICE) == 0
    assert not xla_priming.is_primed(P1, XLA, DEVICE)
    assert counters.stats()["xla_primed"] == 0


class SpyLock:
    def __init__(self):
        self.held = []

    def exclusive(self):
        spy = self

        class Held:
            def __enter__(self):
                spy.held.append("exclusive")

            def __exit__(self, *exc):
                return False
        return Held()


def test_the_priming_compile_lowers_every_dot_into_one_module_and_holds_the_device_alone(monkeypatch):
    compiled_text = []
    spy = SpyLock()
    held = spy.held
    original = jax.stages.Lowered.compile

    def compile_and_look(self, *args, **kwargs):
        compiled_text.append(self.as_text())
        assert held == ["exclusive"], "compiled outside the exclusive hold"
        return original(self, *args, **kwargs)

    monkeypatch.setattr(xla_priming, "DEVICE_LOCK", spy)
    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_and_look)
    real_xla = dataclasses.replace(XLA)  # xla_dot itself: fake_candidate's fn is lax's dot
    assert xla_priming.prime([(P1, real_xla), (P2, real_xla)], DEVICE) == 2
    assert held == ["exclusive"] and len(compiled_text) == 1
    assert compiled_text[0].count("dot_general") == 2


def test_a_queue_compiles_its_xla_candidates_only_after_priming_them(monkeypatch):
    release, primed = threading.Event(), []

    def slow_prime(pairs, device):
        primed.append([c.name for _, c in pairs])
        assert release.wait(10)
        return len(pairs)

    monkeypatch.setattr(xla_priming, "prime", slow_prime)
    timer = FakeTimer({})
    queue = CompileQueue(timer, P1, (None, None), threads=3)
    queue.prime([XLA, PALLAS, PADDED], DEVICE)
    queue.start(XLA)
    queue.result(PALLAS)  # not XLA-based: compiles while the priming runs
    assert timer.prepared == ["pallas_like"] and primed == [["xla_dot", "padded_like"]]
    release.set()
    queue.result(XLA)
    queue.result(PADDED)
    assert sorted(timer.prepared) == ["padded_like", "pallas_like", "xla_dot"]
    queue.close()


def test_a_queue_with_one_xla_candidate_does_not_prime(monkeypatch):
    monkeypatch.setattr(xla_priming, "prime", lambda pairs, device: pytest.fail("primed"))
    queue = CompileQueue(FakeTimer({}), P1, (None, None), threads=2)
    queue.prime([XLA, PALLAS], DEVICE)
    queue.result(XLA)
    queue.close()


class FakeProbes:
    def peaks_for(self, problem):
        return Peaks(compute=1e12, bandwidth=1e11, launch_overhead=1e-6)


def gpu_candidates(primes_xla: bool = True):
    """Group "g": its top tier an XLA-based and a Pallas-like candidate, tier 1 another
    XLA-based one."""
    builder = CandidateSetBuilder("gpu", "fake-gpu")
    builder.add(XLA)
    group = builder.group("g", lambda key: 1, primes_xla=primes_xla)
    builder.add(PADDED, group, lambda key: 2)
    builder.add(PALLAS, group, lambda key: 2)
    builder.add(xla_like("lower_tier_xla"), group, lambda key: 1)
    return builder.build()


def gpu_tuner(store, device=GPU, primes_xla: bool = True):
    cset = gpu_candidates(primes_xla)
    timer = FakeTimer({"xla_dot": [3.0], "padded_like": [1.0], "pallas_like": [2.0], "lower_tier_xla": [4.0]},
                      real_outputs=True)
    return Tuner(device, cset, jax_device=DEVICE, timer=timer, store=store, clock=FakeClock(),
                 probes=FakeProbes())


@pytest.fixture
def primes(monkeypatch):
    calls = []
    monkeypatch.setattr(xla_priming, "prime", lambda pairs, device: calls.append(
        [(p, c.name) for p, c in pairs]) or len(calls[-1]))
    return calls


def test_a_cold_tune_on_a_gpu_primes_the_baseline_and_its_rounds_xla_candidates(store, primes):
    decision = gpu_tuner(store).select(P1)
    assert decision.source == "tuned" and decision.winner == "padded_like"
    assert primes == [[(P1, "xla_dot"), (P1, "padded_like")]]  # not the lower tier's


def test_a_round_whose_group_does_not_prime_compiles_its_xla_candidates_on_their_own(store, primes):
    # a split-K round, say, often ends on a short-circuit before its XLA-based candidate
    decision = gpu_tuner(store, primes_xla=False).select(P1)
    assert decision.winner == "padded_like" and primes == []  # one dot: nothing to prime
    assert gpu_tuner(store, primes_xla=False).prime([(P2.key(), P2), (P1.key(), P1)]) == 1
    assert primes == [[(P2, "xla_dot")]]  # warmup still primes the baselines of its keys


def test_tuner_prime_covers_the_keys_it_will_tune_and_no_others(store, primes):
    tuner = gpu_tuner(store)
    tuner.select(P1)  # decided: in memory now
    primes.clear()
    work = [(P1.key(), P1), (P2.key(), P2)]
    assert tuner.prime(work) == 2
    assert primes == [[(P2, "xla_dot"), (P2, "padded_like")]]
    assert tuner.prime(work, Policy(mode="cached")) == 0 and len(primes) == 1  # nothing will be tuned
    assert gpu_tuner(store, device=CPU).prime(work) == 0 and len(primes) == 1  # no GPU autotuner


def test_warmup_primes_every_key_before_tuning_them(monkeypatch, fresh_tuning):
    import jax_autotune as jat

    seen = []
    monkeypatch.setattr(Tuner, "prime", lambda self, work, policy: seen.append(sorted(p.m for _, p in work)) or 0)
    config.update("mode", "off")  # the keys are not tuned: only the call is looked at
    report = jat.warmup([(16, 8, 12), (7, 5, 3)], dtype="float32", platform="cpu")
    assert seen == [[7, 16]] and len(report) == 2


def test_a_primed_candidate_compiles_without_holding_the_device_and_others_hold_it(monkeypatch, compiled):
    import numpy as np
    from jax_autotune.kernels.xla import XLA_DOT
    from jax_autotune.tuning import timing

    spy = SpyLock()
    monkeypatch.setattr(timing, "DEVICE_LOCK", spy)
    args = timing.random_operands(P1, DEVICE)
    assert xla_priming.prime([(P1, XLA_DOT), (P2, XLA_DOT)], DEVICE) == 2
    executable = timing.compile_candidate(XLA_DOT, P1, args)
    assert spy.held == []  # compiled with XLA told to take only its kept choices
    want = np.matmul(*(np.asarray(x, np.float64) for x in args))
    assert np.allclose(np.asarray(executable(*args)), want, rtol=1e-5, atol=1e-4)
    other = MatmulProblem(1, 9, 4, 6, "float32", "float32", "float32")
    timing.compile_candidate(XLA_DOT, other, timing.random_operands(other, DEVICE))
    assert spy.held == ["exclusive"]  # not primed: its compile may autotune


def test_compile_primed_is_none_for_a_pair_not_primed_or_a_compile_that_fails(compiled):
    class Lowered:
        def __init__(self, error=None):
            self.error, self.options = error, []

        def compile(self, compiler_options=None):
            self.options.append(compiler_options)
            if self.error:
                raise self.error
            return "executable"

    fine = Lowered()
    assert xla_priming.compile_primed(fine, P1, XLA, DEVICE) is None and fine.options == []
    xla_priming.prime([(P1, XLA), (P2, XLA)], DEVICE)
    assert xla_priming.compile_primed(fine, P1, XLA, DEVICE) == "executable"
    assert fine.options == [{**TUNER_COMPILER_OPTIONS, **xla_priming.KEPT_CHOICES_ONLY}]
    missed = Lowered(RuntimeError("NOT_FOUND: Complete autotuning results are required"))
    assert xla_priming.compile_primed(missed, P1, XLA, DEVICE) is None
    assert xla_priming.compile_primed(fine, P1, XLA, None) is None


def test_on_gpus_a_misaligned_keys_round_primes_and_a_split_k_round_does_not():
    from jax_autotune.kernels.gpu.candidates import gpu_candidate_set
    from jax_autotune.tuning.plan import make_plan
    from jax_autotune.tuning.bench import xla_round as _xla_round

    h200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0), frozenset())
    cset = gpu_candidate_set(h200)

    def primed_names(m, n, k):
        key = MatmulProblem(1, m, n, k, "bfloat16", "bfloat16", "bfloat16").key()
        plan = make_plan(cset, key, h200)
        assert any(c.xla_autotuned for c in plan.runnable[0].candidates)  # something to prime
        return [c.name for c in _xla_round(plan)]

    assert primed_names(1025, 1025, 1025) == ["xla_dot", "padded_xla_dot_a64_barrier_rows"]
    assert primed_names(768, 768, 8192) == ["xla_dot"]  # split-K: xla_transposed compiles alone
