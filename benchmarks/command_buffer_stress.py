"""What kills a tuned GPU process inside an XLA compile: CUDA graphs, their eviction and CUPTI.

XLA:GPU puts runs of kernels into command buffers (CUDA graphs), and every compile that
builds one evicts (destroys) the graphs of every other executable of the process. The
tuner times kernels with JAX's CUPTI profiler, which XLA does not know of. Each scenario
runs in a child process and is repeated; a child killed by a signal is a crash.

* ``attached``: a user program with graphs runs; CUPTI is attached (``finalize=False``,
  as the tuner did) and stays attached; programs with graphs are compiled (each evicts
  the others' graphs) and run, and a candidate is measured, in a loop;
* ``finalized``: the same, CUPTI detached after each measurement;
* ``no_graphs``: CUPTI stays attached, the loop's programs are compiled without command
  buffers (no eviction), and the user's program is dropped at the end (its graphs destroyed);
* ``fixed``: CUPTI detached after each measurement and the loop's programs without
  command buffers (what the tuner does now);
* ``threads``: ``attached`` with the compiles on a thread beside the measurements.

    python benchmarks/command_buffer_stress.py --out OUTDIR [--repeats 3] [--iterations 40]

Each child logs XLA's command-buffer evictions (``TF_CPP_VMODULE``); the table counts
children that crashed and evictions that destroyed graphs. Also printed: whether
``xla_gpu_enable_command_buffer=""`` compiles, and the cost of one CUPTI measurement
with and without detaching.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

SCENARIOS = ("attached", "finalized", "no_graphs", "fixed", "threads")
NO_GRAPHS = {"xla_gpu_enable_command_buffer": ""}


def _programs(jnp, size: int, layers: int = 6):
    def program(x, ws):
        for w in ws:
            x = jnp.tanh(x @ w)
            x = x / (1.0 + jnp.sum(jnp.abs(x), axis=-1, keepdims=True))
        return x
    return program


def _compiled(jax, jnp, size: int, options=None):
    x = jnp.ones((size, size), jnp.float32)
    ws = [jnp.full((size, size), 0.01 * (i + 1), jnp.float32) for i in range(6)]
    lowered = jax.jit(_programs(jnp, size)).lower(x, ws)
    return lowered.compile(compiler_options=options) if options else lowered.compile(), (x, ws)


def child(scenario: str, iterations: int) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import profiler

    finalize = scenario in ("finalized", "fixed")
    loop_options = NO_GRAPHS if scenario in ("no_graphs", "fixed") else None
    user, user_args = _compiled(jax, jnp, 512)
    jax.block_until_ready(user(*user_args))  # the user's plain step: its graphs exist now
    candidate = jax.jit(lambda a, b: a @ b).lower(user_args[0], user_args[1][0]).compile(compiler_options=NO_GRAPHS)
    measure = profiler.Cupti(finalize=finalize).measure(candidate, iterations=4)

    def compile_and_run(i):
        program, args = _compiled(jax, jnp, 256 + 8 * i, loop_options)
        jax.block_until_ready(program(*args))

    if scenario == "threads":
        stop = threading.Event()

        def compiles():
            i = 0
            while not stop.is_set():
                compile_and_run(i)
                i += 1

        worker = threading.Thread(target=compiles)
        worker.start()
        for _ in range(iterations):
            measure(user_args[0], user_args[1][0])
            jax.block_until_ready(user(*user_args))
        stop.set()
        worker.join()
    else:
        for i in range(iterations):
            measure(user_args[0], user_args[1][0])
            compile_and_run(i)
            jax.block_until_ready(user(*user_args))
    del user
    jax.clear_caches()
    import gc
    gc.collect()
    print("child done", flush=True)


def cupti_cost(repeats: int = 40) -> dict:
    """Seconds per CUPTI measurement of a small matmul, detaching after each or not."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import profiler

    a = jnp.ones((1024, 1024), jnp.bfloat16)
    compiled = jax.jit(lambda a, b: a @ b).lower(a, a).compile(compiler_options=NO_GRAPHS)
    cost = {}
    for finalize in (False, True):
        measure = profiler.Cupti(finalize=finalize).measure(compiled, iterations=12)
        measure(a, a)
        start = time.perf_counter()
        for _ in range(repeats):
            measure(a, a)
        cost[f"finalize={finalize}"] = (time.perf_counter() - start) / repeats
    return cost


def environment() -> dict:
    import jax
    import jax.numpy as jnp
    from jax._src.interpreters import ad

    x = jnp.ones((64, 64))
    jax.jit(lambda x: jnp.sin(x) @ x).lower(x).compile(compiler_options=NO_GRAPHS)
    return {"jax": jax.__version__, "device": jax.devices()[0].device_kind,
            "no_command_buffer_option_compiles": True,
            "linearize_trace_has_is_vjp": "is_vjp" in getattr(ad.LinearizeTrace, "__slots__", ())
            or "is_vjp" in ad.LinearizeTrace.__init__.__code__.co_varnames}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--timeout-s", type=float, default=60)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.iterations)
        return
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="command_buffer_thunk=3",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    report = {"environment": environment(), "cupti_seconds_per_measure": cupti_cost(), "runs": []}
    for scenario in args.scenarios.split(","):
        for repeat in range(args.repeats):
            start = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, __file__, "--child", scenario,
                                       f"--iterations={args.iterations}"], env=env, capture_output=True,
                                      text=True, timeout=args.timeout_s)
                code, err = done.returncode, done.stderr
            except subprocess.TimeoutExpired as timeout:
                code, err = "timeout", (timeout.stderr or b"").decode(errors="replace")
            evicted = [int(n) for n in re.findall(r"Evicted (\d+) command buffer", err)]
            evict_calls = len(re.findall(r"Evict command buffer thunk command buffers", err))
            run = {"scenario": scenario, "repeat": repeat, "exit": code, "seconds": round(time.perf_counter() - start, 1),
                   "evict_calls": evict_calls, "evictions_destroying_graphs": len(evicted),
                   "graphs_destroyed": sum(evicted),
                   "tail": err.strip().splitlines()[-3:] if code != 0 else []}
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}))
    for scenario in args.scenarios.split(","):
        runs = [r for r in report["runs"] if r["scenario"] == scenario]
        crashed = sum(isinstance(r["exit"], int) and r["exit"] < 0 for r in runs)
        print(f"{scenario:10s} crashed {crashed}/{len(runs)}  exits {[r['exit'] for r in runs]}  "
              f"evict calls {[r['evict_calls'] for r in runs]}  "
              f"graph-destroying evictions {[r['evictions_destroying_graphs'] for r in runs]}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "command_buffer_stress.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
