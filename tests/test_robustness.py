"""Untrusted tables, store rows, kernels and builds never break the user's matmul (real CPU tuner)."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune import config
from jax_autotune.kernels.cpu import native
from jax_autotune.problem import problem_for
from jax_autotune.tables.table_file import DeviceTable, TuneTable, TuneTableWarning
from jax_autotune.tuners import tuner_for
from jax_autotune.tuning import counters
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.decision import Decision
from jax_autotune.tuning.probes import forget_measurements
from jax_autotune.tuning.store import JaxAutotuneStoreWarning

pytestmark = pytest.mark.usefixtures("fresh_tuning")  # tmp cache dir, no tuners, fresh counters


def operands(m, k, n, dtype="float32"):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((m, k)), dtype), jnp.asarray(rng.standard_normal((k, n)), dtype))


def decision_for(a, b, winner):
    """A decision as a table or a hand-edited row would carry it: a real candidate name."""
    tuner = tuner_for("cpu")
    problem = problem_for(a, b)
    return Decision(key=problem.key(config.get("level")), problem=problem, winner=winner,
                    device=tuner.device.fingerprint, checksum=tuner.checksum)


@pytest.mark.parametrize("shape, dtype, winner", [
    ((512, 512, 512), "float32", "native_small_portable_t1"),  # small-matmul kernel, 512^3
    ((64, 64, 64), "float32", "native_gemv_portable_t1"),     # gemv for a square
    ((64, 64, 64), "bfloat16", "native_gemm_portable_4x8_t1"),  # float32-only kernel, bf16
])
@pytest.mark.parametrize("mode", ["cached", "require"])
def test_a_table_entry_whose_kernel_cannot_run_the_key_warns_and_the_matmul_stays_correct(
        shape, dtype, winner, mode):
    m, k, n = shape
    a, b = operands(m, k, n, dtype)
    tuner = tuner_for("cpu")
    hostile = TuneTable({tuner.device.fingerprint: DeviceTable(
        tuner.checksum, tuner.candidate_set.names(), (decision_for(a, b, winner),))})
    with pytest.warns(TuneTableWarning, match=winner):
        jat.load_table(hostile)
    config.update("mode", mode)
    out = jax.jit(jat.matmul)(a, b)  # never KeyNotTunedError: the key is in the table
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(jnp.matmul(a, b), np.float32),
                               rtol=2e-2, atol=1e-1)
    assert counters.stats()["tuned"] == 0


def test_a_hand_edited_store_row_whose_kernel_cannot_run_warns_once_and_xla_dot_runs_the_key():
    a, b = operands(512, 512, 512)
    tuner = tuner_for("cpu")
    row = decision_for(a, b, "native_small_avx2_t1")
    tuner.store.put(tuner.namespace, row.key.canonical(), tuner.checksum, row.to_json())
    config.update("mode", "cached")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            jax.clear_caches()
            out = jax.jit(jat.matmul)(a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-4, atol=1e-3)
    rejected = [w for w in record if issubclass(w.category, JaxAutotuneStoreWarning)]
    assert len(rejected) == 1 and "native_small_avx2_t1" in str(rejected[0].message)


def test_the_cpu_fingerprint_names_the_native_isa_and_a_lower_isa_rejects_a_wider_winner():
    here = tuner_for("cpu").device.fingerprint
    assert here.endswith(f"-{native.isa()}")
    script = textwrap.dedent("""
        import json, warnings
        import jax, jax.numpy as jnp, numpy as np
        import jax_autotune as jat
        from jax_autotune.tuners import tuner_for
        from jax_autotune.problem import problem_for
        from jax_autotune.tuning.decision import Decision
        tuner = tuner_for("cpu")
        a = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32)
        problem = problem_for(a, a)
        row = Decision(key=problem.key(), problem=problem, winner="native_gemm_avx2_6x16_t1")
        tuner.store.put(tuner.namespace, row.key.canonical(), tuner.checksum, row.to_json())
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out = jax.jit(jat.matmul)(a, a)
        np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(a), rtol=1e-4, atol=1e-4)
        print(json.dumps({"fingerprint": tuner.device.fingerprint,
                          "warnings": [str(w.message) for w in record]}))
    """)
    env = {**os.environ, "JAX_AUTOTUNE_NATIVE_ISA": "portable",
           "JAX_AUTOTUNE_MODE": "cached", "JAX_AUTOTUNE_CACHE_DIR": config.get("cache_dir")}
    done = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["fingerprint"].endswith("-portable") and result["fingerprint"] != here
    assert any("native_gemm_avx2_6x16_t1" in w and "cannot run" in w for w in result["warnings"])


@pytest.mark.parametrize("lhs, out", [("int8", "int8"), ("int32", "int32"), ("bfloat16", "bfloat16"),
                                      ("float16", "float16"), ("complex64", "complex64")])
def test_a_key_no_native_kernel_supports_compiles_and_probes_nothing(lhs, out):
    forget_measurements()  # probes would run again if anything asked for them
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.integers(-128, 127, (64, 96)), lhs)
    b = jnp.asarray(rng.integers(-128, 127, (96, 48)), lhs)
    got = jax.jit(jat.matmul)(a, b)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.matmul(a, b)))
    stats = counters.stats()
    assert (stats["candidate_compiles"], stats["probe_launches"], stats["candidate_runs"]) == (0, 0, 0)
    decision = tuner_for("cpu").known.lookup(problem_for(a, b).key(config.get("level")))
    assert decision.winner == "xla_dot" and decision.source == "tuned"
    assert {r.outcome for r in decision.results} == {"skipped"}  # never wrong_result, never compiled
    assert str(out) == got.dtype.name


def test_a_kernel_that_refuses_the_problem_while_lowering_falls_back_to_xla_dot(monkeypatch):
    a, b = operands(48, 40, 24)
    tuner = tuner_for("cpu")
    assert tuner.known.install(decision_for(a, b, "native_gemm_portable_4x8_t1"))
    real = tuner.candidate_set

    def refuse(lhs, rhs, problem):
        raise ValueError("this kernel refuses the problem")

    class Refusing:  # the real set, but every kernel except XLA's dot refuses while lowering
        def __getattr__(self, name):
            return getattr(real, name)

        def by_name(self, name):
            return Candidate(name, refuse) if name != "xla_dot" else real.by_name(name)

    monkeypatch.setattr(tuner, "candidate_set", Refusing())
    with pytest.warns(RuntimeWarning, match="native_gemm_portable_4x8_t1 failed to lower"):
        out = jax.jit(jat.matmul)(a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-4, atol=1e-4)


def test_without_the_native_extension_one_warning_says_how_to_build_it():
    script = textwrap.dedent("""
        import sys, warnings
        sys.modules["jax_autotune._native"] = None   # as in a source checkout without the build
        import jax, jax.numpy as jnp, numpy as np
        import jax_autotune as jat
        from jax_autotune.registry import RUNTIME
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            x = jnp.ones((16, 16))
            out = jax.jit(jat.matmul)(x, x)
            RUNTIME.reset()
            jax.jit(jat.matmul)(x, x + 1)
        assert float(out[0, 0]) == 16.0
        print("\\n".join(f"{w.category.__name__}: {w.message}" for w in record))
    """)
    env = {**os.environ, "JAX_AUTOTUNE_CACHE": "0"}
    done = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("NativeKernelsWarning")]
    assert len(lines) == 1 and "pip install --no-build-isolation -e ." in lines[0]
