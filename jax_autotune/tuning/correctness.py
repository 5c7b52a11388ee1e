"""Correctness gating: every candidate's output is compared with a reference first.

The reference is exact and computed on the host: the whole float64 result for CPU
problems up to ``HOST_REFERENCE_MAX_MACS`` multiply-adds; else (and on accelerators) a
``SampledReference``, the float64 values at up to 4 x 64 x 64 entries of the output,
edge rows and columns included. A sampled check also compares the whole output with
XLA's dot once that one has passed, so no part of the output goes unchecked.
The error is norm-wise: ``||out - ref|| / ||ref||``; NaN or Inf never passes. Integer
results are compared exactly, with the output dtype's wraparound (the int64 reference cast
to it, as int8 x int8 -> int8 wraps); complex ones in complex128. A problem with an
elementwise epilogue is checked as its whole context: the epilogue runs in float64 on the
exact product (``Epilogue.reference``) and, sampled, on the sampled entries and operands.
A grouped matmul (``lax.ragged_dot``) is checked group by group on every tuning split
(``GroupedReference``): each group within the tolerance on its own, and the rows in no
group (and the results of empty groups) exactly zero, as lax gives them.

    >>> ref = reference(problem, lhs, rhs)
    >>> check(out, ref, problem)
    Check(ok=True, rel_error=3.1e-07, tolerance=2e-05)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_autotune.dtypes import is_complex, is_integer
from jax_autotune.key import Precision
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.compile_options import compile_lowered
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.tuning.timing import as_numpy, device_of

HOST_REFERENCE_MAX_MACS = 2**31

# tolerance by input dtype at each precision (norm-wise relative error)
_INPUT_TOLERANCE = {
    "float64": {Precision.DEFAULT: 1e-10, Precision.HIGH: 1e-10, Precision.HIGHEST: 1e-10},
    # f32 DEFAULT and HIGH may use TF32 / bf16x3 on GPUs, as XLA does
    "float32": {Precision.DEFAULT: 5e-3, Precision.HIGH: 5e-3, Precision.HIGHEST: 3e-5},
    "float16": dict.fromkeys(Precision, 1e-2),
    "bfloat16": dict.fromkeys(Precision, 3e-2),
}
# rounding of the result alone
_OUTPUT_TOLERANCE = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
_DEFAULT_FLOAT_TOLERANCE = 3e-2  # float8 and other narrow types
_REAL_PART = {"complex64": "float32", "complex128": "float64"}  # complex: its parts' tolerance


def tolerance(problem: MatmulProblem, platform: str = "gpu") -> float:
    """Allowed norm-wise relative error; 0 for integer results of integer inputs (exact).

    On the CPU, f32 at every precision is full fp32 (XLA:CPU has no TF32), so it gets
    the HIGHEST tolerance there.
    """
    outs = {_REAL_PART.get(d, d) for d in (problem.out_dtype, problem.result_dtype)}
    by_output = max(0.0 if is_integer(out) else _OUTPUT_TOLERANCE.get(out, _DEFAULT_FLOAT_TOLERANCE)
                    for out in outs)
    if _integer(problem):
        return by_output
    precision = Precision.HIGHEST if platform == "cpu" else problem.precision
    by_input = max(_INPUT_TOLERANCE.get(_REAL_PART.get(d, d), {}).get(precision, _DEFAULT_FLOAT_TOLERANCE)
                   for d in (problem.lhs_dtype, problem.rhs_dtype))
    return max(by_input, by_output)


def input_tolerance(dtype: str, platform: str = "gpu") -> float:
    """The norm-wise tolerance of a float computation on ``dtype`` inputs at the default
    precision (f32 may run as TF32 on GPUs), as ``tolerance`` gives a matmul's.

        >>> input_tolerance("bfloat16")
        0.03
    """
    precision = Precision.HIGHEST if platform == "cpu" else Precision.DEFAULT
    return _INPUT_TOLERANCE.get(_REAL_PART.get(dtype, dtype), {}).get(precision, _DEFAULT_FLOAT_TOLERANCE)


def relative_error(out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64 on the host; inf where ``out`` is not finite.

        >>> relative_error(np.ones(4), np.ones(4))
        0.0
    """
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return math.inf
    return _relative(float(np.linalg.norm((out - ref).ravel())), float(np.linalg.norm(ref.ravel())))


def _integer(problem: MatmulProblem) -> bool:
    return all(is_integer(d) for d in (problem.lhs_dtype, problem.rhs_dtype))


def _complex(problem: MatmulProblem) -> bool:
    return any(is_complex(d) for d in (problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype))


def _wide(problem: MatmulProblem):
    """The exact host type of the problem's operands: int64, complex128 or float64."""
    return np.int64 if _integer(problem) else np.complex128 if _complex(problem) else np.float64


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    rel_error: float
    tolerance: float


SAMPLE_SIZE = 64  # rows and columns of the output a sampled reference computes exactly
SAMPLE_BATCHES = 4
_SAMPLE_EDGE = 4  # first and last rows / columns always in the sample (partial tiles)


@dataclasses.dataclass(frozen=True, eq=False)
class SampledReference:
    """Exact (float64) values of the output at batches x rows x columns of it.

    Edge rows and columns (where partial tiles and masks live) are always sampled; the
    rest of the output is covered by comparing with XLA's dot once that has passed
    (``check(..., trusted=...)``).
    """

    batches: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray  # (len(batches), len(rows), len(cols)), float64, complex128 or int64


def _sample(size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    if size <= count:
        return np.arange(size)
    edge = max(1, min(_SAMPLE_EDGE, count // 4))
    edges = np.r_[0:edge, size - edge:size]
    middle = rng.choice(np.arange(edge, size - edge), count - edges.size, replace=False)
    return np.sort(np.r_[edges, middle])


def _wide_operands(problem: MatmulProblem, lhs, rhs, batches=None, rows=None, cols=None):
    """Host (batch, m, k) and (batch, k, n) copies in ``_wide(problem)``, of the given
    batches, lhs rows and rhs columns only when those are given."""
    wide = _wide(problem)
    a, b = as_numpy(lhs), as_numpy(rhs)
    if batches is not None:
        a, b = a[batches], b[batches]
    a = np.swapaxes(a, -1, -2) if problem.transpose_a else a
    b = np.swapaxes(b, -1, -2) if problem.transpose_b else b
    if rows is not None:
        a, b = a[:, rows, :], b[:, :, cols]
    return a.astype(wide), b.astype(wide)


@dataclasses.dataclass(frozen=True, eq=False)
class GroupedReference:
    """Exact values of a grouped matmul's outputs on its tuning splits, group by group.

    ``flat``: the entries checked, as flat indices into the outputs (shape ``shape``:
    (splits, *problem.out_shape)), piece after piece; ``pieces``: each piece's exact values
    (their count of ``flat``'s entries) and whether they must be exactly zero. A piece is a
    group's (sampled) rows, or the rows in no group, for a ragged m; a group for a ragged k.
    """

    shape: tuple[int, ...]
    flat: np.ndarray
    pieces: tuple[tuple[np.ndarray, bool], ...]


def _grouped_reference(problem: MatmulProblem, lhs, rhs, splits, *operands, host_max_macs: int,
                       seed: int) -> GroupedReference:
    wide = _wide(problem)
    a, b = as_numpy(lhs), as_numpy(rhs)  # as stored: only the entries used are widened
    a = a.T if problem.transpose_a else a  # (m, k)
    b = np.swapaxes(b, -1, -2) if problem.transpose_b else b  # (k, n) or (groups, k, n)
    cast = (lambda x: x.astype(problem.out_dtype)) if is_integer(problem.out_dtype) else (lambda x: x)
    rng = np.random.default_rng(seed)
    sample = problem.m * problem.n * problem.k > host_max_macs and not _integer(problem)
    sizes_per_split = np.asarray(as_numpy(splits), np.int64)
    shape = (len(sizes_per_split), *problem.out_shape)
    rows = problem.ragged_rows
    every = lambda size: _sample(size, SAMPLE_SIZE, rng) if sample else np.arange(size)  # noqa: E731
    host = [as_numpy(x) for x in operands]  # the epilogue's, in their role shapes over (m, n)
    flat, pieces = [], []

    def piece(index, exact, zero=False):
        flat.append(np.ravel_multi_index(np.broadcast_arrays(*index), shape).ravel())
        pieces.append((exact, zero))

    def in_context(exact, picked, cols):
        """A ragged m's exact rows ``picked`` x ``cols`` through the epilogue (float64)."""
        if problem.epilogue.is_bare:
            return cast(exact)
        sampled = [{"scalar": lambda x: x, "row": lambda x: x[cols], "col": lambda x: x[picked],
                    "full": lambda x: x[picked][:, cols]}[o.role](x) for o, x in zip(problem.epilogue.operands, host)]
        return problem.epilogue.reference(exact, sampled)
    for s, sizes in enumerate(sizes_per_split):
        ends = np.minimum(np.cumsum(sizes), rows)
        starts = np.concatenate([[0], ends[:-1]])
        cols = every(problem.n)
        for g, (start, end) in enumerate(zip(starts, ends)):
            if problem.ragged == "m":
                if end <= start:
                    continue  # an empty group has no rows to check
                picked = start + every(end - start)
                exact = a[picked].astype(wide) @ b[g][:, cols].astype(wide)
                piece((s, picked[:, None], cols[None, :]), in_context(exact, picked, cols))
            else:
                picked = every(problem.m)
                exact = a[picked, start:end].astype(wide) @ b[start:end][:, cols].astype(wide)
                piece((s, g, picked[:, None], cols[None, :]), cast(exact), end <= start)
        if problem.ragged == "m" and ends[-1] < rows:  # rows in no group: zero (then the epilogue)
            left = ends[-1] + every(rows - ends[-1])
            piece((s, left[:, None], cols[None, :]), in_context(np.zeros((left.size, cols.size)), left, cols),
                  problem.epilogue.is_bare)
    return GroupedReference(shape, np.concatenate(flat) if flat else np.zeros(0, np.int64), tuple(pieces))


@functools.lru_cache(maxsize=64)
def _compiled_entries(shape: tuple, dtype: str, count: int, device):
    def entries(out, flat):
        return jnp.all(jnp.isfinite(out)), out.reshape(-1)[flat]
    with jax.default_device(device):
        return compile_lowered(jax.jit(entries).lower(jax.ShapeDtypeStruct(shape, dtype),
                                                      jax.ShapeDtypeStruct((count,), jnp.int32)))


def _grouped_entries(out, flat: np.ndarray) -> tuple[bool, np.ndarray]:
    """Whether all of ``out`` is finite and its entries at ``flat``, gathered where ``out``
    lives (an MoE's outputs on two splits run to gigabytes: only the entries travel)."""
    if isinstance(out, jax.Array) and out.size < 2**31 and not is_integer(out.dtype):
        summary = _compiled_entries(tuple(out.shape), str(out.dtype), flat.size, device_of(out))
        with DEVICE_LOCK.shared():
            finite, values = jax.device_get(summary(out, flat.astype(np.int32)))
        return bool(finite), np.asarray(values)
    host = as_numpy(out)
    finite = is_integer(host.dtype) or bool(np.all(np.isfinite(host.astype(
        np.complex128 if np.iscomplexobj(host) else np.float64))))
    return finite, host.reshape(-1)[flat]


def _check_grouped(out, ref: GroupedReference, tol: float) -> Check:
    if tuple(out.shape) != ref.shape:
        return Check(False, float("inf"), tol)
    finite, got_all = _grouped_entries(out, ref.flat)
    if not finite:
        return Check(False, float("nan"), tol)
    got_all = got_all.astype(np.complex128 if np.iscomplexobj(got_all) else np.float64)
    worst, ok, offset = 0.0, True, 0
    for exact, zero in ref.pieces:
        got = got_all[offset:offset + exact.size].reshape(exact.shape)
        offset += exact.size
        if zero:
            error = 0.0 if not np.any(got) else float("inf")
        else:
            error = _relative(float(np.linalg.norm((got - exact).ravel())), float(np.linalg.norm(exact.ravel())))
        worst = max(worst, error)
        ok = ok and error <= tol
    return Check(ok, worst, tol)


def reference(problem: MatmulProblem, lhs, rhs, *operands, host_max_macs: int = HOST_REFERENCE_MAX_MACS,
              seed: int = 0):
    """The exact result of the problem, computed on the host: a float64 (complex128 for
    complex, int64 for integers, cast to an integer output dtype with its wraparound)
    numpy array for problems up to ``host_max_macs`` multiply-adds, else a
    ``SampledReference`` (at most 4 x 64 x 64 entries). Accelerators pass
    ``host_max_macs=0``: no device compile, a few milliseconds on the host. An elementwise
    epilogue is applied in float64 with ``operands`` (those of ``problem.input_specs()``).
    """
    epilogue = problem.epilogue
    if not epilogue.elementwise:
        raise ValueError(f"reference: the epilogue {epilogue} reduces; check its product alone")
    if problem.groups:  # operands: the group sizes of the tuning splits
        return _grouped_reference(problem, lhs, rhs, *operands, host_max_macs=max(host_max_macs, 2**26),
                                  seed=seed)
    macs = problem.batch * problem.m * problem.n * problem.k
    host = [as_numpy(x) for x in operands]
    if macs <= host_max_macs or _integer(problem):  # integers: exact, compared whole
        a, b = _wide_operands(problem, lhs, rhs)
        exact = np.matmul(a, b)
        exact = exact.astype(problem.out_dtype) if is_integer(problem.out_dtype) else exact
        return exact if epilogue.is_bare else epilogue.reference(exact, host)
    rng = np.random.default_rng(seed)
    batches = _sample(problem.batch, SAMPLE_BATCHES, rng)
    rows, cols = _sample(problem.m, SAMPLE_SIZE, rng), _sample(problem.n, SAMPLE_SIZE, rng)
    a, b = _wide_operands(problem, lhs, rhs, batches, rows, cols)
    values = np.matmul(a, b)
    if not epilogue.is_bare:
        sampled = [{"scalar": lambda x: x, "row": lambda x: x[cols],
                    "col": lambda x: x[batches][:, rows],
                    "full": lambda x: x[batches][:, rows][:, :, cols]}[o.role](x)
                   for o, x in zip(epilogue.operands, host)]
        values = epilogue.reference(values, sampled)
    return SampledReference(batches, rows, cols, values)


def _device_summary(out, trusted, batches, rows, cols):
    """The sampled entries of ``out``, ||out - trusted||, ||trusted|| and whether all of
    ``out`` is finite, computed where ``out`` lives."""
    dtype = jnp.complex64 if is_complex(out.dtype) else jnp.float32
    wide = out.astype(dtype)
    picked = wide[batches][:, rows][:, :, cols]
    diff = wide - trusted.astype(dtype)
    return (picked, jnp.linalg.norm(diff.ravel()), jnp.linalg.norm(trusted.astype(dtype).ravel()),
            jnp.all(jnp.isfinite(wide)))


@functools.lru_cache(maxsize=64)
def _compiled_summary(shape: tuple, dtype: str, sample: tuple, device):
    index = [jax.ShapeDtypeStruct((n,), jnp.int32) for n in sample]
    out = jax.ShapeDtypeStruct(shape, dtype)
    with jax.default_device(device):
        return compile_lowered(jax.jit(_device_summary).lower(out, out, *index))


def _summary_for(ref: SampledReference, out):
    return _compiled_summary(tuple(out.shape), str(out.dtype),
                             (ref.batches.size, ref.rows.size, ref.cols.size), device_of(out))


def prepare_check(problem: MatmulProblem, ref, device) -> None:
    """Compile the comparison of ``problem``'s outputs on ``device`` ahead of the first
    ``check`` (the tuner does it while XLA's dot compiles); nothing to do for full refs."""
    if isinstance(ref, SampledReference):
        _compiled_summary(problem.result_shape, problem.result_dtype,
                          (ref.batches.size, ref.rows.size, ref.cols.size), device)


def check(out, ref, problem: MatmulProblem, platform: str = "gpu", trusted=None) -> Check:
    """Compare a candidate's output with the reference under the problem's tolerance.

    With a ``SampledReference``, the sampled entries are compared with the exact values
    and, when ``trusted`` (an output that passed, XLA's dot's) is given, the whole output
    with it; the error is the larger of the two. A full reference is compared whole.
    """
    tol = tolerance(problem, platform)
    if isinstance(ref, GroupedReference):
        return _check_grouped(out, ref, tol)
    expected_shape = problem.result_shape if isinstance(ref, SampledReference) else ref.shape
    if tuple(out.shape) != tuple(expected_shape):
        return Check(False, float("inf"), tol)
    if isinstance(ref, SampledReference):
        if not isinstance(out, jax.Array):
            out = jnp.asarray(out)
        summary = _summary_for(ref, out)
        with DEVICE_LOCK.shared():
            picked, diff, scale, finite = jax.device_get(summary(
                out, out if trusted is None else trusted, ref.batches.astype(np.int32),
                ref.rows.astype(np.int32), ref.cols.astype(np.int32)))
        got, expected = np.asarray(picked, ref.values.dtype), ref.values
        finite = bool(finite)
        rel = _relative(float(np.linalg.norm((got - expected).ravel())),
                        float(np.linalg.norm(expected.ravel())))
        if trusted is not None:
            rel = max(rel, _relative(float(diff), float(scale)))
    else:
        # compared in complex128 or float64 (exact for integers below 2**53: no wraparound
        # in the difference itself)
        wide = np.complex128 if np.iscomplexobj(ref) or np.iscomplexobj(out) else np.float64
        got, expected = as_numpy(out).astype(wide), ref.astype(wide)
        finite = bool(np.all(np.isfinite(got)))
        rel = _relative(float(np.linalg.norm((got - expected).ravel())),
                        float(np.linalg.norm(expected.ravel())))
    if not finite:
        return Check(False, float("nan"), tol)
    return Check(rel <= tol, rel, tol)


def _relative(diff: float, scale: float) -> float:
    return diff / scale if scale > 0 else diff
