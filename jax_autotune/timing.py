"""Timing behind one interface: a ``Timer`` prepares (compiles) a candidate, then samples it.

* ``WallClockTimer`` (CPU, and the GPU fallback): host clock around one executable; for
  small problems the executable repeats the matmul ``reps`` times in a loop, each
  iteration depending on the last, so dispatch is amortised and nothing is hoisted.
* ``DeviceTimer`` (GPU): kernel time on the device through JAX's CUPTI profiler
  (``jax.experimental.mosaic.gpu.profiler.measure``); falls back to the wall clock.
* Tests inject their own ``Timer`` with scripted samples (see tests/fakes.py).

    >>> timer = WallClockTimer()
    >>> measurement = timer.prepare(candidate, problem, (lhs, rhs))
    >>> out = measurement.output()           # also the warm-up
    >>> seconds = measurement.sample()       # one sample, seconds per matmul
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune import counters
from jax_autotune.candidates import Candidate
from jax_autotune.key import MatmulProblem


class Measurement(Protocol):
    def output(self) -> Any:
        """Run once and return the result (a jax or numpy array)."""

    def sample(self) -> float:
        """One timed sample: seconds per matmul."""


class Timer(Protocol):
    name: str

    def prepare(self, candidate: Candidate, problem: MatmulProblem, args: tuple) -> Measurement:
        """Compile ``candidate`` for ``args``; raises what the compiler raises."""


def compile_candidate(candidate: Candidate, problem: MatmulProblem, args: tuple):
    """The candidate's executable for ``args`` (counted in ``stats()['candidate_compiles']``)."""
    compiled = jax.jit(lambda a, b: candidate.fn(a, b, problem)).lower(*args).compile()
    counters.bump("candidate_compiles")
    return compiled


def _block(x):
    return jax.block_until_ready(x)


class _WallClockMeasurement:
    def __init__(self, single, looped, reps: int, args: tuple, clock):
        self.single, self.looped, self.reps, self.args, self.clock = single, looped, reps, args, clock

    def output(self):
        counters.bump("candidate_runs")
        return _block(self.single(*self.args))

    def sample(self) -> float:
        start = self.clock()
        _block(self.looped(*self.args))
        elapsed = self.clock() - start
        counters.bump("candidate_runs", self.reps)
        return elapsed / self.reps


class WallClockTimer:
    """Host clock; repeats small problems inside one executable (about ``target_seconds``
    per sample, at most ``max_reps`` matmuls)."""

    name = "wall_clock"

    def __init__(self, target_seconds: float = 2e-3, max_reps: int = 1000, clock=time.perf_counter):
        self.target_seconds, self.max_reps, self.clock = target_seconds, max_reps, clock

    def prepare(self, candidate: Candidate, problem: MatmulProblem, args: tuple) -> Measurement:
        single = compile_candidate(candidate, problem, args)
        _block(single(*args))  # first run: page-in, thread-pool start
        start = self.clock()
        _block(single(*args))
        once = self.clock() - start
        reps = 1
        if once < self.target_seconds:
            reps = int(min(self.max_reps, math.ceil(self.target_seconds / max(once, 1e-7))))
        looped = single
        if reps > 1:
            looped = _compile_repeated(candidate, problem, args, reps)
        return _WallClockMeasurement(single, looped, reps, args, self.clock)


def _compile_repeated(candidate: Candidate, problem: MatmulProblem, args: tuple, reps: int):
    """One executable running the candidate ``reps`` times; each iteration nudges one lhs
    element by a negligible amount taken from the last output, so XLA cannot hoist the
    matmul out of the loop."""

    def run(lhs, rhs):
        def body(_, carry):
            lhs, out = carry
            nudge = (out.reshape(-1)[0].astype(jnp.float32) * 1e-30).astype(lhs.dtype)
            lhs = lhs.at[(0,) * lhs.ndim].add(nudge)
            return lhs, candidate.fn(lhs, rhs, problem)

        out = candidate.fn(lhs, rhs, problem)
        return lax.fori_loop(1, reps, body, (lhs, out))[1]

    compiled = jax.jit(run).lower(*args).compile()
    counters.bump("candidate_compiles")
    return compiled


class _DeviceMeasurement:
    def __init__(self, compiled, args, measure):
        self.compiled, self.args, self.measure = compiled, args, measure

    def output(self):
        counters.bump("candidate_runs")
        return _block(self.compiled(*self.args))

    def sample(self) -> float:
        counters.bump("candidate_runs")
        _, milliseconds = self.measure(self.compiled)(*self.args)
        return milliseconds * 1e-3


class DeviceTimer:
    """GPU kernel time from JAX's CUPTI profiler; ``available()`` says if it works here."""

    name = "device_cupti"

    def __init__(self):
        from jax.experimental.mosaic.gpu import profiler
        self._profiler = profiler

    def _measure(self, fn):
        try:
            return self._profiler.measure(fn, mode="cupti")
        except TypeError:  # older signature without mode
            return self._profiler.measure(fn)

    def prepare(self, candidate: Candidate, problem: MatmulProblem, args: tuple) -> Measurement:
        compiled = compile_candidate(candidate, problem, args)
        return _DeviceMeasurement(compiled, args, self._measure)


def timer_for(platform: str) -> Timer:
    """The best timer for ``platform``: CUPTI device time on GPU, else the wall clock."""
    if platform in ("gpu", "cuda", "rocm"):
        try:
            return DeviceTimer()
        except Exception:  # noqa: BLE001 - no profiler here: fall back to the host clock
            return WallClockTimer()
    return WallClockTimer()


def random_operands(problem: MatmulProblem, device, seed: int = 0) -> tuple[Any, Any]:
    """Fresh random operands (never zeros) of the problem's stored shapes and dtypes."""
    key_lhs, key_rhs = jax.random.split(jax.random.key(seed))

    def draw(key, shape, dtype):
        dtype = jnp.dtype(dtype)
        if jnp.issubdtype(dtype, jnp.integer):
            values = jax.random.randint(key, shape, 1, 8).astype(dtype)
        elif jnp.issubdtype(dtype, jnp.bool_):
            values = jnp.ones(shape, dtype)
        else:
            values = jax.random.normal(key, shape, jnp.float32).astype(dtype)
        return values

    with jax.default_device(device):
        lhs = jax.jit(draw, static_argnums=(1, 2))(key_lhs, problem.lhs_shape, problem.lhs_dtype)
        rhs = jax.jit(draw, static_argnums=(1, 2))(key_rhs, problem.rhs_shape, problem.rhs_dtype)
    return _block(lhs), _block(rhs)


def as_numpy(x) -> np.ndarray:
    return np.asarray(jax.device_get(x))
