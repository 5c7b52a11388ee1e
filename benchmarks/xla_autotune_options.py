"""What XLA's options and batching do to its compile of a dot, and to the kernel it picks.

    python benchmarks/xla_autotune_options.py --out DIR [--keys bf16:1025,bf16:1000]

Every measurement runs in a fresh child process (XLA keeps each autotuned choice for the
process, so nothing may be cached):
* options: XLA's dot of each key compiled with one set of XLA options (``VARIANTS``),
  then again with XLA's defaults in the same process; compile seconds, the kernels the
  optimized HLO calls, and the device time of both executables (CUPTI);
* one key's XLA-based candidates (XLA's dot, the padded ones behind a barrier, the
  transposed one): compiled one after another, against one module holding all of them
  compiled first (one autotuning pass over every fusion) and then each alone;
* the same for XLA's dot of several keys (``--batch-keys``, a GPT-2 step's matmuls).
Writes xla_autotune_options.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("JAX_AUTOTUNE_COMPILATION_CACHE", "0")  # every compile is a real one
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

VARIANTS = {
    "default": {},
    "no_split_k": {"xla_gpu_experimental_force_split_k": 1},
    "level1": {"xla_gpu_autotune_level": 1},
    "cublas_only": {"xla_gpu_enable_triton_gemm": False},
    "serial": {"xla_gpu_force_compilation_parallelism": 1},
}
KEY_CANDIDATES = ("xla_dot", "padded_xla_dot_a64_barrier_rows", "padded_xla_dot_a8_barrier_rows",
                  "xla_transposed")
GPT2_KEYS = ("bf16:8192x2304x768,bf16:768x2304x8192,bf16:8192x768x2304,bf16:8192x768x768,"
             "bf16:768x768x8192,bf16:8192x3072x768,bf16:768x3072x8192,bf16:8192x768x3072,"
             "bf16:8192x50257x768,bf16:8192x768x50257,bf16:768x50257x8192")


def _setup():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    from jax_autotune.registry import tuner_for
    return jax, tuner_for(jax.default_backend())


def _problem(text):
    from cold_tune_timeline import parse_key
    from jax_autotune.problem import MatmulProblem
    dtype, m, n, k = parse_key(text)
    return MatmulProblem(1, m, n, k, dtype, dtype, dtype)


def _compile(jax, fn, args, options=None):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile(compiler_options=options or None)
    return compiled, time.perf_counter() - start


def _fn(candidate, problem):
    return lambda a, b: candidate.fn(a, b, problem)


def child_options(text: str, variant: str) -> dict:
    from xla_compile_cost import kernels_of
    import peers
    from jax_autotune.tuning.timing import random_operands
    jax, tuner = _setup()
    problem = _problem(text)
    args = random_operands(problem, tuner._jax_device(), seed=5)
    xla = tuner.candidate_set.by_name("xla_dot")
    first, first_s = _compile(jax, _fn(xla, problem), args, VARIANTS[variant])
    again, again_s = _compile(jax, _fn(xla, problem), args)  # XLA's defaults, same process
    us, again_us = peers.interleaved_device_us([first, again], args)
    return {"key": text, "variant": variant, "compile_s": first_s, "kernels": kernels_of(first), "us": us,
            "default_after_s": again_s, "default_after_kernels": kernels_of(again),
            "default_after_us": again_us}


def _operands(tuner, texts):
    from jax_autotune.tuning.timing import random_operands
    problems = [_problem(t) for t in texts]
    return problems, [random_operands(p, tuner._jax_device(), seed=5 + i) for i, p in enumerate(problems)]


def child_batch(pairs: list[tuple[str, str]], batched: bool) -> dict:
    """``pairs`` of (key, candidate): each compiled alone, one after another; with
    ``batched``, one module of all of them compiled first."""
    from xla_compile_cost import kernels_of
    import peers
    jax, tuner = _setup()
    texts = sorted({t for t, _ in pairs})
    problems, operands = _operands(tuner, texts)
    by_key = dict(zip(texts, zip(problems, operands)))
    names = {c.name for c in tuner.candidate_set.candidates}
    runnable = [(t, c) for t, c in pairs
                if c in names and tuner.candidate_set.by_name(c).runs(tuner.device, by_key[t][0].key())]
    result = {"batched": batched, "pairs": runnable}
    if batched:
        flat = [x for t, _ in runnable for x in by_key[t][1]]

        def everything(*xs):
            return tuple(tuner.candidate_set.by_name(c).fn(xs[2 * i], xs[2 * i + 1], by_key[t][0])
                         for i, (t, c) in enumerate(runnable))
        _, result["batch_compile_s"] = _compile(jax, everything, flat)
    rows = []
    for t, c in runnable:
        problem, args = by_key[t]
        compiled, seconds = _compile(jax, _fn(tuner.candidate_set.by_name(c), problem), args)
        us, = peers.interleaved_device_us([compiled], args)
        rows.append({"key": t, "candidate": c, "compile_s": seconds, "kernels": kernels_of(compiled), "us": us})
    result["rows"] = rows
    result["singles_compile_s"] = sum(r["compile_s"] for r in rows)
    return result


def _child(args: list[str], timeout_s: float, env: dict | None = None) -> dict:
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args],
                              capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s", "args": args}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return {"error": done.stderr[-1500:], "args": args}
    row = json.loads(lines[-1])
    if env:  # the child's log lines (XLA's VLOG) that say what its autotuner did
        row["log"] = [line for line in done.stderr.splitlines()
                      if any(w in line for w in ("onfig", "utotun", "hread", "ompil"))][-400:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="required, except in a child")
    parser.add_argument("--keys", default="bf16:1025,bf16:8192x768x50257,bf16:4097,bf16:1000")
    parser.add_argument("--batch-keys", default=GPT2_KEYS)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        kind, *rest = args.child
        if kind == "options":
            print(json.dumps(child_options(*rest)))
        else:
            pairs = json.loads(rest[0])
            print(json.dumps(child_batch([tuple(p) for p in pairs], kind == "batched")))
        return
    if not args.out:
        parser.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    keys = [k for k in args.keys.split(",") if k]
    report = {"options": [], "key_batches": [], "vlog": None}
    started = time.perf_counter()
    for text in keys:
        for variant in args.variants.split(","):
            row = _child(["options", text, variant], 120)
            report["options"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
    for text in keys[:2]:
        pairs = json.dumps([(text, c) for c in KEY_CANDIDATES])
        for kind in ("separate", "batched"):
            row = _child([kind, pairs], 150)
            report["key_batches"].append(row)
            print(json.dumps(row), flush=True)
    pairs = json.dumps([(t, "xla_dot") for t in args.batch_keys.split(",") if t])
    report["model_batches"] = [_child([kind, pairs], 240) for kind in ("separate", "batched")]
    for row in report["model_batches"]:
        print(json.dumps(row), flush=True)
    report["vlog"] = _child(["options", keys[0], "default"], 120, env={
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "gemm_fusion_autotuner=2,autotuner=2,autotuner_pass=2,autotuner_util=2"})
    report["seconds"] = time.perf_counter() - started
    import jax
    report["jax"] = jax.__version__
    with open(os.path.join(args.out, "xla_autotune_options.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
