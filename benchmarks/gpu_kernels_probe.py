"""Check and time the GPU candidate kernels next to XLA's dot, on the device.

For each probe shape and dtype it takes the candidates the plan would run for the key
(the top tier of the first non-skipped group, marked R) plus the top tiers of the other
non-skipped groups (marked x, to see what wins elsewhere), compiles them in parallel
threads, checks each against an f32 HIGHEST XLA reference and times the good ones by
device time (CUPTI, ``jax.experimental.mosaic.gpu.profiler.measure``).

    PYTHONPATH=. python3 benchmarks/gpu_kernels_probe.py --out DIR [--quick]
    PYTHONPATH=. python3 benchmarks/gpu_kernels_probe.py --out DIR --experiment 1   # or 2

``--experiment N`` skips the candidate set and times the performance pass's explicit
candidates for the goal shapes instead (``experiment_cases``, ``experiment_cases_2``),
writing ``DIR/gpu_kernels_experiment.json``.

Writes ``DIR/gpu_kernels_probe.json`` (every candidate's result) and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jax_autotune.tuning.device import device_info  # noqa: E402
from jax_autotune.kernels.gpu import mosaic as mosaic_kernels  # noqa: E402
from jax_autotune.kernels.gpu.candidates import gpu_candidate_set  # noqa: E402
from jax_autotune.key import Precision  # noqa: E402
from jax_autotune.problem import MatmulProblem  # noqa: E402
from jax_autotune.tuning.candidates import Candidate  # noqa: E402
from jax_autotune.kernels.xla import XLA_DOT_NAME, xla_dot  # noqa: E402

SHAPES = [(768, 768, 768), (1000, 1000, 1000), (1025, 1025, 1025), (1024, 1024, 1024),
          (4096, 4096, 4096), (16, 8192, 8192), (128, 8192, 8192), (8192, 8192, 128),
          (1, 4096, 4096)]
# (batch, m, n, k, dtype, precision, transpose_a, transpose_b): the other paths
EXTRA = [(1, 1000, 1000, 1000, "float32", "HIGHEST", False, False),
         (1, 1025, 1025, 1025, "float32", "HIGHEST", False, False),
         (1, 1000, 1000, 1000, "bfloat16", "DEFAULT", True, False),
         (1, 1000, 1000, 1000, "bfloat16", "DEFAULT", False, True),
         (1, 768, 768, 768, "float32", "DEFAULT", True, True),
         (1, 4096, 1, 4096, "float32", "HIGHEST", False, False),
         (3, 257, 129, 1025, "bfloat16", "DEFAULT", True, True)]
TOLERANCE = {("bfloat16", "DEFAULT"): 1e-2, ("float32", "DEFAULT"): 3e-3,
             ("float32", "HIGHEST"): 1e-5}
ITERATIONS = 20


def plan_for(cset, device, key):
    """(marker, group, candidate): R for the plan's first round, x for other groups' top
    tiers (every tier of triton_gemm for keys up to 2048 x 2048, to compare profiles)."""
    members = {}
    for membership in cset.memberships:
        members.setdefault(membership.group, []).append(membership)
    groups = sorted((g for g in cset.groups if g.priority(key) >= 0),
                    key=lambda g: (-g.priority(key), g.index))
    chosen, seen = [], set()
    for rank, group in enumerate(groups):
        tiers = [(m.priority(key), m.candidate) for m in members.get(group.name, [])]
        runnable = [(p, name) for p, name in tiers
                    if p >= 0 and cset.by_name(name).supports(device, key)]
        if not runnable:
            continue
        top = max(p for p, _ in runnable)
        every_tier = group.name == "triton_gemm" and key.m * key.n <= 2 ** 22
        for p, name in runnable:
            if (p == top or every_tier) and name not in seen:
                seen.add(name)
                marker = "R" if rank == 0 and p == top else "x"
                chosen.append((marker, group.name, cset.by_name(name)))
    return chosen


def rel_error(out, ref) -> float:
    out = jnp.asarray(out, jnp.float32)
    return float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))


def measure_us(compiled, args) -> tuple[float, str]:
    """Median device time in microseconds, by CUPTI; a host loop only if CUPTI fails."""
    try:
        from jax.experimental.mosaic.gpu import profiler
        _, times_ms = profiler.measure(compiled, iterations=ITERATIONS)(*args)
        if times_ms:
            return statistics.median(times_ms) * 1e3, "cupti"
    except Exception as err:  # noqa: BLE001
        print(f"  profiler.measure failed ({type(err).__name__}: {err}); host loop", flush=True)
    jax.block_until_ready(compiled(*args))
    start = time.perf_counter()
    for _ in range(200):
        out = compiled(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / 200 * 1e6, "host_loop"


def short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()
    return " ".join(text[:3])[:400]


def probe_case(problem: MatmulProblem, device, cset, seed: int, records: list, explore: bool,
               explore_groups=()):
    key = problem.key("balanced")
    entries = [("B", "baseline", cset.baseline)] + [
        e for e in plan_for(cset, device, key) if explore or e[0] == "R"]
    named = {e[2].name for e in entries}
    for m in cset.memberships:
        cand = cset.by_name(m.candidate)
        if m.group in explore_groups and m.candidate not in named and cand.supports(device, key):
            named.add(m.candidate)
            entries.append(("x", m.group, cand))
    probe_entries(problem, entries, seed, records)


def probe_entries(problem: MatmulProblem, entries, seed: int, records: list):
    """Compile ``entries`` in 8 threads, check each against f32 HIGHEST, time the good ones."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(k1, problem.lhs_shape, jnp.float32).astype(problem.lhs_dtype)
    rhs = jax.random.normal(k2, problem.rhs_shape, jnp.float32).astype(problem.rhs_dtype)
    ref = jax.jit(lambda a, b: xla_dot(a.astype(jnp.float32), b.astype(jnp.float32),
                                       problem, Precision.HIGHEST).astype(jnp.float32))(lhs, rhs)
    tol = TOLERANCE[(problem.lhs_dtype, problem.precision.value if problem.lhs_dtype == "float32"
                     else "DEFAULT")]

    def compile_one(entry):
        marker, group, cand = entry
        start = time.perf_counter()
        try:
            fn = jax.jit(lambda a, b, cand=cand: cand.fn(a, b, problem))
            return entry, fn.lower(lhs, rhs).compile(), None, time.perf_counter() - start
        except Exception as err:  # noqa: BLE001 - every failure is that candidate's result
            return entry, None, err, time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        compiled = list(pool.map(compile_one, entries))
    batch = f"{problem.batch}x" if problem.batch > 1 else ""
    label = (f"{problem.lhs_dtype} {problem.precision.value} {batch}{problem.m}x{problem.n}x{problem.k}"
             f"{' tA' if problem.transpose_a else ''}{' tB' if problem.transpose_b else ''}")
    for (marker, group, cand), exe, err, compile_s in compiled:
        rec = dict(case=label, problem=problem.to_json(), candidate=cand.name, group=group,
                   marker=marker, compile_s=round(compile_s, 3), tolerance=tol)
        if err is not None:
            rec.update(status="compile_error", error=short(err))
        else:
            try:
                out = exe(lhs, rhs)
                err_val = rel_error(out, ref)
                rec["rel_error"] = err_val
                if not np.isfinite(err_val) or err_val > tol:
                    rec["status"] = "wrong"
                else:
                    rec["time_us"], rec["timer"] = measure_us(exe, (lhs, rhs))
                    rec["status"] = "ok"
            except Exception as run_err:  # noqa: BLE001
                rec.update(status="run_error", error=short(run_err))
        if cand.cost is not None:
            rec["cost_model_us"] = round(cand.cost(problem) * 1e6, 2)
        records.append(rec)
        shown = (f"{rec['time_us']:9.1f} us" if "time_us" in rec else f"{rec['status']:>12}")
        print(f"  {marker} {cand.name:52s} {shown} err={rec.get('rel_error', float('nan')):.1e}"
              f" compile={compile_s:.2f}s {rec.get('error', '')[:160]}", flush=True)


# ---------------------------------------------------------------- --experiment

def experiment_cases():
    """(problem, [(name, fn)]) for the performance pass: explicit candidates per goal shape.

    Ordered by what is at stake, so a budget cut drops the least important cases.
    """
    from jax_autotune.kernels.gpu.packed import packed_gemm
    from jax_autotune.kernels.gpu.padded import padded
    from jax_autotune.kernels.gpu.triton import GemmConfig, gemm
    from jax_autotune.kernels.gpu.xla_variants import xla_transposed

    def g(bm, bn, bk, w, s, sk=1):
        return GemmConfig(bm, bn, bk, 8, w, s, sk)

    def tri(cfg):
        return (f"triton_gemm_{cfg.name}", lambda a, b, p, c=cfg: gemm(a, b, p, c))

    def pk(cfg, k_major):
        return (f"packed_{'kmajor' if k_major else 'asis'}_{cfg.name}",
                lambda a, b, p, c=cfg: packed_gemm(a, b, p, c, k_major=k_major))

    xt = ("xla_transposed", xla_transposed)
    pad8 = ("padded_xla_dot_a8", padded(xla_dot, 8))
    f32_medium = [g(64, 128, 32, 4, 4), g(128, 64, 32, 4, 4), g(64, 64, 32, 4, 4),
                  g(128, 128, 32, 8, 3)]
    bf16_medium = [g(64, 128, 64, 4, 4), g(128, 64, 64, 4, 4), g(64, 64, 64, 4, 4),
                   g(128, 128, 64, 8, 3)]

    def P(m, n, k, dt, prec="DEFAULT"):
        return MatmulProblem(1, m, n, k, dt, dt, dt, precision=prec)

    f, b = "float32", "bfloat16"
    return [
        (P(768, 768, 768, f), [pk(c, True) for c in f32_medium]
         + [pk(g(64, 64, 64, 4, 3), True), pk(g(64, 128, 32, 4, 4), False), xt]),
        (P(1000, 1000, 1000, f), [pk(c, True) for c in f32_medium] + [xt]),
        (P(1025, 1025, 1025, f), [pk(c, True) for c in f32_medium] + [pad8]),
        (P(8192, 8192, 128, f), [pk(c, True) for c in (
            g(128, 128, 32, 4, 3), g(128, 256, 32, 8, 3), g(256, 128, 32, 8, 3),
            g(128, 128, 64, 4, 2), g(128, 256, 64, 8, 2))] + [xt]),
        (P(128, 8192, 8192, f), [xt]),
        (P(1025, 1025, 1025, b), [pk(c, False) for c in bf16_medium] + [pad8, xt]),
        (P(8192, 8192, 128, b), [tri(c) for c in (
            g(128, 256, 64, 8, 2), g(256, 128, 64, 8, 2), g(128, 128, 64, 4, 2),
            g(64, 256, 64, 4, 2), g(128, 128, 64, 8, 3))] + [xt]),
        (P(1000, 1000, 1000, b), [tri(c) for c in bf16_medium]
         + [pk(g(128, 64, 64, 4, 4), False), pk(g(64, 128, 64, 4, 4), False), xt]),
        (P(768, 768, 768, b), [tri(c) for c in bf16_medium] + [tri(g(64, 128, 64, 4, 3, 2)), xt]),
        (P(128, 8192, 8192, b), [tri(g(128, 64, 64, 4, 4)),
                                 tri(g(64, 128, 64, 4, 4)), tri(g(128, 128, 64, 8, 4, 2))]),
        (P(16, 8192, 8192, b), [tri(g(16, 64, 128, 4, 4)), tri(g(16, 128, 128, 4, 4)),
                                tri(g(16, 64, 256, 4, 3))]),
        (P(1000, 1000, 1000, f, "HIGHEST"), [pk(g(64, 128, 32, 4, 4), True)]),
    ]


def experiment_cases_2():
    """Round 2: XLA-level variants (fast to compile) next to round 1's winners.

    The split-K and explicit-algorithm XLA variants of that run lost on every shape
    (benchmarks/results/gpu_kernels_2026-11-29-perf-pass.md) and were removed.
    """
    from jax_autotune.kernels.gpu.packed import packed_gemm
    from jax_autotune.kernels.gpu.padded import padded
    from jax_autotune.kernels.gpu.triton import GemmConfig, gemm
    from jax_autotune.kernels.gpu.xla_variants import xla_transposed

    def P(m, n, k, dt, prec="DEFAULT"):
        return MatmulProblem(1, m, n, k, dt, dt, dt, precision=prec)

    def pb(align, fn=xla_dot, tag=""):
        return (f"padded_xla_dot{tag}_a{align}_barrier", padded(fn, align, barrier=True))

    xt = ("xla_transposed", xla_transposed)
    best_1025 = GemmConfig(128, 128, 64, 8, 8, 3)
    f, b = "float32", "bfloat16"
    return [
        (P(1025, 1025, 1025, f), [pb(8), pb(32), pb(64), pb(64, xla_transposed, "_T")]),
        (P(1025, 1025, 1025, b), [pb(8), pb(64), ("packed_asis_" + best_1025.name,
            lambda x, y, p: packed_gemm(x, y, p, best_1025, k_major=False))]),
        (P(128, 8192, 8192, f), [xt]),
        (P(1000, 1000, 1000, f), [pb(64)]),
        (P(128, 8192, 8192, b), [xt]),
        (P(16, 8192, 8192, b), [xt, ("triton_gemm_bm16_bn64_bk256_g8_w4_s3",
            lambda x, y, p: gemm(x, y, p, GemmConfig(16, 64, 256, 8, 4, 3)))]),
        (P(16, 8192, 8192, f), [xt]),
    ]


def run_experiment(args, started):
    records: list = []
    path = os.path.join(args.out, "gpu_kernels_experiment.json")
    cases = experiment_cases_2() if args.experiment == 2 else experiment_cases()
    for i, (problem, named) in enumerate(cases):
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            print(f"budget reached after {elapsed:.0f}s: skipping the rest", flush=True)
            break
        print(f"== {problem.lhs_dtype} {problem.precision.value} {problem.m}x{problem.n}x"
              f"{problem.k} [{elapsed:.0f}s]", flush=True)
        cands = [Candidate(XLA_DOT_NAME, xla_dot)] + [Candidate(n, fn) for n, fn in named]
        entries = [("B" if c.name == XLA_DOT_NAME else "x", "experiment", c) for c in cands]
        try:
            probe_entries(problem, entries, 1000 + i, records)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        with open(path, "w") as f:
            json.dump(dict(jax=jax.__version__, records=records), f, indent=1)
    summarize(records)
    print(f"total {time.perf_counter() - started:.0f}s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--quick", action="store_true", help="plan rounds only, no exploring")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--only", default="", help="cases like b1x1000x1000x1000,f3x257x129x1025")
    parser.add_argument("--experiment", type=int, default=0,
                        help="1 or 2: the performance pass's explicit candidates per goal shape")
    parser.add_argument("--explore-groups", default="",
                        help="comma list of groups whose every member also runs (marked x)")
    args = parser.parse_args()
    started = time.perf_counter()
    device = device_info(jax.devices()[0])
    print(f"jax {jax.__version__}; {device}; mosaic available={mosaic_kernels.AVAILABLE} "
          f"{mosaic_kernels.IMPORT_ERROR or ''}", flush=True)
    if args.experiment:
        return run_experiment(args, started)
    cset = gpu_candidate_set(device)
    records: list = []
    path = os.path.join(args.out, "gpu_kernels_probe.json")
    cases = [MatmulProblem(1, m, n, k, dt, dt, dt, precision="DEFAULT")
             for dt in ("bfloat16", "float32") for m, n, k in SHAPES]
    cases += [MatmulProblem(b, m, n, k, dt, dt, dt, ta, tb, prec)
              for b, m, n, k, dt, prec, ta, tb in EXTRA]
    if args.only:
        cases = [p for p in cases if any(s == f"{p.lhs_dtype[0]}{p.batch}x{p.m}x{p.n}x{p.k}"
                                         for s in args.only.split(","))]
    for i, problem in enumerate(cases):
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            print(f"budget reached after {elapsed:.0f}s: skipping the rest", flush=True)
            break
        explore = not args.quick and i < 2 * len(SHAPES) and not args.only
        print(f"== {problem.lhs_dtype} {problem.precision.value} {problem.m}x{problem.n}x"
              f"{problem.k} tA={problem.transpose_a} tB={problem.transpose_b} "
              f"key={problem.key('balanced').canonical()} [{elapsed:.0f}s]", flush=True)
        try:
            probe_case(problem, device, cset, i, records, explore,
                       [g for g in args.explore_groups.split(",") if g])
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        with open(path, "w") as f:
            json.dump(dict(jax=jax.__version__, device=str(device), records=records), f, indent=1)
    summarize(records)
    print(f"total {time.perf_counter() - started:.0f}s")


def summarize(records):
    print("\n| case | XLA us | best kernel us | best kernel | speedup | plan-round best | failed |")
    print("|---|---|---|---|---|---|---|")
    cases = []
    for r in records:
        if "problem" in r and r["case"] not in cases:
            cases.append(r["case"])
    for case in cases:
        rows = [r for r in records if r.get("case") == case]
        xla = next((r for r in rows if r["marker"] == "B" and r.get("status") == "ok"), None)
        ok = [r for r in rows if r["marker"] != "B" and r.get("status") == "ok"]
        best = min(ok, key=lambda r: r["time_us"], default=None)
        round_ok = [r for r in ok if r["marker"] == "R"]
        round_best = min(round_ok, key=lambda r: r["time_us"], default=None)
        failed = sum(1 for r in rows if r.get("status") != "ok")
        xla_us = xla["time_us"] if xla else float("nan")
        if best:
            print(f"| {case} | {xla_us:.1f} | {best['time_us']:.1f} | {best['candidate']} | "
                  f"{xla_us / best['time_us']:.2f} | "
                  f"{round_best['time_us'] if round_best else float('nan'):.1f} | {failed} |")
        else:
            print(f"| {case} | {xla_us:.1f} | - | - | - | - | {failed} |")


if __name__ == "__main__":
    main()
