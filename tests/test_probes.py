"""Probe stopping rules (exact, with scripted samples) and probe caching."""

import jax
import pytest

from fakes import CPU, FakeClock
from jax_autotune.tuning import probes
from jax_autotune.tuning.probes import (LAUNCH_MAX, LAUNCH_MIN_SAMPLES, LAUNCH_WARMUP_SAMPLES, ProbeResult,
                                 Probes, sample_launch_overhead, sample_peak)


def scripted(values, launches_each=1, clock=None, seconds_each=0.0):
    values = iter(values)

    def sample():
        if clock is not None:
            clock.advance(seconds_each)
        return next(values), launches_each
    return sample


def test_launch_probe_discards_warmup_then_stops_once_the_median_settles():
    samples = [9.0] * LAUNCH_WARMUP_SAMPLES + [1.0] * 100
    result = sample_launch_overhead(scripted(samples, launches_each=10))
    assert result.value == 1.0
    assert result.launches == (LAUNCH_WARMUP_SAMPLES + LAUNCH_MIN_SAMPLES) * 10


@pytest.mark.parametrize("launches_each", [100, 51, 7])
def test_launch_probe_never_exceeds_its_launch_cap(launches_each):
    noisy = [1.0, 2.0] * 10_000  # never settles
    result = sample_launch_overhead(scripted(noisy, launches_each=launches_each))
    assert LAUNCH_MAX - launches_each < result.launches <= LAUNCH_MAX


def test_launch_probe_never_exceeds_its_time_cap():
    clock = FakeClock()
    noisy = [1.0, 2.0] * 10_000
    result = sample_launch_overhead(scripted(noisy, clock=clock, seconds_each=0.05), clock=clock)
    assert result.seconds <= probes.LAUNCH_MAX_SECONDS + 0.05
    assert result.launches < LAUNCH_MAX


def test_peak_probe_stops_when_three_samples_agree_within_three_percent():
    taken = []

    def sample():
        value = [2.0, 1.0, 1.5, 1.02, 1.01, 0.5][len(taken)]
        taken.append(value)
        return value

    result = sample_peak(sample, amount=100.0)
    assert taken == [2.0, 1.0, 1.5, 1.02, 1.01]  # 1.0, 1.02, 1.01 agree
    assert result.value == 100.0 and result.launches == 5


def test_peak_probe_takes_at_most_ten_samples():
    values = iter([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 0.1])
    result = sample_peak(lambda: next(values), amount=10.0)
    assert result.launches == 10 and result.value == 10.0


def test_probe_results_are_cached_in_memory_and_in_the_store(store):
    probes.forget_measurements()
    calls = []

    def measure():
        calls.append(1)
        return ProbeResult(42.0, 7, 0.1)

    first = Probes(CPU, jax.devices("cpu")[0], timer=None, store=store)
    assert first.get("compute/x", measure).value == 42.0
    assert first.get("compute/x", measure).value == 42.0
    probes.forget_measurements()  # a new process: only the store remembers
    second = Probes(CPU, jax.devices("cpu")[0], timer=None, store=store)
    assert second.get("compute/x", measure).value == 42.0
    assert len(calls) == 1
    probes.forget_measurements()


def test_cpu_probes_measure_the_fma_peak_and_copy_bandwidth_natively(store):
    native = pytest.importorskip("jax_autotune.kernels.cpu.native")
    cpu = Probes(CPU, jax.devices("cpu")[0], timer=None, store=store, native=native)
    compute = cpu._probe_compute("float32", "DEFAULT")
    bandwidth = cpu._probe_bandwidth(1 << 20)
    assert 1e9 < compute.value < 1e14 and compute.launches <= 10
    assert 1e8 < bandwidth.value < 1e13 and bandwidth.launches <= 10


@pytest.mark.parametrize("row", [{"value": "abc", "launches": 1, "seconds": 0.1},
                                 {"value": True, "launches": 1, "seconds": 0.1},
                                 {"value": 1e12, "launches": "many", "seconds": 0.1},
                                 {"value": 1e12, "launches": 1, "seconds": [1]},
                                 {"value": float("inf"), "launches": 1, "seconds": 0.1}])
def test_a_hand_edited_probe_row_is_measured_again_and_replaced(store, row):
    probes.forget_measurements()
    store.put(probes.throughput_namespace(CPU.fingerprint), "compute/x", probes.PROBE_VERSION, row)
    got = Probes(CPU, jax.devices("cpu")[0], timer=None, store=store).get(
        "compute/x", lambda: ProbeResult(42.0, 7, 0.1))
    assert got == ProbeResult(42.0, 7, 0.1)
    assert store.get(probes.throughput_namespace(CPU.fingerprint), "compute/x",
                     probes.PROBE_VERSION)["value"] == 42.0
    probes.forget_measurements()
