"""``jax-autotune shapes``: the reference's cold/warm experiment, on this machine.

    $ jax-autotune shapes 1024 768 1000 2048 [--dtype float32] [--cache-dir DIR]

Runs the shapes in two fresh processes sharing one new, empty cache folder (made inside
``--cache-dir`` when given, which is otherwise left alone): process 1 starts cold,
process 2 warm. Per shape: the first call (random operands
synced first; the time covers trace, tuning, compile and run), the next 20 calls' min
and median, and the counters of that first call: keys tuned, candidate runs, probe
launches, XLA compiles (candidates' included) and executables served by JAX's compilation
cache instead of compiled.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_autotune.api import dot_general, matmul
from jax_autotune.cli.keys import operand_shapes
from jax_autotune.tuning.compile_cache import CompileCounter
from jax_autotune.tuning.counters import stats
from jax_autotune.tuning.store import store_location
import jax_autotune.config as config

NEXT_CALLS = 20


def _measure_child(shapes: list[str], dtype: str) -> list[dict]:
    """One process's measurements (runs in the child)."""
    counter = CompileCounter()
    rng = np.random.default_rng(0)
    rows = []
    for text in shapes:
        lhs_shape, rhs_shape, transpose_b = operand_shapes(text)
        a = jnp.asarray(rng.standard_normal(lhs_shape), dtype)
        b = jnp.asarray(rng.standard_normal(rhs_shape), dtype)
        jax.block_until_ready((a, b))
        if transpose_b:
            f = jax.jit(lambda x, y: dot_general(x, y, (((x.ndim - 1,), (y.ndim - 1,)),
                                                            (tuple(range(x.ndim - 2)),) * 2)))
        else:
            f = jax.jit(matmul)
        before, compiles_before, hits_before = stats(), counter.compiles, counter.hits
        start = time.perf_counter()
        jax.block_until_ready(f(a, b))
        first = time.perf_counter() - start
        after, compiles_after, hits_after = stats(), counter.compiles, counter.hits
        times = []
        for _ in range(NEXT_CALLS):
            start = time.perf_counter()
            jax.block_until_ready(f(a, b))
            times.append(time.perf_counter() - start)
        rows.append({
            "shape": text, "first_s": first, "min_s": min(times), "median_s": statistics.median(times),
            "tuned": after["tuned"] - before["tuned"],
            "candidate_runs": after["candidate_runs"] - before["candidate_runs"],
            "probe_launches": after["probe_launches"] - before["probe_launches"],
            "compiles": compiles_after - compiles_before,
            "cache_hits": hits_after - hits_before,
            "store_hits": after["store_hits"] - before["store_hits"],
            "memory_hits": after["memory_hits"] - before["memory_hits"],
        })
    return rows


def _seconds(value: float) -> str:
    return f"{value:.3f}s" if value >= 1 else f"{value * 1e3:.3f}ms"


def format_rows(title: str, rows: list[dict]) -> list[str]:
    lines = [f"## {title}"]
    for row in rows:
        text = row["shape"]
        label = f"{text}x{text}" if text.isdigit() else text  # squares as the reference prints them
        lines.append(f"{label:>10} first: {_seconds(row['first_s']):>10}  tuned={row['tuned']} "
                     f"candidate_runs={row['candidate_runs']} probe_launches={row['probe_launches']} "
                     f"compiles={row['compiles']} cache_hits={row.get('cache_hits', 0)} "
                     f"store_hits={row['store_hits']}")
        lines.append(f"{label:>10} next {NEXT_CALLS}: min {_seconds(row['min_s'])} "
                     f"median {_seconds(row['median_s'])}")
    return lines


def fresh_cache_dir(parent: str | None) -> str:
    """A new, empty folder for the experiment's store: inside ``parent`` (created if
    missing; nothing in it is touched) or in the system's temp folder.

        >>> fresh_cache_dir("runs")
        'runs/jax_autotune_shapes_k2x8'
    """
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="jax_autotune_shapes_", dir=parent)


def disk_backend() -> str:
    """The store backend the experiment uses: the configured one, SQLite for ``memory``
    (a warm process needs a store to be warm)."""
    backend = config.get("store")
    return "sqlite" if backend == "memory" else backend


def run_experiment(shapes: list[str], dtype: str, cache_dir: str) -> dict[str, list[dict]]:
    """Run the shapes cold and warm in two fresh processes sharing the store in
    ``cache_dir`` (pass an empty folder, e.g. ``fresh_cache_dir``: it is never emptied)."""
    env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=cache_dir, JAX_AUTOTUNE_CACHE="1",
               JAX_AUTOTUNE_ENVIRONMENT="default", JAX_AUTOTUNE_STORE=disk_backend(),
               JAX_AUTOTUNE_MODE="tune")
    results = {}
    for name in ("cold", "warm"):
        completed = subprocess.run(
            [sys.executable, "-P", "-m", "jax_autotune", "shapes", "--child", "--dtype", dtype, *shapes],
            env=env, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(f"the {name} process failed:\n{completed.stderr[-4000:]}")
        results[name] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


def run(args) -> int:
    if args.child:
        print(json.dumps(_measure_child(args.shapes, args.dtype)))
        return 0
    try:
        cache_dir = fresh_cache_dir(args.cache_dir)
    except OSError as err:
        print(f"jax-autotune: shapes: cannot make a folder in --cache-dir {args.cache_dir}: {err}",
              file=sys.stderr)
        return 1
    print(f"database: {store_location(disk_backend(), cache_dir, 'default')}", file=sys.stderr)
    results = run_experiment(args.shapes, args.dtype, cache_dir)
    lines = (format_rows("process 1: cold cache", results["cold"])
             + format_rows("process 2: warm cache", results["warm"]))
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"dtype": args.dtype, "cache_dir": cache_dir, **results}, f, indent=2)
    return 0

