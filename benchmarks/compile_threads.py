"""Do candidate compiles overlap in threads? Pallas GEMMs of fresh shapes, compiled one
after another and three at a time, lowered in the compiling thread or beforehand, with
JAX's persistent compilation cache on or off (and the seconds its writes take).

    python benchmarks/compile_threads.py [--cache DIR]   # prints one JSON line
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time

os.environ.setdefault("JAX_AUTOTUNE_COMPILATION_CACHE", "0")


def lower_square(candidate, size: int, device):
    """``candidate`` lowered for a bf16 size^3 problem on fresh random operands."""
    import jax
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.tuning.timing import random_operands

    problem = MatmulProblem(1, size, size, size, "bfloat16", "bfloat16", "bfloat16")
    operands = random_operands(problem, device, seed=size)
    return jax.jit(lambda a, b: candidate.fn(a, b, problem)).lower(*operands)


def compile_seconds(lowered) -> float:
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def in_threads(fn, items) -> tuple[list, float]:
    """``fn`` over ``items``, one thread each: (each result, wall seconds)."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        each = list(pool.map(fn, items))
    return each, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="", help="a directory: JAX's persistent cache on, there")
    parser.add_argument("--count", type=int, default=3)
    args = parser.parse_args()
    import jax
    from jax._src import compiler
    from jax_autotune.registry import tuner_for

    if args.cache:
        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    writes: list[float] = []
    original_write = compiler._cache_write

    def timed_write(*a, **k):
        start = time.perf_counter()
        try:
            return original_write(*a, **k)
        finally:
            writes.append(time.perf_counter() - start)
    compiler._cache_write = timed_write

    tuner = tuner_for("gpu")
    gemm = tuner.candidate_set.by_name("triton_gemm_bm128_bn128_bk64_g8_w8_s3")
    sizes = iter(range(1536 + (64 * 40 if args.cache else 0), 9000, 64))
    device = tuner._jax_device()

    def lower(size):
        return lower_square(gemm, size, device)

    def lower_and_compile(size):
        return compile_seconds(lower(size))

    def threads(fn, items):
        each, wall = in_threads(fn, items)
        return {"each_s": each, "wall_s": wall}

    n = args.count
    compile_seconds(lower(next(sizes)))  # first compile of the process: warm-up
    result = {"cache": bool(args.cache),
              "serial_s": [lower_and_compile(next(sizes)) for _ in range(n)],
              "threads_lowering_inside": threads(lower_and_compile, [next(sizes) for _ in range(n)]),
              "threads_lowered_before": threads(compile_seconds, [lower(next(sizes)) for _ in range(n)])}
    result["cache_writes_s"] = writes
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
