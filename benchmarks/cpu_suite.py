"""XLA's dot vs the tuned matmul on the CPU, side by side in one run.

    python benchmarks/cpu_suite.py [--out benchmarks/results] [--cores 1 2] [--quick]

For each core count (one process each, pinned with sched_setaffinity before jax starts,
so XLA's thread pool and ours see that many cores) and each case, the key is tuned first
(warmup, not timed), then XLA's dot and ``jax_autotune.matmul`` are timed alternately in
the same process: each sample is one executable running the matmul ``reps`` times
(``timing.compile_repeated``), the figure is the median of the samples. Ratios above 1
mean the tuned matmul is faster. Results: a markdown table and JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from report import geomean, write_results

CASES = [
    # (label, batch, m, n, k, group)
    ("4096x8x8x8", 4096, 8, 8, 8, "small-batched"),
    ("1024x16x16x16", 1024, 16, 16, 16, "small-batched"),
    ("256x32x32x32", 256, 32, 32, 32, "small-batched"),
    ("chain 200 x 8x8", 1, 8, 8, 8, "chain"),
    ("gemv 1x4096x4096", 1, 1, 4096, 4096, "gemv"),
    ("gemv 4096x1x4096", 1, 4096, 1, 4096, "gemv"),
    ("64^3", 1, 64, 64, 64, "square"),
    ("256^3", 1, 256, 256, 256, "square"),
    ("1000^3", 1, 1000, 1000, 1000, "square"),
    ("1024^3", 1, 1024, 1024, 1024, "square"),
    ("2048^3", 1, 2048, 2048, 2048, "square"),
]
QUICK = {"4096x8x8x8", "chain 200 x 8x8", "gemv 1x4096x4096", "256^3"}
CHAIN = 200


def _cpu_model() -> str:
    from jax_autotune.tuning.device import cpu_model
    return cpu_model()


def _time_case(batch, m, n, k, dtype, chain, samples):
    import jax
    import numpy as np

    import jax_autotune as jat
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.tuning.timing import compile_repeated, random_operands
    from jax_autotune.kernels.xla import xla_dot

    problem = MatmulProblem(batch, m, n, k, dtype, dtype, dtype)
    lhs, rhs = random_operands(problem, jax.devices("cpu")[0])
    if chain:
        scale = 1.0 / np.sqrt(k)

        def chained(mm):
            def fn(a, b, p):
                for _ in range(CHAIN):
                    a = mm(a, b, p) * scale
                return a
            return fn
        xla_fn = chained(xla_dot)
        tuned_fn = chained(lambda a, b, p: jat.matmul(a, b))
    else:
        xla_fn = xla_dot
        tuned_fn = lambda a, b, p: jat.matmul(a, b)  # noqa: E731
    report = jat.warmup(lambda a, b: tuned_fn(a, b, problem), lhs, rhs)
    winner = report.entries[0].winner if len(report) else "xla_dot"
    runners = {name: compile_repeated(lambda a, b, fn=fn: fn(a, b, problem), (lhs, rhs)) for name, fn in
               (("xla", xla_fn), ("tuned", tuned_fn))}
    # repetitions so one sample lasts ~20 ms
    once = {}
    for name, run in runners.items():
        jax.block_until_ready(run(lhs, rhs, np.int32(1)))
        start = time.perf_counter()
        jax.block_until_ready(run(lhs, rhs, np.int32(4)))
        once[name] = (time.perf_counter() - start) / 4
    reps = max(1, int(0.02 / max(min(once.values()), 1e-7)))
    times = {name: [] for name in runners}
    for _ in range(samples):  # alternate, so drift hits both alike
        for name, run in runners.items():
            start = time.perf_counter()
            jax.block_until_ready(run(lhs, rhs, np.int32(reps)))
            times[name].append((time.perf_counter() - start) / reps)
    per_call = CHAIN if chain else 1
    xla, tuned = (statistics.median(times[n]) / per_call for n in ("xla", "tuned"))
    return {"xla_us": xla * 1e6, "tuned_us": tuned * 1e6, "ratio": xla / tuned, "winner": winner,
            "reps": reps}


def run_child(args) -> None:
    os.sched_setaffinity(0, set(range(args.child_cores)))
    import jax
    import jax_autotune as jat

    rows = []
    for label, batch, m, n, k, group in CASES:
        if args.quick and label not in QUICK:
            continue
        for dtype in args.dtypes:
            result = _time_case(batch, m, n, k, dtype, group == "chain", args.samples)
            rows.append({"case": label, "group": group, "dtype": dtype, "cores": args.child_cores,
                         **result})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "jax": jax.__version__, "stats": jat.stats()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--child-cores", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_cores:
        run_child(args)
        return
    all_rows, jax_version = [], ""
    for cores in args.cores:
        cmd = [sys.executable, __file__, "--child-cores", str(cores), "--samples", str(args.samples),
               "--dtypes", *args.dtypes] + (["--quick"] if args.quick else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        all_rows += result["rows"]
        jax_version = result["jax"]
    date = datetime.date.today().isoformat()
    command = "python benchmarks/cpu_suite.py " + " ".join(sys.argv[1:])
    lines = [f"# CPU suite, {date}", "",
             f"CPU: {_cpu_model()}; {platform.python_implementation()} {platform.python_version()}; "
             f"jax {jax_version}.", f"Command: `{command}`", "",
             "Median time per matmul (us) of XLA's dot and of the tuned matmul, timed alternately "
             "in one process; ratio = XLA / tuned (above 1: tuned is faster). Rows whose winner "
             "is xla_dot time XLA's dot against itself: their distance from 1.00 is this "
             "machine's noise.", "",
             "| cores | case | dtype | XLA us | tuned us | ratio | winner |",
             "|---|---|---|---|---|---|---|"]
    for row in all_rows:
        lines.append(f"| {row['cores']} | {row['case']} | {row['dtype']} | {row['xla_us']:.2f} | "
                     f"{row['tuned_us']:.2f} | {row['ratio']:.2f} | {row['winner']} |")
    lines += ["", "| cores | group | geomean ratio | min ratio |", "|---|---|---|---|"]
    for cores in args.cores:
        for group in ("small-batched", "chain", "gemv", "square"):
            ratios = [r["ratio"] for r in all_rows if r["cores"] == cores and r["group"] == group]
            if ratios:
                lines.append(f"| {cores} | {group} | {geomean(ratios):.2f} | {min(ratios):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, f"cpu_suite_{date}", text,
                  {"date": date, "command": command, "cpu": _cpu_model(), "rows": all_rows})


if __name__ == "__main__":
    main()
