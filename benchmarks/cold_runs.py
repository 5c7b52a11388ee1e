"""Cold tuned training runs in a loop: does any process die?

Each run is a fresh process with an empty tune store and no compilation cache, doing what
a user does: GPT-2-small (flax linen, ``benchmarks/model_step.py``) with bf16 parameters,
the plain training step compiled and run first, then ``nn.Dense(dot_general=
jat.dot_general)`` layers tuned by ``jat.warmup(loss, params, batch, grad=True)`` and their
jitted step run. A run that ends by a signal is a crash (SIGSEGV is -11).

    python benchmarks/cold_runs.py --out OUTDIR --runs 10 --parallel 2 [--layers 12]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from report import write_results


def child(layers: int, steps: int) -> dict:
    import jax
    import jax.numpy as jnp

    import jax_autotune as jat
    from model_step import MODELS, build

    sizes = dict(MODELS["gpt2"], layers=layers)
    row, start = {}, time.perf_counter()
    model, _, optimizer, plain_step = build("gpt2", "plain", sizes)
    _, loss, _, tuned_step = build("gpt2", "layers", sizes)
    tokens = jax.random.randint(jax.random.key(0), (sizes["batch"], sizes["seq"]), 0, sizes["vocab"])
    batch = (tokens, jnp.roll(tokens, -1, axis=1))
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), model.init(jax.random.key(1), tokens))
    opt_state = optimizer.init(params)
    losses = {}
    for name, step in (("plain", plain_step), ("tuned", tuned_step)):
        if name == "tuned":
            began = time.perf_counter()
            report = jat.warmup(loss, params, batch, grad=True)
            row["warmup_s"], row["keys"] = time.perf_counter() - began, len(report)
        p, s = params, opt_state
        began = time.perf_counter()
        for _ in range(steps):
            p, s, value = step(p, s, batch)
        losses[name] = float(value)
        row[f"{name}_s"] = time.perf_counter() - began
    row.update(losses=losses, seconds=time.perf_counter() - start, tuned=jat.stats()["tuned"])
    return row


def one_run(index: int, layers: int, steps: int, timeout_s: float) -> dict:
    env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=tempfile.mkdtemp(prefix=f"cold_run_{index}_"),
               JAX_AUTOTUNE_COMPILATION_CACHE="0", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--child", f"--layers={layers}", f"--steps={steps}"],
                              env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        code, out, err = "timeout", "", ""
    row = {"run": index, "exit": code, "wall_s": round(time.perf_counter() - start, 1)}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code == 0 and lines:
        row.update(json.loads(lines[-1]))
    else:
        row["stderr_tail"] = err.strip().splitlines()[-8:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=400)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.layers, args.steps)), flush=True)
        return
    with ThreadPoolExecutor(args.parallel) as pool:
        rows = []
        for row in pool.map(lambda i: one_run(i, args.layers, args.steps, args.timeout_s), range(args.runs)):
            rows.append(row)
            print(json.dumps(row), flush=True)
    import jax
    command = "python benchmarks/cold_runs.py " + " ".join(sys.argv[1:])
    crashed = [r for r in rows if isinstance(r["exit"], int) and r["exit"] < 0]
    failed = [r for r in rows if r["exit"] != 0]
    lines = [f"# Cold tuned runs, {datetime.date.today().isoformat()}", "",
             f"`{command}`, jax {jax.__version__}, {jax.devices()[0].device_kind}. GPT-2-small, "
             f"{args.layers} layers, bf16 parameters; each run a fresh process (empty store, no "
             f"compilation cache): the plain step, then warmup and the tuned step, {args.steps} steps each.",
             "", f"**{len(rows)} runs: {len(crashed)} crashed (by a signal), {len(failed)} did not end with 0.**", "",
             "| run | exit | wall s | warmup s | keys | plain loss | tuned loss |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = r.get("losses", {})
        lines.append(f"| {r['run']} | {r['exit']} | {r['wall_s']} | {r.get('warmup_s', 0):.1f} | {r.get('keys', '-')} "
                     f"| {loss.get('plain', float('nan')):.4f} | {loss.get('tuned', float('nan')):.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, f"cold_runs_{datetime.date.today().isoformat()}", text, {"rows": rows, "command": command})


if __name__ == "__main__":
    main()
