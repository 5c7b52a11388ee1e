"""Sharded training steps, plain against tuned: step time and the collectives XLA emits.

    python benchmarks/sharded_suite.py --out benchmarks/results [--devices 4] [--steps 20]

A two-layer MLP step (forward, grad, SGD) under plain ``jax.jit`` on a mesh of
``--devices`` devices (host CPU devices unless GPUs are there), in two layouts:
* data-parallel: the batch sharded over ``x``, weights replicated;
* tensor-parallel: the hidden features sharded over ``x`` (first weight by columns,
  second by rows: its matmul contracts over the sharded axis and all-reduces).
Each layout runs the step with ``jnp.matmul`` (plain) and ``jat.matmul`` (tuned, after
``jat.warmup`` of the step), in its own process. Reported: median step time, the count of
each collective in the compiled HLO (the tuned step must add none), the kernels the
tuned step's per-shard matmuls run, and the loss of both (equal within tolerance).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time

from report import child_result, write_results

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
LAYOUTS = ("data-parallel", "tensor-parallel")


def run_case(layout: str, variant: str, args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_autotune as jat

    devices = jax.devices()[:args.devices]
    mesh = Mesh(np.array(devices), ("x",))
    matmul = jat.matmul if variant == "tuned" else jnp.matmul
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.d), np.float32)
    y = rng.standard_normal((args.batch, args.d), np.float32)
    w1 = rng.standard_normal((args.d, args.hidden), np.float32) / args.d ** 0.5
    w2 = rng.standard_normal((args.hidden, args.d), np.float32) / args.hidden ** 0.5
    if layout == "data-parallel":
        specs = (P("x", None), P("x", None), P(), P())
    else:
        specs = (P(), P(), P(None, "x"), P("x", None))
    x, y, w1, w2 = (jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, y, w1, w2), specs))

    def loss(params, x, y):
        w1, w2 = params
        return jnp.mean((matmul(jax.nn.relu(matmul(x, w1)), w2) - y) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value

    params = (w1, w2)
    report = None
    if variant == "tuned":
        start = time.perf_counter()
        report = jat.warmup(loss, params, x, y, grad=True)
        warmup_s = time.perf_counter() - start
        tuned_by_warmup = jat.stats()["tuned"]
    compiled = jax.jit(step).lower(params, x, y).compile()
    hlo = compiled.as_text()
    value = None
    for _ in range(3):
        params, value = compiled(params, x, y)
    jax.block_until_ready(value)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        params, value = compiled(params, x, y)
        jax.block_until_ready(value)
        times.append(time.perf_counter() - start)
    row = {"layout": layout, "variant": variant, "step_ms": statistics.median(times) * 1e3,
           "loss": float(value), "collectives": {c: len(re.findall(rf"\s{c}(-start)?\(", hlo)) for c in COLLECTIVES},
           "custom_calls": sorted(set(re.findall(r'custom_call_target="(jax_autotune_\w+)"', hlo))),
           "device": str(devices[0].device_kind)}
    if report is not None:
        row.update(warmup_s=warmup_s, tuned_keys=[f"{e.problem.describe()} -> {e.winner}" for e in report],
                   tuned_after_warmup=jat.stats()["tuned"] - tuned_by_warmup)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        layout, variant = args.case.split(":")
        print(json.dumps(run_case(layout, variant, args)))
        return
    rows = []
    for layout in LAYOUTS:
        for variant in ("plain", "tuned"):
            env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=tempfile.mkdtemp(prefix="sharded_suite_"))
            if not any(arg.startswith("--xla_force_host_platform_device_count") for arg in
                       env.get("XLA_FLAGS", "").split()):
                env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                    f" --xla_force_host_platform_device_count={args.devices}").strip()
            child = [f"--case={layout}:{variant}"] + [
                f"--{name}={getattr(args, name)}" for name in ("devices", "batch", "d", "hidden", "steps")]
            rows.append(child_result(__file__, child, env, timeout_s=600))
            print(json.dumps(rows[-1]), flush=True)
    import jax
    command = "python benchmarks/sharded_suite.py " + " ".join(sys.argv[1:])
    text = report(rows, command, jax.__version__, args)
    print(text)
    write_results(args.out, f"sharded_suite_{datetime.date.today().isoformat()}", text,
                  {"rows": rows, "command": command})


def report(rows, command, jax_version, args) -> str:
    device = rows[0]["device"] if rows else "?"
    lines = [f"# Sharded training steps, {datetime.date.today().isoformat()}", "",
             f"jax {jax_version}; {args.devices} devices ({device}); command: `{command}`", "",
             f"MLP step: x ({args.batch}, {args.d}) @ w1 ({args.d}, {args.hidden}), relu, @ w2 "
             f"({args.hidden}, {args.d}), mean squared error, grad, SGD; float32.", "",
             "| layout | variant | step ms | plain / tuned | collectives in the compiled step | tuned kernels | loss |",
             "|---|---|---|---|---|---|---|"]
    by = {(r["layout"], r["variant"]): r for r in rows}
    for r in rows:
        plain = by.get((r["layout"], "plain"))
        ratio = f"{plain['step_ms'] / r['step_ms']:.2f}" if plain and r["variant"] == "tuned" else "-"
        collectives = ", ".join(f"{name} {n}" for name, n in r["collectives"].items() if n) or "none"
        lines.append(f"| {r['layout']} | {r['variant']} | {r['step_ms']:.2f} | {ratio} | {collectives} | "
                     f"{', '.join(r['custom_calls']) or 'XLA dot'} | {r['loss']:.6f} |")
    for r in rows:
        if r.get("tuned_keys"):
            lines += ["", f"{r['layout']}, per-shard keys warmup tuned in {r['warmup_s']:.1f} s "
                      f"(tuned after warmup: {r['tuned_after_warmup']}):", ""]
            lines += [f"- {key}" for key in r["tuned_keys"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
