"""What XLA's GEMM autotuner costs a tuning, and what it buys, per XLA-based candidate.

    python benchmarks/xla_compile_cost.py --out DIR [--keys bf16:1025,bf16:8192x50257x768]

For each key and each candidate that compiles an XLA dot (XLA's dot, the padded ones
behind a barrier, XLA's dot of the transposed problem), side by side in one process:
* compile seconds with XLA's defaults (its GEMM autotuner runs and times kernels on the
  device) and with ``xla_gpu_autotune_level=0`` (no kernel runs while compiling);
* the device time of both executables (CUPTI, alternating rounds), and which kernel each
  one runs (a cuBLAS call or a generated fusion);
* the cuBLASLt variants on the same padded rows, for comparison.
``--bare-first`` compiles without the autotuner first: its kernel is then the one XLA
picks cold, and the default compile after it shows whether that pick was cached for the
process. Then the thread test: Pallas GEMMs of fresh shapes compiled one after another
and in threads (lowered beforehand, so only XLA's compile is timed), and an autotuned
XLA dot compiled alone and beside them. Writes xla_compile_cost.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

os.environ.setdefault("JAX_AUTOTUNE_COMPILATION_CACHE", "0")  # every compile is a real one
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import peers  # noqa: E402
from cold_tune_timeline import parse_key  # noqa: E402

NO_AUTOTUNE = {"xla_gpu_autotune_level": 0}
XLA_CANDIDATES = ("xla_dot", "padded_xla_dot_a64_barrier_rows", "padded_xla_dot_a8_barrier_rows",
                  "xla_transposed")
COMPARED = ("padded_cublaslt_a64_rows", "cublaslt_algo0")


def kernels_of(compiled) -> list[str]:
    """The GEMM implementations an executable's optimized HLO calls."""
    text = compiled.as_text()
    found = sorted(set(re.findall(r'custom_call_target="(__cublas[^"]*)"', text)))
    if '"kind":"__triton_gemm"' in text or "__triton_gemm" in text:
        found.append("triton_gemm_fusion")
    if "__triton_nested_gemm_fusion" in text or '"kind":"__triton_nested' in text:
        found.append("triton_nested_gemm_fusion")
    return found or ["other"]


def compile_timed(fn, args, options=None):
    import jax
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile(compiler_options=options)
    return compiled, time.perf_counter() - start


def one_key(tuner, text: str, bare_first: bool) -> dict:
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.tuning.timing import random_operands

    dtype, m, n, k = parse_key(text)
    problem = MatmulProblem(1, m, n, k, dtype, dtype, dtype)
    args = random_operands(problem, tuner._jax_device(), seed=5)
    rows, executables, names = [], [], []
    for name in XLA_CANDIDATES:
        candidate = tuner.candidate_set.by_name(name)
        if not candidate.runs(tuner.device, problem.key()):
            continue
        # fresh closures: nothing is served from jit's in-memory cache
        def fresh(options, c=candidate):
            return compile_timed(lambda a, b: c.fn(a, b, problem), args, options)
        if bare_first:
            (bare, bare_s), (default, default_s) = fresh(NO_AUTOTUNE), fresh(None)
        else:
            (default, default_s), (bare, bare_s) = fresh(None), fresh(NO_AUTOTUNE)
        rows.append({"candidate": name, "compile_s": default_s, "compile_no_autotune_s": bare_s,
                     "kernels": kernels_of(default), "kernels_no_autotune": kernels_of(bare)})
        executables += [default, bare]
        names += [(name, "us"), (name, "us_no_autotune")]
    for name in COMPARED:
        candidate = tuner.candidate_set.by_name(name)
        if candidate.runs(tuner.device, problem.key()):
            compiled, seconds = compile_timed(lambda a, b, c=candidate: c.fn(a, b, problem), args)
            rows.append({"candidate": name, "compile_s": seconds})
            executables.append(compiled)
            names.append((name, "us"))
    times = peers.interleaved_device_us(executables, args)
    by_name = {r["candidate"]: r for r in rows}
    for (name, field), us in zip(names, times):
        by_name[name][field] = us
    for r in rows:
        print(f"{text:22s} {r['candidate']:34s} " + " ".join(
            f"{f}={r[f]:.3f}" if isinstance(r.get(f), float) else f"{f}={r.get(f)}"
            for f in ("compile_s", "compile_no_autotune_s", "us", "us_no_autotune", "kernels", "kernels_no_autotune")
            if f in r), flush=True)
    return {"key": text, "rows": rows}


def threads_test(tuner, count: int = 3) -> dict:
    """Compile seconds of fresh Pallas GEMMs one after another, then in threads; then an
    autotuned XLA dot alone and beside Pallas compiles (each on a shape not seen before)."""
    from compile_threads import compile_seconds, in_threads, lower_square

    gemm = tuner.candidate_set.by_name("triton_gemm_bm128_bn128_bk64_g8_w8_s3")
    device = tuner._jax_device()
    sizes = iter(range(1536, 4096, 64))

    def lowered(candidate, size):
        return lower_square(candidate, size, device)

    def together(lows):
        return in_threads(compile_seconds, lows)

    result = {"pallas_serial_s": [compile_seconds(lowered(gemm, next(sizes))) for _ in range(count)]}
    result["pallas_threads_s"], result["pallas_threads_wall_s"] = together(
        [lowered(gemm, next(sizes)) for _ in range(count)])
    xla = tuner.candidate_set.by_name("xla_dot")
    result["xla_alone_s"] = compile_seconds(lowered(xla, next(sizes) + 1))  # misaligned: a long autotune
    each, wall = together([lowered(xla, next(sizes) + 1)] + [lowered(gemm, next(sizes)) for _ in range(count)])
    result["xla_beside_pallas_s"], result["pallas_beside_xla_s"], result["beside_wall_s"] = each[0], each[1:], wall
    print("threads", json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--bare-first", action="store_true", help="compile without the autotuner first")
    parser.add_argument("--threads-test", action="store_true")
    parser.add_argument("--keys", default="bf16:1025,bf16:2049,bf16:8192x50257x768,bf16:8192x768x50257,"
                                          "bf16:4096x32001x4096,f32:1025,bf16:1000,bf16:1024")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import jax
    from jax_autotune.registry import tuner_for

    tuner = tuner_for(jax.default_backend())
    report = {"jax": jax.__version__, "bare_first": args.bare_first,
              "keys": [one_key(tuner, text, args.bare_first) for text in filter(None, args.keys.split(","))]}
    if args.threads_test:
        report["threads"] = threads_test(tuner)
    name = "xla_compile_cost_bare_first.json" if args.bare_first else "xla_compile_cost.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
