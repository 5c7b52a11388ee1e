"""Timing behind one interface: a ``Timer`` prepares (compiles) a candidate, then samples it.

* ``WallClockTimer`` (CPU, and GPUs without a profiler): host clock around one executable; for
  small problems the executable repeats the matmul ``reps`` times in a loop, each
  iteration depending on the last, so dispatch is amortised and nothing is hoisted.
* ``DeviceTimer`` (GPU): kernel time on the device through JAX's CUPTI profiler
  (``jax.experimental.mosaic.gpu.profiler.measure``); the wall clock where it is missing.
* Tests inject their own ``Timer`` with scripted samples (see tests/fakes.py).

    >>> timer = WallClockTimer()
    >>> measurement = timer.prepare(candidate, problem, (lhs, rhs, *epilogue_operands))
    >>> out = measurement.output()           # also the warm-up
    >>> seconds = measurement.sample()       # one sample, seconds per matmul

A problem with an epilogue is timed as the whole program (the kernel and its epilogue);
where the epilogue reduces, ``output()`` runs the kernel alone (``checked_problem``): a sum
would hide a wrong entry, and the reduction itself is XLA's.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_autotune.dtypes import is_integer
from jax_autotune.tuning import counters, lowering_warnings, xla_priming
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.compile_options import compile_lowered
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.tuning.module_ops import ops
from jax_autotune.tuning.operand_copies import timed
from jax_autotune.problem import MatmulProblem
from jax_autotune.splits import representative_splits


class Measurement(Protocol):
    def output(self) -> Any:
        """Run once and return the result (a jax or numpy array)."""

    def sample(self) -> float:
        """One timed sample: seconds per matmul."""


class Timer(Protocol):
    name: str
    measures_device_time: bool  # True: host work (compiles in other threads) cannot skew it

    def prepare(self, candidate: Candidate, problem: MatmulProblem, args: tuple) -> Measurement:
        """Compile ``candidate`` for ``args`` (copied operands as the program holds them,
        ``operand_copies.held``); raises what the compiler raises."""

    def release(self) -> None:
        """A key's measurements are done: let go of what timing holds on the device."""


# XLA's ragged_dot (chlo) is rewritten into dots that its GEMM autotuner tunes too
_XLA_DOTS = frozenset({"stablehlo.dot_general", "stablehlo.dot", "chlo.ragged_dot", "stablehlo.ragged_dot"})


def runs_kernels_while_compiling(lowered) -> bool:
    """True when compiling ``lowered`` on a GPU runs XLA's GEMM autotuner on the device:
    the module holds an XLA dot op (or a ragged_dot, which XLA rewrites into dots). Pallas kernels are custom calls and hold none (their
    serialized IR names ``dot_general`` in its locations, so the module's text would)."""
    return any(op.name in _XLA_DOTS for op in ops(lowered.compiler_ir("stablehlo")))


def checked_problem(problem: MatmulProblem) -> MatmulProblem:
    """The problem whose output the correctness gate compares: ``problem`` itself (an
    elementwise epilogue is checked entry by entry, fused or not), or the product alone
    when the epilogue reduces (a sum would hide a wrong entry; the reduction is XLA's).

        >>> checked_problem(lm_head_logsumexp).epilogue.is_bare
        True
    """
    return problem.bare() if problem.epilogue.reduces else problem


def _checked_args(problem: MatmulProblem, args: tuple) -> tuple:
    return args[:2] if problem.epilogue.reduces else args


def _check_executable(candidate: Candidate, problem: MatmulProblem, args: tuple):
    """The executable whose output is checked: None when it is the timed one."""
    if not problem.epilogue.reduces:
        return None
    return compile_candidate(candidate, checked_problem(problem), _checked_args(problem, args))


def compile_candidate(candidate: Candidate, problem: MatmulProblem, args: tuple):
    """The candidate's executable for ``args``, copied operands as the program holds them
    (``operand_copies``; counted in ``stats()['candidate_compiles']``)."""
    with lowering_warnings.quiet():
        lowered = jax.jit(timed(candidate.bound(problem), problem)).lower(*args)
    if runs_kernels_while_compiling(lowered):
        # primed: XLA takes the choice it keeps, no kernel runs; else it autotunes
        compiled = xla_priming.compile_primed(lowered, problem, candidate, device_of(args[0]) if args else None)
        if compiled is None:
            with DEVICE_LOCK.exclusive():
                compiled = compile_lowered(lowered)
    else:
        compiled = compile_lowered(lowered)
    counters.bump("candidate_compiles")
    return compiled


def device_of(x):
    """The device a single-device jax array lives on; None for anything else."""
    devices = getattr(x, "devices", None)
    return next(iter(devices())) if devices else None


def _block(x):
    return jax.block_until_ready(x)


class _WallClockMeasurement:
    def __init__(self, looped, reps: int, args: tuple, clock, checked=None, checked_args=()):
        self.looped, self.reps, self.args, self.clock = looped, reps, args, clock
        self.checked, self.checked_args = checked, checked_args

    def output(self):
        counters.bump("candidate_runs")
        if self.checked is not None:
            return _block(self.checked(*self.checked_args))
        return _block(self.looped(*self.args, np.int32(1)))

    def sample(self) -> float:
        return self.time(self.reps) / self.reps

    def time(self, reps: int) -> float:
        start = self.clock()
        _block(self.looped(*self.args, np.int32(reps)))
        counters.bump("candidate_runs", reps)
        return self.clock() - start


class WallClockTimer:
    """Host clock around one executable that runs the candidate ``reps`` times, so that one
    sample lasts about ``target_seconds`` (at most ``max_reps`` matmuls) and dispatch is
    amortised; ``reps`` is calibrated once per candidate from runs of 1 and, when one run
    is shorter than the target, of 16."""

    name = "wall_clock"
    measures_device_time = False

    def __init__(self, target_seconds: float = 2e-3, max_reps: int = 1000, clock=time.perf_counter):
        self.target_seconds, self.max_reps, self.clock = target_seconds, max_reps, clock

    def prepare(self, candidate: Candidate, problem: MatmulProblem, args: tuple) -> Measurement:
        looped = compile_repeated(timed(candidate.bound(problem), problem), args)
        measurement = _WallClockMeasurement(looped, 1, args, self.clock,
                                            _check_executable(candidate, problem, args),
                                            _checked_args(problem, args))
        measurement.time(1)  # first run: page-in, thread-pool start
        once = measurement.time(1)
        if once < self.target_seconds:
            per_rep = max((measurement.time(16) - once) / 15, 1e-8)
            measurement.reps = int(min(self.max_reps, math.ceil(self.target_seconds / per_rep)))
        return measurement

    def release(self) -> None:
        pass


def compile_repeated(fn, args: tuple):
    """``executable(*args, reps)``: ``fn(*args)`` run ``reps`` times in one loop, returning
    the last output. The inputs pass through an optimization barrier in each iteration, so
    XLA cannot hoist the loop-invariant matmul out of the loop, at no runtime cost."""

    def run(*inputs):
        *inputs, reps = inputs

        def body(_, carry):
            inputs, _ = carry
            inputs = lax.optimization_barrier(inputs)
            return inputs, fn(*inputs)

        out = jax.eval_shape(fn, *inputs)
        return lax.fori_loop(0, reps, body, (tuple(inputs), jnp.zeros(out.shape, out.dtype)))[1]

    with lowering_warnings.quiet():
        lowered = jax.jit(run).lower(*args, np.int32(1))
    compiled = compile_lowered(lowered)
    counters.bump("candidate_compiles")
    return compiled


class _DeviceMeasurement:
    reps = 1

    def __init__(self, compiled, args, measure, batch: int, checked=None, checked_args=(), surcharge: float = 0.0):
        self.compiled, self.args, self.measure, self.batch = compiled, args, measure, batch
        self.checked, self.checked_args = checked, checked_args
        self.surcharge = surcharge  # seconds per run the device does not see (host round trips)
        self._buffer: list[float | None] = []

    def output(self):
        counters.bump("candidate_runs")
        with DEVICE_LOCK.shared():
            if self.checked is not None:
                _block(self.compiled(*self.args))  # the timed program's warm-up run
                return _block(self.checked(*self.checked_args))
            return _block(self.compiled(*self.args))

    def sample(self) -> float | None:
        """Device time of one run; None when the profiler saw no kernel.

        Runs are profiled ``batch`` at a time in one CUPTI session and served one by one.
        """
        if not self._buffer:
            counters.bump("candidate_runs", self.batch + 1)  # + the profiler's warm-up run
            with DEVICE_LOCK.exclusive():
                _, milliseconds = self.measure(self.compiled, iterations=self.batch)(*self.args)
            if milliseconds is None:
                milliseconds = [None] * self.batch
            elif not isinstance(milliseconds, (list, tuple)):
                milliseconds = [milliseconds]
            self._buffer = [None if ms is None else ms * 1e-3 + self.surcharge for ms in milliseconds]
        return self._buffer.pop(0)


class DeviceTimer:
    """GPU kernel time on the device from JAX's CUPTI profiler (every kernel the
    executable launches, summed; launch gaps excluded). CUPTI stays attached between the
    measurements of one key, and runs are profiled ``batch`` at a time; ``release()``
    detaches it, so that no program of the user's runs, and no CUDA graph of theirs is
    destroyed, while CUPTI is attached (XLA itself runs no CUDA graph under a profiler)."""

    name = "device_cupti"
    measures_device_time = True  # host load (e.g. compiles in other threads) does not skew it

    def __init__(self, batch: int = 12):
        from jax.experimental.mosaic.gpu import profiler
        self.batch = batch
        try:
            self._attach = profiler.Cupti(finalize=False).measure
            self._detach = profiler.Cupti(finalize=True).measure
        except (AttributeError, TypeError):  # no Cupti class: one session per call
            self._attach = self._detach = profiler.measure
        self._attached = False  # measured since the last detach (keys may be tuned two at once)
        self._round_trip: float | None = None

    def prepare(self, candidate: Candidate, problem: MatmulProblem, args: tuple) -> Measurement:
        compiled = compile_candidate(candidate, problem, args)
        # a candidate that waits on the host (``host_syncs`` per call) is charged the round
        # trips its device time does not show; a grouped problem's run calls it once per split
        syncs = candidate.params.get("host_syncs", 0) * (args[2].shape[0] if problem.groups else 1)
        return _DeviceMeasurement(compiled, args, self._measure, self.batch,
                                  _check_executable(candidate, problem, args),
                                  _checked_args(problem, args), syncs * self.host_round_trip() if syncs else 0.0)

    def host_round_trip(self) -> float:
        """Seconds the host waits for a one-element result: a launch, the copy back and the
        wait (median of 20 after a warm-up; measured once per timer)."""
        if self._round_trip is None:
            x = jnp.zeros((1,), jnp.float32)
            with DEVICE_LOCK.exclusive():
                np.asarray(_noop_program()(x))
                samples = []
                for _ in range(20):
                    start = time.perf_counter()
                    np.asarray(_noop_program()(x))
                    samples.append(time.perf_counter() - start)
            self._round_trip = float(np.median(samples))
        return self._round_trip

    def _measure(self, compiled, iterations: int):
        """CUPTI's measurement of ``compiled`` (called with the device lock held)."""
        self._attached = True
        return self._attach(compiled, iterations=iterations)

    def release(self) -> None:
        """Detach CUPTI if anything was measured since it was last detached: one more
        profiled run of a one-element program, that finalizes."""
        with DEVICE_LOCK.exclusive():
            if self._attached:
                self._detach(_noop_program())(np.zeros(1, np.float32))
                self._attached = False


@functools.lru_cache(maxsize=1)
def _noop_program():
    return compile_lowered(jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((1,), jnp.float32)))


def program_seconds(timer: Timer, compiled, args: tuple, runs: int = 10) -> float:
    """Median seconds of ``compiled(*args)`` (after a warm-up run) by ``timer``'s clock:
    the kernels' device time under CUPTI where ``timer`` is a ``DeviceTimer`` (the device
    held alone), else the wall clock around each run, waited for. For a whole program a
    tuning compares as it stands (``jax_autotune.attention_tuning``), not a candidate.

        >>> program_seconds(tuner.timer, jax.jit(f).lower(x).compile(), (x,))
    """
    _block(compiled(*args))
    if isinstance(timer, DeviceTimer):
        with DEVICE_LOCK.exclusive():
            _, milliseconds = timer._measure(compiled, iterations=runs)(*args)
        if isinstance(milliseconds, (list, tuple)) and all(ms is not None for ms in milliseconds):
            return float(np.median(milliseconds)) * 1e-3
        if isinstance(milliseconds, (int, float)):
            return float(milliseconds) * 1e-3
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        _block(compiled(*args))
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def timer_for(platform: str) -> Timer:
    """The best timer for ``platform``: CUPTI device time on GPU, else the wall clock."""
    if platform in ("gpu", "cuda", "rocm"):
        try:
            return DeviceTimer()
        except Exception:  # noqa: BLE001 - no profiler here: the host clock
            return WallClockTimer()
    return WallClockTimer()


RANDOM_PERIOD = 1_048_573  # a prime: operands larger than this repeat a random block


def _host_draw(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = jnp.dtype(dtype)
    size = min(math.prod(shape), RANDOM_PERIOD)
    if is_integer(dtype):
        block = rng.integers(1, 8, size).astype(dtype)
    elif dtype == np.bool_:
        block = np.ones(size, dtype)
    else:
        block = rng.standard_normal(size, np.float32).astype(dtype)
    return np.resize(block, shape)


def random_operands(problem: MatmulProblem, device, seed: int = 0) -> tuple[Any, ...]:
    """Fresh random inputs (never zeros) of the problem's stored shapes and dtypes: lhs,
    rhs and the epilogue's operands (``problem.input_specs()``).

    Drawn on the host, so nothing is compiled: up to ``RANDOM_PERIOD`` elements are
    independent draws; a larger operand repeats that block, and since the period is prime
    every row still starts at a different point of it. A grouped matmul's group sizes are
    not random: they are the representative splits (``jax_autotune.splits``).
    """
    rng = np.random.default_rng(seed)
    specs = problem.input_specs()
    drawn = [representative_splits(problem.ragged_rows, problem.groups) if problem.groups and i == 2
             else _host_draw(rng, shape, dtype) for i, (shape, dtype) in enumerate(specs)]  # [2]: group sizes
    return tuple(_block(jax.device_put(x, device)) for x in drawn)


def as_numpy(x) -> np.ndarray:
    return np.asarray(jax.device_get(x))
