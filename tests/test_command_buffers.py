"""The tuner's programs never touch the user's CUDA graphs: every program it compiles has
no command buffers (so compiling it evicts no other executable's graphs), and CUPTI is
detached once a key's measurements are done (so no graph of the user's runs or is
destroyed under it). See jax_autotune/tuning/compile_options.py."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune.tuning import counters
from jax_autotune.tuning.compile_options import TUNER_COMPILER_OPTIONS


def test_every_program_the_tuner_compiles_has_no_command_buffers(fresh_tuning, monkeypatch):
    options = []
    compile_ = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kwargs):
        options.append(dict(compiler_options or {}))
        return compile_(self, compiler_options=compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((37, 29)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((29, 41)), jnp.float32)
    out = jax.jit(lambda a, b: jnp.tanh(jat.matmul(a, b)) + 1.0)(a, b)  # tunes its key here
    assert counters.stats()["tuned"] == 1
    np.testing.assert_allclose(out, np.tanh(np.asarray(a, np.float64) @ np.asarray(b, np.float64)) + 1,
                               rtol=1e-4, atol=1e-4)
    assert len(options) >= 2  # the candidates' programs, at least XLA's dot and one kernel
    assert all(o.items() >= TUNER_COMPILER_OPTIONS.items() for o in options), options


_CHILD = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    import jax_autotune as jat

    def layers(x, ws):  # the user's program: enough kernels for XLA to make a CUDA graph
        for w in ws:
            x = jnp.tanh(x @ w)
            x = x / (1.0 + jnp.sum(jnp.abs(x), axis=-1, keepdims=True))
        return x

    x = jnp.ones((512, 512), jnp.bfloat16)
    ws = [jnp.full((512, 512), 0.01 * (i + 1), jnp.bfloat16) for i in range(6)]
    user = jax.jit(layers)
    jax.block_until_ready(user(x, ws))
    operands = [(jax.random.normal(jax.random.key(n), (n, 768), jnp.bfloat16),
                 jax.random.normal(jax.random.key(n + 1), (768, n), jnp.bfloat16)) for n in (500, 1000, 3000)]
    print("TUNING", file=sys.stderr, flush=True)
    lowered = []
    for a, b in operands:  # three keys (buckets 512, 1024, 4096), each tuned while its program lowers
        lowered.append(jax.jit(jat.matmul).lower(a, b))
        jax.block_until_ready(user(x, ws))  # the user's graphs run between tunings
    print("TUNED", jat.stats()["tuned"], file=sys.stderr, flush=True)
    for program, (a, b) in zip(lowered, operands):
        jax.block_until_ready(program.compile()(a, b))
    jax.block_until_ready(jax.jit(lambda x, ws: layers(x, ws) * 2)(x, ws))  # evicts the user's graphs
    jax.clear_caches()
    print("DONE", file=sys.stderr, flush=True)
""")


@pytest.mark.gpu
def test_tuning_beside_a_program_with_cuda_graphs_evicts_none_and_the_process_lives(tmp_path):
    env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="command_buffer_thunk=3", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               JAX_AUTOTUNE_BUDGET_SECONDS="2")
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stderr
    assert "DONE" in log and "TUNED 3" in log
    tuning = log[log.index("TUNING"):log.index("TUNED")]
    assert "Evicted" not in tuning, "a program the tuner compiled evicted the user's CUDA graphs"
    assert "Evicted" in log[log.index("TUNED"):], "the check is blind: the user's own compile evicts"


@pytest.mark.gpu
def test_cupti_is_detached_once_a_key_is_tuned(fresh_tuning):
    from jax_autotune.tuners import tuner_for

    a = jax.random.normal(jax.random.key(0), (300, 200), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (200, 100), jnp.bfloat16)
    jax.block_until_ready(jax.jit(jat.matmul)(a, b))
    timer = tuner_for("gpu").timer
    assert counters.stats()["tuned"] == 1 and timer.name == "device_cupti"
    assert not timer._attached


def test_cupti_is_detached_after_the_last_of_two_keys_measured_at_once(monkeypatch):
    """Keys are tuned two at a time on a GPU: one key's release must not leave CUPTI
    attached by the other key's later measurements."""
    from jax.experimental.mosaic.gpu import profiler

    from jax_autotune.tuning import timing

    events = []

    class FakeCupti:
        def __init__(self, finalize):
            self.finalize = finalize

        def measure(self, f, iterations=1):
            def run(*args):
                events.append("detach" if self.finalize else "measure")
                return None, [1.0] * iterations
            return run

    monkeypatch.setattr(profiler, "Cupti", FakeCupti)
    monkeypatch.setattr(timing, "_noop_program", lambda: None)
    timer = timing.DeviceTimer(batch=2)
    key_a = timing._DeviceMeasurement(None, (), timer._measure, timer.batch)
    key_b = timing._DeviceMeasurement(None, (), timer._measure, timer.batch)
    key_a.sample(), key_b.sample()
    timer.release()  # key a done: detached
    key_b.sample(), key_b.sample()  # key b measures on: attached again
    timer.release()
    timer.release()  # nothing measured since: nothing to detach
    assert events == ["measure", "measure", "detach", "measure", "detach"]
