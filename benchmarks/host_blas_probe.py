"""How numpy's threaded BLAS disturbs the host clock's samples right after it (``tuning.host_blas``).

    python benchmarks/host_blas_probe.py [--out benchmarks/results] [--cores 2] [--size 1000]

In one process pinned to ``--cores`` cores, XLA's dot of a float32 ``size``^3 matmul is
prepared as the tuner's host clock prepares a candidate (``WallClockTimer``), then sampled
``--samples`` times: quiet; right after the key's float64 reference (numpy, OpenBLAS on its
own threads); right after the same reference inside ``host_blas.single_threaded()``. Each
condition runs ``--repeats`` times, in turns. The median of each condition's samples, over
the quiet median, is what the reference costs the timing that follows it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.sched_setaffinity(0, set(range(args.cores)))

    import jax
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.registry import RUNTIME
    from jax_autotune.tuning import host_blas
    from jax_autotune.tuning.correctness import reference
    from jax_autotune.tuning.timing import WallClockTimer, random_operands
    from report import write_results

    n = args.size
    problem = MatmulProblem(1, n, n, n, "float32", "float32", "float32")
    lhs, rhs = random_operands(problem, jax.devices("cpu")[0])
    candidate = RUNTIME.tuner_for("cpu").candidate_set.by_name("xla_dot")
    measurement = WallClockTimer().prepare(candidate, problem, (lhs, rhs))

    def after(step):
        step()
        return [measurement.sample() for _ in range(args.samples)]

    def held_reference():
        with host_blas.single_threaded():
            reference(problem, lhs, rhs)

    conditions = {"quiet": lambda: None, "after the reference, numpy's threads": lambda: reference(problem, lhs, rhs),
                  "after the reference, one BLAS thread": held_reference}
    samples = {name: [] for name in conditions}
    for _ in range(args.repeats):
        for name, step in conditions.items():
            samples[name] += after(step)
    quiet = statistics.median(samples["quiet"])
    rows = [{"condition": name, "median_us": statistics.median(s) * 1e6, "over_quiet": statistics.median(s) / quiet,
             "max_us": max(s) * 1e6} for name, s in samples.items()]
    blas = host_blas._numpy_openblas()
    date = datetime.date.today().isoformat()
    command = "python benchmarks/host_blas_probe.py " + " ".join(sys.argv[1:])
    lines = [f"# Host BLAS probe, {date}", "", f"Command: `{command}` (jax {jax.__version__}; numpy's "
             f"OpenBLAS {'found, ' + str(blas.get()) + ' threads' if blas else 'not found'}).", "",
             f"XLA's dot, float32 {n}^3, {args.cores} cores, {args.samples} samples after each step, "
             f"{args.repeats} repeats in turns.", "",
             "| condition | median us | over quiet | max us |", "|---|---|---|---|"]
    lines += [f"| {r['condition']} | {r['median_us']:.0f} | {r['over_quiet']:.2f} | {r['max_us']:.0f} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, f"host_blas_probe_{date}", text, {"date": date, "command": command, "rows": rows})


if __name__ == "__main__":
    main()
