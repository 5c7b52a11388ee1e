"""Probes: the device's peaks, measured once and cached per device fingerprint.

Three probes feed the roofline bounds, each with an explicit stopping rule:

* ``launch_overhead``: the time of one trivial launch (on CPU one FFI call inside an
  executable when the native module is built, else one trivial op; on GPU the device
  time of a one-element kernel). Samples until the running median of the samples moves
  by less than 2% over the last 5 samples (at least 10 samples, after 5 discarded warm-up
  samples), or 2,000 launches, or
  0.3 s; the value is the median sample. (The reference spends 18k-250k launches.)
* ``compute/<dtype>/<precision>``: on the CPU (native module built, f32/f64) the FMA
  peak, every thread running independent vector FMA chains of the kernels' ISA;
  elsewhere XLA's dot on a square problem large enough to fill the device. Value:
  ops / the best sample once 3 samples agree within 3%, at most 10.
* ``bandwidth/<size>``: on the CPU a multi-threaded copy between two host buffers,
  elsewhere ``x * 2``, over the working-set class (1 MiB, 16 MiB, 64 MiB on CPU; up to
  1 GiB on GPU), counting bytes read plus written; same stopping rule as compute.

Results live in the store's throughput namespace (``probe-v1`` rows) and in memory, so
each probe runs once per device, shared by all keys.

    >>> probes = Probes(device_info, jax_device, timer, store)
    >>> probes.peaks_for(problem)
    Peaks(compute=4.7e11, bandwidth=1.9e10, launch_overhead=3.5e-07)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp

from jax_autotune.tuning import counters
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.roofline import Peaks, Work
from jax_autotune.tuning.namespaces import throughput_namespace
from jax_autotune.tuning.store import Store
from jax_autotune.tuning.timing import Timer, WallClockTimer, random_operands

PROBE_VERSION = "probe-v1"
LAUNCH_MAX = 2000
LAUNCH_MAX_SECONDS = 0.3
LAUNCH_MIN_SAMPLES = 10
LAUNCH_WARMUP_SAMPLES = 5  # taken first and discarded (cold caches, clocks ramping up)
LAUNCH_SETTLE_WINDOW = 5
LAUNCH_SETTLE = 0.02
PEAK_AGREE = 0.03
PEAK_MAX_SAMPLES = 10
PROBE_SAMPLE_SECONDS = 2e-3  # the FMA probe's iterations are scaled up to this per sample
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    value: float
    launches: int
    seconds: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _stored_result(stored: dict) -> ProbeResult | None:
    """A stored probe row as a ProbeResult: a finite positive value and counts that are
    numbers (a hand-edited row otherwise, measured again and replaced)."""
    fields = [stored.get("value"), stored.get("launches", 0), stored.get("seconds", 0.0)]
    if not all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f)
               for f in fields) or not fields[0] > 0:
        return None
    return ProbeResult(float(fields[0]), int(fields[1]), float(fields[2]))


def sample_launch_overhead(sample: Callable[[], tuple[float, int]], *, max_launches: int = LAUNCH_MAX,
                           max_seconds: float = LAUNCH_MAX_SECONDS, min_samples: int = LAUNCH_MIN_SAMPLES,
                           settle: float = LAUNCH_SETTLE, clock=time.perf_counter) -> ProbeResult:
    """Run ``sample() -> (seconds per launch, launches used)`` under the stopping rule."""
    start = clock()
    samples: list[float] = []
    launches = 0
    medians: list[float] = []
    for _ in range(LAUNCH_WARMUP_SAMPLES):
        launches += sample()[1]
    while True:
        seconds, used = sample()
        launches += used
        samples.append(seconds)
        medians.append(statistics.median(samples))
        if len(samples) >= min_samples:
            recent = medians[-LAUNCH_SETTLE_WINDOW:]
            if (max(recent) - min(recent)) <= settle * min(recent):
                break
        # stop before a sample of the same size would pass the launch cap
        if launches + used > max_launches or clock() - start >= max_seconds:
            break
    return ProbeResult(statistics.median(samples), launches, clock() - start)


def sample_peak(sample: Callable[[], float], amount: float, *, agree: float = PEAK_AGREE,
                max_samples: int = PEAK_MAX_SAMPLES, clock=time.perf_counter) -> ProbeResult:
    """``amount / best sample`` once 3 samples lie within ``agree`` of the best."""
    start = clock()
    samples: list[float] = []
    while len(samples) < max_samples:
        samples.append(sample())
        best = min(samples)
        if sum(1 for s in samples if s <= best * (1 + agree)) >= 3:
            break
    return ProbeResult(amount / min(samples), len(samples), clock() - start)


def _compute_size(device: DeviceInfo, dtype: str) -> int:
    itemsize = jnp.dtype(dtype).itemsize
    if device.platform == "cpu":
        return 512 if itemsize >= 8 else 1024
    return 8192 if itemsize <= 2 else 4096


def _bandwidth_classes(device: DeviceInfo) -> tuple[int, ...]:
    if device.platform == "cpu":
        return (1 * MiB, 16 * MiB, 64 * MiB)
    return (1 * MiB, 16 * MiB, 256 * MiB, 1024 * MiB)


# probe results of this process, by (throughput namespace, probe name): shared by every
# Probes object, so rebuilding a tuner (RUNTIME.reset) does not measure the device again
_MEASURED: dict[tuple[str, str], ProbeResult] = {}
_MEASURED_LOCK = threading.Lock()


def forget_measurements() -> None:
    """Drop this process's probe results (the store keeps its copy)."""
    with _MEASURED_LOCK:
        _MEASURED.clear()


class Probes:
    """Measures and caches the peaks of one device (thread-safe, each probe once)."""

    def __init__(self, device: DeviceInfo, jax_device, timer: Timer, store: Store,
                 native=None, baseline: Candidate | None = None,
                 quick: tuple[Candidate, ...] = ()):
        """``native``: the native kernel module on CPUs where it is built; ``baseline``: the
        candidate set's XLA dot, which the compute probe runs where no native probe exists;
        ``quick``: candidates that compile in milliseconds, which it runs instead when one
        supports the probe's problem (XLA's dot of the probe compiles with its autotuner)."""
        self.device, self.jax_device, self.timer, self.store = device, jax_device, timer, store
        self.native, self.baseline, self.quick = native, baseline, quick
        self.namespace = throughput_namespace(device.fingerprint)

    def peaks_for(self, problem: MatmulProblem) -> Peaks:
        compute = self.get(f"compute/{problem.lhs_dtype}/{problem.precision.value}",
                           lambda: self._probe_compute(problem.lhs_dtype, problem.precision))
        size_class = self.bandwidth_class(problem)
        bandwidth = self.get(f"bandwidth/{size_class // MiB}MiB",
                             lambda: self._probe_bandwidth(size_class))
        launch = self.get("launch_overhead", self._probe_launch)
        return Peaks(compute.value, bandwidth.value, launch.value)

    def bandwidth_class(self, problem: MatmulProblem) -> int:
        moved = Work.of(problem).bytes
        classes = _bandwidth_classes(self.device)
        return next((c for c in classes if moved <= c), classes[-1])

    def get(self, name: str, measure: Callable[[], ProbeResult]) -> ProbeResult:
        with _MEASURED_LOCK:
            if (self.namespace, name) in _MEASURED:
                return _MEASURED[(self.namespace, name)]
            stored = self.store.get(self.namespace, name, PROBE_VERSION)
            result = None if stored is None else _stored_result(stored)
            if result is None:  # missing, or a row that is not a measurement: measure again
                with jax.transfer_guard("allow"):
                    result = measure()
                counters.bump("probe_launches", result.launches)
                self.store.put(self.namespace, name, PROBE_VERSION, result.to_json())
            _MEASURED[(self.namespace, name)] = result
            return result

    # ---------------------------------------------------------------- the probes
    def _prepare(self, name: str, fn, problem, args, timer: Timer | None = None):
        candidate = Candidate(name, lambda a, b, p: fn(a, b))
        return (timer or self.timer).prepare(candidate, problem, args)

    def launch_measurement(self):
        """(measurement, launches per sample) of one trivial launch on this device."""
        problem = MatmulProblem(1, 1, 1, 1, "float32", "float32", "float32")
        args = random_operands(problem, self.jax_device, seed=1)
        native = self.native
        fn = (lambda a, b: native.noop_call(a)) if native else (lambda a, b: a * b)
        timer = self.timer
        if isinstance(timer, WallClockTimer):
            # small executables, so that one sample is a few dozen launches
            timer = WallClockTimer(target_seconds=2e-4, max_reps=100, clock=timer.clock)
        measurement = self._prepare("probe_launch", fn, problem, args, timer)
        return measurement, getattr(measurement, "reps", 1)

    def _probe_launch(self) -> ProbeResult:
        measurement, reps = self.launch_measurement()
        return sample_launch_overhead(lambda: (measurement.sample(), reps))

    def _probe_compute(self, dtype: str, precision: Precision) -> ProbeResult:
        if self.native is not None and dtype in self.native.SUPPORTED_DTYPES:
            return self._probe_fma(dtype)
        if self.baseline is None:
            raise ValueError("Probes: the compute probe needs the baseline candidate (XLA's dot)")
        size = _compute_size(self.device, dtype)
        problem = MatmulProblem(1, size, size, size, dtype, dtype, dtype, precision=precision)
        args = random_operands(problem, self.jax_device, seed=2)
        dot = self._compute_kernel(problem).fn
        measurement = self._prepare("probe_compute", lambda a, b: dot(a, b, problem), problem, args)
        measurement.output()
        ops = size * size * (2 * size - 1)
        return sample_peak(measurement.sample, ops)

    def _compute_kernel(self, problem: MatmulProblem) -> Candidate:
        key = problem.key()
        return next((c for c in self.quick if c.runs(self.device, key)), self.baseline)

    def _probe_fma(self, dtype: str) -> ProbeResult:
        threads = self.native.max_threads()
        iterations = 1 << 14
        while self.native.fma_peak_sample(dtype, iterations, threads)[0] < PROBE_SAMPLE_SECONDS:
            iterations *= 4
        flops = self.native.fma_peak_sample(dtype, iterations, threads)[1]
        return sample_peak(lambda: self.native.fma_peak_sample(dtype, iterations, threads)[0], flops)

    def _probe_bandwidth(self, size_bytes: int) -> ProbeResult:
        if self.native is not None:
            threads = self.native.max_threads()
            self.native.copy_seconds(size_bytes, threads)  # allocates and touches the buffers
            return sample_peak(lambda: self.native.copy_seconds(size_bytes, threads), 2 * size_bytes)
        elements = size_bytes // 4
        problem = MatmulProblem(1, 1, 1, elements, "float32", "float32", "float32")
        args = random_operands(problem, self.jax_device, seed=3)
        measurement = self._prepare("probe_bandwidth", lambda a, b: a * 2.0, problem, args)
        measurement.output()
        return sample_peak(measurement.sample, 2 * elements * 4)
