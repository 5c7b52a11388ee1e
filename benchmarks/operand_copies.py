"""Dots whose operands the program copies (attention's bqhd einsums), plain against tuned.

Each case is jitted as lax writes it (plain) and through the tuner: ``jat.dot_general`` for
the bare scores, ``jat.autotune`` for the attention in its context (forward, and forward +
backward), warmed up first. Prints one JSON line per case: the median ms of each, plain /
tuned, each key's decision and the program check's line. The tune store is the configured
one: give each run a fresh ``JAX_AUTOTUNE_CACHE_DIR``. Run it under two installs of the
package to compare them (the ratios within one run are what compares).

    python benchmarks/operand_copies.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_autotune as jat

SCORES = (((3,), (3,)), ((0, 2), (0, 2)))  # einsum("bqhd,bkhd->bhqk")


def _median_ms(fn, *args, runs: int = 30) -> float:
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def _scores_in_context(dot, q, k, v):
    """Attention over a cache: scores, scale, mask, softmax, weighted values (as step_models)."""
    s = dot(q, k, SCORES) / q.shape[-1] ** 0.5
    mask = jnp.arange(k.shape[1])[None, :] <= k.shape[1] // 2
    w = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", w, v)


def cases():
    key = iter(jax.random.split(jax.random.key(0), 8))
    normal = lambda shape: jax.random.normal(next(key), shape, jnp.float32)  # noqa: E731
    q1, cache_k, cache_v = normal((8, 1, 16, 128)), normal((8, 1024, 16, 128)), normal((8, 1024, 16, 128))
    yield ("decode scores bare, q (8,1,16,128) x cache (8,1024,16,128)",
           jax.jit(lambda q, k: jax.lax.dot_general(q, k, SCORES)),
           jax.jit(lambda q, k: jat.dot_general(q, k, SCORES)), (q1, cache_k))
    plain = lambda q, k, v: _scores_in_context(jax.lax.dot_general, q, k, v)  # noqa: E731
    yield ("decode attention in context (scores, mask, softmax, values)",
           jax.jit(plain), jax.jit(jat.autotune(plain)), (q1, cache_k, cache_v))
    q, k = normal((4, 197, 12, 64)), normal((4, 197, 12, 64))
    yield ("encoder scores bare, (4,197,12,64) both operands copied",
           jax.jit(lambda q, k: jax.lax.dot_general(q, k, SCORES)),
           jax.jit(lambda q, k: jat.dot_general(q, k, SCORES)), (q, k))
    v = normal((4, 197, 12, 64))
    grad_plain = jax.grad(lambda q, k, v: jnp.sum(_scores_in_context(jax.lax.dot_general, q, k, v) ** 2),
                          argnums=(0, 1, 2))
    yield ("encoder attention forward + backward in context",
           jax.jit(grad_plain), jax.jit(jat.autotune(grad_plain)), (q, k, v))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    rows = []
    for name, plain, tuned, inputs in cases():
        report = jat.warmup(tuned, *inputs)
        plain_ms, tuned_ms = _median_ms(plain, *inputs), _median_ms(tuned, *inputs)
        ref = jax.tree_util.tree_leaves(plain(*inputs))
        got = jax.tree_util.tree_leaves(tuned(*inputs))
        err = max(float(np.abs(np.asarray(a) - np.asarray(b)).max() / (np.abs(np.asarray(a)).max() + 1e-30))
                  for a, b in zip(ref, got))
        row = {"case": name, "plain_ms": round(plain_ms, 4), "tuned_ms": round(tuned_ms, 4),
               "plain_over_tuned": round(plain_ms / tuned_ms, 3),
               "decisions": [f"{e.key.describe()}: {e.winner}" for e in report],
               "program": str(report.program) if report.program is not None else "",
               "max_relative_error": err, "jax": jax.__version__, "jax_autotune": jat.__file__}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
