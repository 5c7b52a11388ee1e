"""Roofline bounds: how fast is fast enough for a problem on this device.

Work: ops = batch*m*n*(2k-1) (k multiplies and k-1 adds per output), bytes = both
inputs read once + the output written once (with an epilogue: its operands read too, and
its result written instead of the product). With measured peaks (see ``probes``):

    limit = max(ops / compute_peak, bytes / bandwidth) / threshold + launch_overhead

Thresholds by level: minimal 0.6, balanced 0.8, extensive 0.95, full: no bound (no
short-circuit). A candidate landing twice inside the limit ends the tuning.

    >>> bounds = roofline_bounds(problem, peaks, level="balanced")
    >>> bounds.limit
    0.000300281
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jax_autotune.key import Level
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.rules import DEFAULT_RULES, TuningRules


@dataclasses.dataclass(frozen=True)
class Work:
    ops: int
    bytes: int

    @classmethod
    def of(cls, problem: MatmulProblem) -> "Work":
        b, m, n, k = problem.batch, problem.m, problem.n, problem.k
        ops = b * m * n * (2 * k - 1)
        size = lambda dtype: np.dtype(dtype).itemsize  # noqa: E731
        moved = sum(math.prod(shape) * size(dtype) for shape, dtype in problem.input_specs())
        moved += math.prod(problem.result_shape) * size(problem.result_dtype)
        return cls(ops, moved)


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Measured device peaks for one problem: compute (op/s), bandwidth (B/s), launch (s)."""

    compute: float
    bandwidth: float
    launch_overhead: float


@dataclasses.dataclass(frozen=True)
class Bounds:
    work: Work
    peaks: Peaks
    threshold: float | None
    compute_seconds: float
    memory_seconds: float
    limit: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.work.ops, "bytes": self.work.bytes,
            "compute_peak": self.peaks.compute, "bandwidth_peak": self.peaks.bandwidth,
            "launch_overhead": self.peaks.launch_overhead, "threshold": self.threshold,
            "compute_seconds": self.compute_seconds, "memory_seconds": self.memory_seconds,
            "limit": self.limit,
        }


def roofline_bounds(problem: MatmulProblem, peaks: Peaks, level: Level | str,
                    rules: TuningRules = DEFAULT_RULES) -> Bounds:
    work = Work.of(problem)
    threshold = rules.threshold(level)
    compute_s = work.ops / peaks.compute
    memory_s = work.bytes / peaks.bandwidth
    limit = None
    if threshold is not None:
        limit = max(compute_s, memory_s) / threshold + peaks.launch_overhead
    return Bounds(work, peaks, threshold, compute_s, memory_s, limit)
