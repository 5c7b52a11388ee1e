"""cuBLAS's grouped GEMM (kernels/gpu/cublas_grouped.py, ffi/cublas_grouped.cc) as a grouped
candidate: which keys it runs for, the handler's attribute checks, the wrapper's errors, the
library search, the host round trip charged to its time; on a GPU, every group against
float64 (empty groups, rows in no group, sums above and below the rows)."""

import ctypes.util
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_autotune.kernels import ragged
from jax_autotune.kernels.gpu import cublas_grouped, cuda_libraries
from jax_autotune.problem import MatmulProblem
from jax_autotune.splits import representative_splits
from jax_autotune.tuning import timing
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.plan import DEMOTED, make_plan
from group_trials import split_sizes
from numerics import KERNEL_TOLERANCES, rel_error

H200 = DeviceInfo("gpu", "NVIDIA H200", 143_771 * 2**20, (9, 0))
A100 = DeviceInfo("gpu", "NVIDIA A100-SXM4-80GB", 80 * 2**30, (8, 0))
CPU = DeviceInfo("cpu", "cpu")
NAME = ragged.CUBLAS_GROUPED.name


def _forward(m=1000, k=96, n=64, groups=4, dtype="bfloat16", out=None, **kw):
    return MatmulProblem(1, m, n, k, dtype, dtype, out or dtype, groups=groups, ragged="m", **kw)


def _weight_gradient(m=64, n=96, k=1000, groups=4, dtype="bfloat16", out=None, **kw):
    kw.setdefault("transpose_a", True)
    return MatmulProblem(1, m, n, k, dtype, dtype, out or dtype, groups=groups, ragged="k", **kw)


def _runs(device, problem) -> bool:
    return ragged.CUBLAS_GROUPED.runs(device, problem.key())


def test_the_gpu_set_holds_it_and_the_cpu_set_never():
    assert NAME in ragged.ragged_candidate_set(H200).names()
    assert NAME not in ragged.ragged_candidate_set(CPU).names()


def test_it_runs_for_the_stored_layouts_and_dtypes_cublas_takes(monkeypatch):
    monkeypatch.setattr(cublas_grouped, "available", lambda: True)
    for problem in (_forward(), _forward(transpose_b=True), _forward(dtype="float16"),
                    _forward(dtype="float32"), _weight_gradient(), _weight_gradient(dtype="float32")):
        assert _runs(H200, problem) and _runs(A100, problem), problem
    for problem in (_weight_gradient(transpose_b=True),          # rhs stored (n, k)
                    _weight_gradient(transpose_a=False),         # lhs stored (m, k)
                    _forward(dtype="bfloat16", out="float32"),   # cuBLAS's grouped GEMM: one dtype
                    _weight_gradient(out="float32"),
                    MatmulProblem(1, 1000, 64, 96, "bfloat16", "float32", "float32", groups=4, ragged="m")):
        assert not _runs(H200, problem), problem
    assert not _runs(CPU, _forward())
    monkeypatch.setattr(cublas_grouped, "available", lambda: False)
    assert not _runs(H200, _forward())


def test_on_a_gpu_it_competes_in_the_first_round_beside_the_mosaic_kernels(monkeypatch):
    monkeypatch.setattr(cublas_grouped, "available", lambda: True)
    mixtral = _forward(8192, 4096, 14336, 8)
    rounds = [r for r in make_plan(ragged.ragged_candidate_set(H200), mixtral.key(), H200).rounds
              if r.group != DEMOTED]
    first = {c.name for c in rounds[0].candidates}
    assert NAME in first and {c.name for c in ragged.MOSAIC_GROUPED} & first
    monkeypatch.setattr(cublas_grouped, "available", lambda: False)
    rounds = make_plan(ragged.ragged_candidate_set(H200), mixtral.key(), H200).rounds
    assert all(NAME not in {c.name for c in r.candidates} for r in rounds if r.group != DEMOTED)


def test_a_problem_the_kernel_does_not_take_runs_xla_s_ragged_dot():
    problem = _weight_gradient(transpose_b=True)  # rhs stored (n, k)
    lhs = jax.random.normal(jax.random.key(0), problem.lhs_shape, jnp.float32).astype(jnp.bfloat16)
    rhs = jax.random.normal(jax.random.key(1), problem.rhs_shape, jnp.float32).astype(jnp.bfloat16)
    sizes = jnp.asarray([300, 0, 500, 150], jnp.int32)
    got = jax.jit(ragged.served(ragged.CUBLAS_GROUPED, problem))(lhs, rhs, sizes)
    want = ragged.xla_ragged_one(lhs, rhs, sizes, problem)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_the_handler_refuses_bad_attributes_before_touching_anything():
    native = pytest.importorskip("jax_autotune._native")
    error = native.cublas_grouped_attribute_error
    assert error(False, 0, 1, 0) == "" and error(True, 1, 0, 1) == ""
    assert "attribute ragged_k must be 0 or 1, got 2" in error(False, 2, 0, 0)
    assert "attribute transpose_b must be 0 with ragged_k 1, got 1" in error(False, 1, 1, 0)
    assert "attribute tf32 must be 0 (TF32 is for float32 operands), got 1" in error(False, 0, 0, 1)
    assert "jax_autotune_cublas_grouped" in error(True, 0, 0, 5)


def test_a_library_that_is_not_there_is_a_reason_not_a_crash():
    native = pytest.importorskip("jax_autotune._native")
    assert native.load_cublas_grouped("/no/such/libcublas.so.13", "/no/such/libcuda.so.1").startswith("dlopen failed")
    libc = ctypes.util.find_library("c")  # a library that loads but is neither
    assert native.load_cublas_grouped(libc, "/no/such/libcuda.so.1").startswith("dlopen failed: /no/such/libcuda")
    assert native.load_cublas_grouped(libc, libc).startswith("not a cuBLAS with a grouped GEMM")
    assert native.cublas_grouped_library() == ""


@pytest.mark.parametrize("call,match", [
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w, s, ragged="n"), "ragged: expected 'm' or 'k'"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w.astype(jnp.float16), s), "dtypes differ"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x.astype(jnp.int8), w.astype(jnp.int8), s), "operands must be"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w, s, out_dtype=jnp.float32), "out_dtype"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w[:, :5], s), r"lhs \(m, k\) and rhs \(groups, k, n\)"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w, s[:3]), r"group_sizes must be \(4,\) integers"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w, s.astype(jnp.float32)), "group_sizes"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, w[0], s, ragged="k"), r"ragged k takes lhs \(k, m\)"),
    (lambda x, w, s: cublas_grouped.grouped_matmul(x, x, s, ragged="k", transpose_rhs=True), "no transpose_rhs"),
])
def test_bad_arguments_raise_naming_the_argument(call, match):
    x, w, sizes = jnp.ones((10, 8), jnp.bfloat16), jnp.ones((4, 8, 6), jnp.bfloat16), jnp.ones((4,), jnp.int32)
    with pytest.raises(ValueError, match=match):
        call(x, w, sizes)


def test_the_library_search_tells_cublas_from_cublaslt_and_takes_the_driver_only_as_mapped(monkeypatch, tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 0 fd:01 1 /opt/xla/nvidia/cu13/lib/libcublasLt.so.13\n"
                    "7f10-7f20 r-xp 0 fd:01 2 /opt/xla/nvidia/cu13/lib/libcublas.so.13\n"
                    "7f20-7f30 r-xp 0 fd:01 3 /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **kw: real_open(
        maps if path == "/proc/self/maps" else path, *a, **kw))
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    wheel.mkdir(parents=True)
    for name in ("libcublas.so.13", "libcublasLt.so.13", "libcuda.so.1"):
        (wheel / name).write_bytes(b"\x7fELF not really")
    monkeypatch.setattr(cuda_libraries, "site_packages", lambda: [str(tmp_path / "site")])
    assert cuda_libraries.sources("libcublas.so") == [
        ("/opt/xla/nvidia/cu13/lib/libcublas.so.13", cuda_libraries.MAPPED),
        (str(wheel / "libcublas.so.13"), cuda_libraries.WHEEL)]
    assert cuda_libraries.sources("libcuda.so", wheels=False) == [
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", cuda_libraries.MAPPED)]


def test_deserialize_loads_cublas_too_where_a_gpu_is(monkeypatch):
    """An artifact that keeps jax_autotune_cublas_grouped (allow_targets) runs in a fresh
    process: jat.deserialize loads cuBLAS as it loads cuBLASLt."""
    import types
    import jax_autotune as jat
    from jax_autotune import serving
    loaded = []
    monkeypatch.setattr(serving.cublaslt, "available", lambda: loaded.append("cublaslt") or True)
    monkeypatch.setattr(serving.cublas_grouped, "available", lambda: loaded.append("cublas_grouped") or True)
    monkeypatch.setattr(serving.jax, "devices", lambda: [types.SimpleNamespace(platform="gpu")])
    monkeypatch.setattr(serving.jax.export, "deserialize", lambda blob: ("deserialized", bytes(blob)))
    assert jat.deserialize(b"artifact") == ("deserialized", b"artifact")
    assert loaded == ["cublaslt", "cublas_grouped"]


def test_explain_says_which_cublas_this_process_loaded(fresh_tuning):
    from jax_autotune.cli.table import explain_lines
    from jax_autotune.tuning.decision import CandidateResult, Decision
    problem = _forward()
    decision = Decision(key=problem.key(), problem=problem, winner=NAME,
                        results=(CandidateResult(NAME, "ok", score=1e-5),))
    lines = explain_lines("gpu-H200-mem139", decision)
    assert "cublas     not loaded: no CUDA device in this process" in lines  # on this CPU host
    assert not any(line.startswith("cublas ") for line in explain_lines(
        "gpu-H200-mem139", Decision(key=problem.key(), problem=problem, winner="xla_ragged_dot", results=())))


class _Candidate:
    def __init__(self, **params):
        self.params = params


def test_its_time_is_charged_the_host_round_trip_of_each_call(monkeypatch):
    """Device time does not see the host waiting for the group sizes: each sample of a
    host-synchronizing candidate carries the round trip once per call (per split)."""
    timer = object.__new__(timing.DeviceTimer)
    timer.batch, timer._round_trip, timer._attached = 3, 2.5e-5, False
    timer._measure = lambda compiled, iterations: (lambda *args: (None, [0.1] * iterations))
    monkeypatch.setattr(timing, "compile_candidate", lambda candidate, problem, args: "compiled")
    monkeypatch.setattr(timing, "_check_executable", lambda candidate, problem, args: None)
    problem = _forward()
    args = (None, None, jnp.zeros((2, 4), jnp.int32))  # two representative splits
    syncing = timer.prepare(_Candidate(host_syncs=1), problem, args)
    plain = timer.prepare(_Candidate(), problem, args)
    assert [syncing.sample() for _ in range(3)] == pytest.approx([1e-4 + 2 * 2.5e-5] * 3)
    assert [plain.sample() for _ in range(3)] == pytest.approx([1e-4] * 3)


# ---------------------------------------------------------------- GPU

def _gpu_available() -> bool:
    return any(d.platform == "gpu" for d in jax.devices()) and cublas_grouped.available()


def _float64_per_group(lhs, rhs, sizes, ragged_dim, transpose_rhs=False):
    """Each group in float64, lax's bounds (the running sum clipped to the rows): x[rows_g] @
    w[g] (ragged m, rows in no group zero) or x[rows_g].T @ dy[rows_g] (ragged k)."""
    x, w = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    rows = x.shape[0]
    ends = np.minimum(np.cumsum(sizes), rows)
    starts = np.concatenate([[0], ends[:-1]])
    if ragged_dim == "m":
        w = np.swapaxes(w, 1, 2) if transpose_rhs else w
        out = np.zeros((rows, w.shape[2]))
        for g, (a, b) in enumerate(zip(starts, ends)):
            out[a:b] = x[a:b] @ w[g]
        return out
    return np.stack([x[a:b].T @ w[a:b] for a, b in zip(starts, ends)])


@pytest.mark.gpu
@pytest.mark.parametrize("ragged_dim,rows,other,k,groups,dtype,out,split,transpose_rhs", [
    ("m", 1000, 96, 64, 4, "bfloat16", None, "skewed", False),
    ("m", 1025, 257, 129, 7, "float16", None, "below", True),
    ("m", 2048, 768, 512, 128, "bfloat16", None, "skewed", False),
    ("m", 512, 64, 128, 8, "float32", None, "above", False),
    ("m", 1, 8, 8, 3, "bfloat16", None, "equal", False),
    ("k", 1000, 64, 96, 4, "bfloat16", None, "skewed", False),
    ("k", 4096, 256, 512, 8, "bfloat16", None, "below", False),
    ("k", 16384, 512, 768, 128, "bfloat16", None, "skewed", False),
    ("k", 1025, 33, 65, 5, "float32", None, "above", False),
])
def test_gpu_matches_float64_per_group(ragged_dim, rows, other, k, groups, dtype, out, split, transpose_rhs):
    if not _gpu_available():
        pytest.skip(f"cuBLAS's grouped GEMM is unavailable: {cublas_grouped.error()}")
    kx, kw = jax.random.split(jax.random.key(rows + other + k + groups))
    if ragged_dim == "m":  # lhs (rows, k), rhs (groups, k, other)
        lhs = jax.random.normal(kx, (rows, k), jnp.float32).astype(dtype)
        shape = (groups, other, k) if transpose_rhs else (groups, k, other)
        rhs = (jax.random.normal(kw, shape, jnp.float32) / math.sqrt(k)).astype(dtype)
    else:  # the weight gradient: lhs (rows, k), rhs (rows, other), rows split
        lhs = jax.random.normal(kx, (rows, k), jnp.float32).astype(dtype)
        rhs = jax.random.normal(kw, (rows, other), jnp.float32).astype(dtype)
    sizes = np.asarray(split_sizes(rows, groups, split), np.int32)
    got = jax.jit(lambda a, b, s: cublas_grouped.grouped_matmul(
        a, b, s, ragged=ragged_dim, transpose_rhs=transpose_rhs, out_dtype=out))(lhs, rhs, jnp.asarray(sizes))
    want = _float64_per_group(lhs.astype(jnp.float32), rhs.astype(jnp.float32), sizes, ragged_dim, transpose_rhs)
    assert got.shape == want.shape and got.dtype == jnp.dtype(out or dtype)
    got = np.asarray(got.astype(jnp.float32), np.float64)
    tolerance = KERNEL_TOLERANCES[out or dtype]
    ends = np.minimum(np.cumsum(sizes), rows)
    starts = np.concatenate([[0], ends[:-1]])
    for g, (a, b) in enumerate(zip(starts, ends)):
        part = (slice(a, b),) if ragged_dim == "m" else (g,)
        if b > a:
            assert rel_error(got[part], want[part]) < tolerance, f"group {g}"
        elif ragged_dim == "k":
            assert not np.any(got[g]), f"empty group {g} must be zero"
    if ragged_dim == "m":
        assert not np.any(got[ends[-1]:]), "rows in no group must be zero"


@pytest.mark.gpu
def test_gpu_the_candidate_matches_lax_on_both_representative_splits():
    if not _gpu_available():
        pytest.skip(f"cuBLAS's grouped GEMM is unavailable: {cublas_grouped.error()}")
    for problem in (_forward(2048, 512, 1024, 8), _weight_gradient(512, 1024, 2048, 8)):
        lhs = jax.random.normal(jax.random.key(3), problem.lhs_shape, jnp.float32).astype(problem.lhs_dtype)
        rhs = jax.random.normal(jax.random.key(4), problem.rhs_shape, jnp.float32).astype(problem.rhs_dtype)
        splits = jnp.asarray(representative_splits(problem.ragged_rows, problem.groups))
        want = ragged.XLA_RAGGED_DOT.fn(lhs, rhs, problem, splits)
        got = jax.jit(lambda a, b, s, p=problem: ragged.CUBLAS_GROUPED.fn(a, b, p, s))(lhs, rhs, splits)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert rel_error(np.asarray(got, np.float32), np.asarray(want, np.float32)) < KERNEL_TOLERANCES["bfloat16"]


@pytest.mark.gpu
def test_gpu_the_host_round_trip_is_measured_once_and_is_a_time():
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("no GPU")
    timer = timing.DeviceTimer()
    first = timer.host_round_trip()
    assert 0 < first < 1 and math.isfinite(first)
    assert timer.host_round_trip() == first
