"""jax.export of tuned functions: export-safe kernels by default, the opt-in keeps the
native ones, several platforms at once; artifacts are loaded in fresh processes. The GPU
part (Mosaic and Triton winners) is marked ``gpu``."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune import config
from jax_autotune.tables.table_file import DeviceTable, TuneTable
from jax_autotune.tuners import built_tuners, has_devices, tuner_for
from jax_autotune.tuning import counters
from jax_autotune.tuning.decision import CandidateResult, Decision
from jax_autotune.warmup import matmul_problems
from numerics import rel_error

pytest.importorskip("flatbuffers")  # Exported.serialize() needs it (the "export" extra)
pytestmark = pytest.mark.usefixtures("fresh_tuning")
RNG = np.random.default_rng(18)
CPU = ("cpu",)  # export platforms of the CPU tests (the default is the default backend's)

LOADER = r'''
import json, sys
import numpy as np
blob, inputs, output, how = sys.argv[1:5]
import jax
if how == "jax_autotune":
    import jax_autotune as jat
    exported = jat.deserialize(open(blob, "rb").read())
else:  # jax alone
    exported = jax.export.deserialize(bytearray(open(blob, "rb").read()))
with np.load(inputs, allow_pickle=False) as saved:
    leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
args, kwargs = jax.tree.unflatten(exported.in_tree, leaves)
report = {"jax_autotune_imported": "jax_autotune" in sys.modules,
          "disabled_checks": [str(c) for c in exported.disabled_safety_checks]}
try:
    np.save(output, np.asarray(exported.call(*args, **kwargs)), allow_pickle=False)
except Exception as err:
    report["error"] = f"{type(err).__name__}: {err}"[:1000]
print(json.dumps(report))
'''


def run_fresh(tmp_path, exported, args, how="jax"):
    """Serialize ``exported``, then deserialize and call it on ``args`` in a fresh process
    (``how``: "jax" alone or "jax_autotune"); returns (output or None, report)."""
    blob, inputs, output = tmp_path / "model.jax", tmp_path / "inputs.npz", tmp_path / "out.npy"
    blob.write_bytes(exported.serialize())
    np.savez(inputs, *[np.asarray(leaf) for leaf in jax.tree.leaves(args)])
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    if output.exists():
        output.unlink()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-P", str(script), str(blob), str(inputs), str(output), how],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return (np.load(output, allow_pickle=False) if output.exists() else None), report


def targets(text: str) -> set[str]:
    """Custom-call targets in StableHLO text (a name with '$' is printed quoted)."""
    return set(re.findall(r'custom_call @"?([^\s("]+)', text))


def project_targets(text: str) -> set[str]:
    return {t for t in targets(text) if t.startswith("jax_autotune_")}


def install_winners(fn, args, choose, platform="cpu", **scores):
    """Install, for every key ``fn(*args)`` binds, a tune-table decision won by
    ``choose(tuner, key)`` with results that rank it first, then ``scores`` (name -> s)."""
    tuner = tuner_for(platform)
    decisions = []
    for problem, key in matmul_problems(jax.make_jaxpr(fn)(*args)):
        winner = choose(tuner, key)
        ranking = {winner: 1e-5, **scores}
        results = tuple(CandidateResult(name, "ok", score=s) for name, s in ranking.items())
        decisions.append(Decision(key=key, problem=problem, winner=winner, results=results))
    names = tuner.candidate_set.names()
    jat.load_table(TuneTable({tuner.device.fingerprint: DeviceTable(tuner.checksum, names,
                                                                    tuple(decisions))}))
    return tuner, [d.key for d in decisions]


# ---------------------------------------------------------------- CPU

def native_gemm(tuner, key):
    return next(c.name for c in tuner.candidate_set.candidates
                if c.name.startswith("native_gemm_") and c.supports(tuner.device, key))


def model():
    """``jat.matmul``, ``jat.dot_general`` (x @ W^T) and a flax Dense with the drop-in."""
    nn = pytest.importorskip("flax.linen")
    dense = nn.Dense(16, dot_general=jat.dot_general)
    x = jnp.asarray(RNG.standard_normal((64, 48)), jnp.float32)
    params = {"w1": jnp.asarray(RNG.standard_normal((48, 40)), jnp.float32),
              "w2": jnp.asarray(RNG.standard_normal((24, 40)), jnp.float32)}
    # the same parameters as the drop-in's, without running (and tuning) a matmul
    params["dense"] = nn.Dense(16).init(jax.random.key(0), jnp.zeros((64, 24), jnp.float32))

    def fn(params, x):
        h = jat.matmul(x, params["w1"])
        h = jat.dot_general(h, params["w2"], (((1,), (1,)), ((), ())))
        return dense.apply(params["dense"], h)

    def reference(params, x):
        f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
        h = f64(x) @ f64(params["w1"]) @ f64(params["w2"]).T
        inner = params["dense"]["params"]
        return h @ f64(inner["kernel"]) + f64(inner["bias"])

    return fn, (params, x), reference(params, x)


@pytest.fixture
def native_model():
    """The model on the CPU (also on a GPU host), every key won by a native GEMM."""
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    with jax.default_device(jax.devices("cpu")[0]):
        fn, args, want = model()
        tuner, keys = install_winners(fn, args, native_gemm, xla_dot=2e-5)
        assert len(keys) == 3
        yield fn, args, want, tuner, keys


def test_export_of_a_native_winner_serializes_with_xla_dot_and_jit_keeps_the_native_kernel(
        native_model, tmp_path):
    fn, args, want, tuner, keys = native_model
    jitted = jax.jit(fn)
    assert project_targets(jitted.lower(*args).as_text()) == {"jax_autotune_gemm"}
    by_jit = np.asarray(jitted(*args))

    exported = jax.export.export(jitted, platforms=CPU)(*args)
    assert project_targets(exported.mlir_module()) == set()
    got, report = run_fresh(tmp_path, exported, args, how="jax")
    assert "error" not in report and not report["jax_autotune_imported"]  # jax alone runs it
    np.testing.assert_allclose(got, by_jit, rtol=1e-5, atol=1e-4)
    assert rel_error(got, want) < 2e-6

    for key in keys:  # the record says what the export used; the winner is unchanged
        decision = tuner.known.lookup(key)
        assert decision.winner.startswith("native_gemm_") and decision.export_kernel == "xla_dot"
        assert "jax_autotune_gemm" in decision.export_reason
    harvested = TuneTable.loads(jat.table().dumps())
    entries = [d for section in harvested.devices.values() for d in section.entries]
    assert {d.export_kernel for d in entries if d.key in keys} == {"xla_dot"}

    jax.clear_caches()  # plain jit afterwards: lowered again, still the native winner
    again = jax.jit(fn)
    assert project_targets(again.lower(*args).as_text()) == {"jax_autotune_gemm"}
    np.testing.assert_allclose(np.asarray(again(*args)), by_jit, rtol=1e-6, atol=1e-6)
    assert counters.stats()["tuned"] == 0  # everything came from the installed table


def test_exports_are_logged(native_model, tmp_path):
    fn, args, _, _, keys = native_model
    log = tmp_path / "log.jsonl"
    config.update("log_decisions", str(log))
    jax.export.export(jax.jit(fn), platforms=CPU)(*args)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(events) == len(keys)
    assert {(e["event"], e["export_kernel"]) for e in events} == {("jax_autotune.export", "xla_dot")}


def test_the_opt_in_keeps_the_native_kernels_registered_on_load(native_model, tmp_path):
    fn, args, want, tuner, keys = native_model
    by_jit = np.asarray(jax.jit(fn)(*args))
    exported = jat.export(fn, *args, platforms=CPU, native=True)
    assert project_targets(exported.mlir_module()) == {"jax_autotune_gemm"}
    assert {f"custom_call:{t}" for t in jat.native_targets()} <= {
        str(c) for c in exported.disabled_safety_checks}
    assert all("kept" in tuner.known.lookup(key).export_reason for key in keys)

    got, report = run_fresh(tmp_path, exported, args, how="jax_autotune")
    assert "error" not in report, report
    np.testing.assert_allclose(got, by_jit, rtol=1e-6, atol=1e-5)
    assert rel_error(got, want) < 2e-6
    _, bare = run_fresh(tmp_path, exported, args, how="jax")  # nothing registered the targets
    assert "No FFI handler registered for jax_autotune_gemm" in bare["error"]


def test_the_opt_in_needs_both_the_context_and_the_disabled_checks(native_model):
    fn, args, *_ = native_model
    jitted = jax.jit(fn)
    with jat.export_allowing():
        with pytest.raises(ValueError, match="no compatibility guarantees"):
            jax.export.export(jitted, platforms=CPU)(*args)
        kept = jax.export.export(jitted, platforms=CPU, disabled_checks=jat.export_disabled_checks())(*args)
    assert project_targets(kept.mlir_module()) == {"jax_autotune_gemm"}
    # the checks alone change nothing: the lowering still emits export-safe kernels
    safe = jax.export.export(jitted, platforms=CPU, disabled_checks=jat.export_disabled_checks())(*args)
    assert project_targets(safe.mlir_module()) == set()
    assert project_targets(jat.export(fn, *args, platforms=CPU).mlir_module()) == set()


def test_multi_platform_export_on_a_cpu_only_host(native_model, tmp_path):
    if has_devices("cuda"):
        pytest.skip("a CPU-only host")
    fn, args, want, *_ = native_model
    exported = jax.export.export(jax.jit(fn), platforms=("cpu", "cuda"))(*args)
    assert exported.platforms == ("cpu", "cuda")
    assert project_targets(exported.mlir_module()) == set()
    assert {t.device.platform for t in built_tuners()} == {"cpu"}  # nothing tuned for the GPU (dense or grouped)
    got, report = run_fresh(tmp_path, exported, args)
    assert "error" not in report and rel_error(got, want) < 2e-6

    native = jat.export(fn, *args, platforms=("cpu", "cuda"), native=True)
    assert project_targets(native.mlir_module()) == {"jax_autotune_gemm"}  # the CPU branch
    got, report = run_fresh(tmp_path, native, args, how="jax_autotune")
    assert "error" not in report and rel_error(got, want) < 2e-6


def test_any_build_exports_the_model_and_several_platforms(tmp_path):
    """Without forced winners (and without the native extension too)."""
    config.update("mode", "cached")  # nothing is tuned: the decisions are XLA's dot
    with jax.default_device(jax.devices("cpu")[0]):
        fn, args, want = model()
        by_jit = np.asarray(jax.jit(fn)(*args))
        platforms = CPU if has_devices("cuda") else ("cpu", "cuda")
        exported = jax.export.export(jax.jit(fn), platforms=platforms)(*args)
    got, report = run_fresh(tmp_path, exported, args)
    assert "error" not in report and exported.platforms == platforms
    np.testing.assert_allclose(got, by_jit, rtol=1e-6, atol=1e-5)
    assert rel_error(got, want) < 2e-6


def test_jit_lowering_for_an_absent_platform_uses_xla_dot():
    if has_devices("cuda"):
        pytest.skip("a CPU-only host")
    x = jnp.ones((8, 4), jnp.float32)
    lowered = jax.jit(jat.matmul).trace(x, x.T).lower(lowering_platforms=("cuda",))
    assert project_targets(lowered.as_text()) == set()
    assert built_tuners() == []


def test_the_public_helpers():
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    names = jat.native_targets()
    assert "jax_autotune_gemm" in names and all(n.startswith("jax_autotune_") for n in names)
    assert [str(c) for c in jat.export_disabled_checks(["a"])] == ["custom_call:a"]
    with jat.export_allowing(["a"]) as allowed:
        assert allowed == {"a"}
    with pytest.raises(TypeError):
        jat.export_disabled_checks("jax_autotune_gemm")


# ---------------------------------------------------------------- GPU (H200)

def gpu_problem():
    jax.clear_caches()  # each test installs its own winner for the same key: lower afresh
    a = jnp.asarray(RNG.standard_normal((2048, 2048)), jnp.bfloat16)
    b = jnp.asarray(RNG.standard_normal((2048, 2048)), jnp.bfloat16)
    return a, b, np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def supported(tuner, key, prefix):
    names = [c.name for c in tuner.candidate_set.candidates
             if c.name.startswith(prefix) and c.supports(tuner.device, key)]
    if not names:
        pytest.skip(f"no {prefix} candidate supports {key.canonical()} here")
    return names[0]


@pytest.mark.gpu
def test_a_mosaic_winner_exports_as_is():
    a, b, want = gpu_problem()
    tuner, (key,) = install_winners(jat.matmul, (a, b), lambda t, k: supported(t, k, "mosaic_gemm_"),
                                    platform="gpu", xla_dot=2e-5)
    exported = jax.export.export(jax.jit(jat.matmul))(a, b)
    assert "mosaic_gpu_v2" in targets(exported.mlir_module())
    decision = tuner.known.lookup(key)
    assert decision.export_kernel == decision.winner and decision.export_reason == ""
    got = jax.export.deserialize(exported.serialize()).call(a, b)
    assert rel_error(got, want) < 2e-2


@pytest.mark.gpu
def test_a_triton_winner_is_replaced_by_the_fastest_safe_candidate():
    a, b, want = gpu_problem()
    probe = tuner_for("gpu")
    key = jat.key_for(a, b)
    triton = supported(probe, key, "triton_gemm_")
    mosaic = [c.name for c in probe.candidate_set.candidates
              if c.name.startswith("mosaic_gemm_") and c.supports(probe.device, key)][:1]
    scores = {**{name: 1.5e-5 for name in mosaic}, "xla_dot": 2e-5}
    tuner, (key,) = install_winners(jat.matmul, (a, b), lambda t, k: triton, platform="gpu",
                                    **scores)
    jitted = jax.jit(jat.matmul)
    triton_targets = tuner.candidate_set.by_name(triton).export_safety(tuner.known.lookup(key).problem, "cuda").unsafe
    assert triton_targets and triton_targets <= targets(jitted.lower(a, b).as_text())

    exported = jax.export.export(jitted)(a, b)
    assert not triton_targets & targets(exported.mlir_module())
    decision = tuner.known.lookup(key)
    assert decision.winner == triton and decision.export_kernel == (mosaic or ["xla_dot"])[0]
    got = jax.export.deserialize(exported.serialize()).call(a, b)
    assert rel_error(got, want) < 2e-2
    jax.clear_caches()
    assert triton_targets <= targets(jax.jit(jat.matmul).lower(a, b).as_text())  # jit: Triton


@pytest.mark.gpu
def test_the_opt_in_keeps_a_triton_winner():
    a, b, want = gpu_problem()
    tuner, (key,) = install_winners(jat.matmul, (a, b), lambda t, k: supported(t, k, "triton_gemm_"),
                                    platform="gpu", xla_dot=2e-5)
    decision = tuner.known.lookup(key)
    unsafe = tuner.candidate_set.by_name(decision.winner).export_safety(decision.problem, "cuda").unsafe
    exported = jat.export(jat.matmul, a, b, allow_targets=unsafe)
    assert unsafe <= targets(exported.mlir_module())
    assert tuner.known.lookup(key).export_kernel == decision.winner
    assert rel_error(exported.call(a, b), want) < 2e-2


@pytest.mark.gpu
def test_a_cublaslt_winner_exports_safe_by_default_and_kept_with_its_target():
    from jax_autotune.kernels.gpu import cublaslt

    a, b, want = gpu_problem()
    tuner, (key,) = install_winners(jat.matmul, (a, b), lambda t, k: supported(t, k, "cublaslt_algo"),
                                    platform="gpu", xla_dot=2e-5)
    jax.clear_caches()
    assert cublaslt.TARGET not in targets(jax.export.export(jax.jit(jat.matmul))(a, b).mlir_module())
    jax.clear_caches()
    kept = jat.export(jat.matmul, a, b, allow_targets=[cublaslt.TARGET])
    assert cublaslt.TARGET in targets(kept.mlir_module())
    assert rel_error(jat.deserialize(kept.serialize()).call(a, b), want) < 2e-2


def test_an_autotuned_function_in_context_exports_and_runs_as_the_plain_one(tmp_path):
    pytest.importorskip("flatbuffers")
    rng = np.random.default_rng(11)
    x, w, b = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((32, 24), (24, 40), (40,)))
    fn = jat.autotune(lambda x, w, b: jax.nn.gelu(x @ w + b))
    blob = jat.export(fn, x, w, b).serialize()
    want = jax.nn.gelu(np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(b, np.float64))
    np.testing.assert_allclose(jax.export.deserialize(blob).call(x, w, b), want, rtol=2e-5, atol=2e-5)
    decisions = tuner_for("cpu").known.memory_decisions()
    assert any(not d.key.epilogue.is_bare and d.export_kernel for d in decisions)
