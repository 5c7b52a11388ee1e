"""The GPU suite: XLA's dot, torch.matmul and the tuned matmul by device time, per shape.

    python benchmarks/gpu_suite.py --out benchmarks/results [--subset bf16|f32|all] [--budget-s 540]

Per shape of ../shared/baselines/h200.md, in bfloat16 and float32 (DEFAULT precision:
TF32 for f32, as XLA does; torch is set to allow TF32 too):
* XLA's dot and the tuned choice: CUPTI device time (median of 3 alternating rounds of
  20 iterations each); XLA's dot compiled a second time, in the same rounds, shows how
  much two compiles of the very same program differ ("XLA again");
* torch.matmul: CUDA-event time from triton.testing.do_bench (median), when torch is there;
* the cold tune of the key (wall time: compile + measure; the process's first key
  includes the probes) and its candidate compiles;
* the warm-process first call (a second process with the same store: lookup + compile);
* the roofline floor max(2mnk / peak, bytes / 4.3 TB/s), peak 790 TFLOP/s bf16, 400 f32.
Writes gpu_suite_<date>.{json,md,png} to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from report import geomean, write_results

SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
          (1000, 1000, 1000), (1025, 1025, 1025), (768, 768, 768), (8192, 8192, 128),
          (16, 8192, 8192), (1, 4096, 4096), (128, 8192, 8192), (4096, 14336, 4096),
          (8192, 1024, 8192), (2048, 2048, 16384)]
GOAL_SHAPES = {(768, 768, 768), (1000, 1000, 1000), (1025, 1025, 1025), (16, 8192, 8192),
               (128, 8192, 8192), (8192, 8192, 128)}
LARGE_ALIGNED_BF16 = {(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096)}
PEAK = {"bfloat16": 790e12, "float32": 400e12}
BANDWIDTH = 4.3e12
ITERATIONS = 20
ROUNDS = 3


def floor_us(m, n, k, dtype):
    size = 2 if dtype == "bfloat16" else 4
    return max(2 * m * n * k / PEAK[dtype], (m * k + k * n + m * n) * size / BANDWIDTH) * 1e6


def device_us(fn, args) -> list[float]:
    from jax.experimental.mosaic.gpu import profiler
    _, times = profiler.measure(fn, iterations=ITERATIONS)(*args)
    times = times if isinstance(times, (list, tuple)) else [times]
    return [t * 1e3 for t in times]


def interleaved_device_us(fns, args, rounds: int = ROUNDS) -> list[float]:
    """Median device time of each function, measured in alternating rounds so that clock
    and temperature drift during the run weighs on all alike."""
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, samples):
            out.extend(device_us(fn, args))
    return [statistics.median(s) for s in samples]


def torch_us(m, n, k, dtype):
    try:
        import torch
        from triton.testing import do_bench
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = True
    tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a = torch.randn(m, k, device="cuda", dtype=tdtype)
    b = torch.randn(k, n, device="cuda", dtype=tdtype)
    return do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100, return_mode="median") * 1e3


def cases(subset):
    dtypes = {"bf16": ["bfloat16"], "f32": ["float32"], "all": ["bfloat16", "float32"]}[subset]
    return [(dtype, shape) for dtype in dtypes for shape in SHAPES]


def run_cold(args) -> list[dict]:
    import jax
    import jax_autotune as jat
    from jax_autotune.tuning import counters
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.tuning.timing import random_operands
    from jax_autotune.tuners import tuner_for
    from jax_autotune.kernels.xla import xla_dot

    tuner = tuner_for("gpu")
    device = jax.devices("gpu")[0]
    rows, start_all = [], time.perf_counter()
    for dtype, (m, n, k) in cases(args.subset):
        if time.perf_counter() - start_all > args.budget_s:
            print(f"budget reached; skipping {dtype} {m}x{n}x{k}", flush=True)
            continue
        problem = MatmulProblem(1, m, n, k, dtype, dtype, dtype)
        operands = random_operands(problem, device, seed=7)
        before = counters.stats()
        t0 = time.perf_counter()
        decision = tuner.select(problem)
        cold_s = time.perf_counter() - t0
        after = counters.stats()
        winner = tuner.candidate(decision.winner)
        xla = jax.jit(lambda a, b: xla_dot(a, b, problem))
        xla_again = jax.jit(lambda a, b: xla_dot(a, b, problem))  # a second compile of it
        tuned = jax.jit(lambda a, b: winner.fn(a, b, problem))
        row = {
            "dtype": dtype, "m": m, "n": n, "k": k, "winner": decision.winner,
            "source": decision.source,  # "memory": an earlier shape had the same key
            "torch_us": torch_us(m, n, k, dtype), "floor_us": floor_us(m, n, k, dtype),
            "cold_tune_s": cold_s, "compiles": after["candidate_compiles"] - before["candidate_compiles"],
            "slowest_compile_s": max((r.compile_seconds or 0.0 for r in decision.results), default=0.0),
            "probe_launches": after["probe_launches"] - before["probe_launches"],
            "phase_seconds": decision.bounds.get("phase_seconds"),
            "outcomes": {r.name: r.outcome for r in decision.results},
            "reason": decision.reason,
        }
        row["xla_us"], row["tuned_us"], row["xla_again_us"] = interleaved_device_us((xla, tuned, xla_again), operands)
        row["speedup"] = row["xla_us"] / row["tuned_us"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "outcomes"}), flush=True)
    print("stats", json.dumps(jat.stats()), flush=True)
    return rows


def run_warm(args) -> dict:
    """A second process: first call of jit(matmul) per key with the store warm."""
    import jax
    import jax.numpy as jnp
    import jax_autotune as jat

    firsts = {}
    for dtype, (m, n, k) in cases(args.subset):
        a = jnp.ones((m, k), dtype)
        b = jnp.ones((k, n), dtype)
        jax.block_until_ready((a, b))
        t0 = time.perf_counter()
        jax.block_until_ready(jax.jit(jat.matmul)(a, b))
        firsts[f"{dtype} {m}x{n}x{k}"] = time.perf_counter() - t0
    return {"first_call_s": firsts, "stats": jat.stats()}


def report(rows, warm, command) -> str:
    import jax
    date = datetime.date.today().isoformat()
    lines = [f"# GPU suite on an H200, {date}", "", f"jax {jax.__version__}; command: `{command}`", "",
             "Device times in us (CUPTI for XLA and tuned, CUDA events for torch); speedup = XLA / tuned.",
             "", "| dtype | m x n x k | floor | XLA | XLA again | torch | tuned | speedup | winner | cold tune s | compiles | slowest compile s | warm first call s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"{r['dtype']} {r['m']}x{r['n']}x{r['k']}"
        t = f"{r['torch_us']:.1f}" if r["torch_us"] else "-"
        w = warm.get("first_call_s", {}).get(name)
        w = f"{w:.3f}" if w is not None else "-"
        again = f"{r['xla_again_us']:.1f}" if r.get("xla_again_us") else "-"
        lines.append(f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {r['floor_us']:.1f} | {r['xla_us']:.1f} | {again} | "
                     f"{t} | {r['tuned_us']:.1f} | {r['speedup']:.2f} | {r['winner']} | "
                     f"{cold_cell(r)} | {r['compiles']} | {r['slowest_compile_s']:.2f} | {w} |")
    goal = [r["speedup"] for r in rows if (r["m"], r["n"], r["k"]) in GOAL_SHAPES]
    large = [r["speedup"] for r in rows if r["dtype"] == "bfloat16" and (r["m"], r["n"], r["k"]) in LARGE_ALIGNED_BF16]
    colds = [r["cold_tune_s"] for r in rows if r.get("source", "tuned") == "tuned"]
    lines += ["", "| goal | target | reached |", "|---|---|---|",
              f"| min speedup, every shape | >= 0.97 | {min(r['speedup'] for r in rows):.2f} |",
              f"| XLA / XLA again (one program compiled twice), range | - | {spread(rows)} |",
              f"| geomean speedup, goal shapes | >= 1.5 | {geomean(goal):.2f} ({len(goal)} cases) |",
              f"| min speedup, large aligned bf16 | >= 0.97 | {min(large) if large else float('nan'):.2f} |",
              f"| median cold tune of a key | <= 1.0 s | {statistics.median(colds):.2f} s ({len(colds)} keys) |",
              f"| first key of the process, probes included | <= 2.0 s | {colds[0]:.2f} s |"]
    phases = [r["phase_seconds"] for r in rows if r.get("phase_seconds") and r.get("source", "tuned") == "tuned"]
    if phases:
        names = sorted({name for p in phases for name in p})
        medians = ", ".join(f"{name} {statistics.median(p.get(name, 0.0) for p in phases):.2f} s" for name in names)
        lines += ["", f"Median wall time of each phase of a cold tune ({len(phases)} tuned keys): {medians}."]
    return "\n".join(lines) + "\n"


def spread(rows) -> str:
    ratios = [r["xla_us"] / r["xla_again_us"] for r in rows if r.get("xla_again_us")]
    return f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "-"


def cold_cell(row) -> str:
    if row.get("source", "tuned") != "tuned":
        return f"- ({row['source']}: same key as an earlier shape)"
    return f"{row['cold_tune_s']:.2f}"


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['dtype'][:4]} {r['m']}x{r['n']}x{r['k']}" for r in rows]
    fig, ax = plt.subplots(figsize=(12, 5))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("speedup over XLA's dot (device time)")
    ax.set_title("jax_autotune on an H200")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--subset", choices=["bf16", "f32", "all"], default="all")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--phase", choices=["all", "cold", "warm"], default="all", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "warm":
        print(json.dumps(run_warm(args)))
        return
    os.environ.setdefault("JAX_AUTOTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="gpu_suite_"))
    rows = run_cold(args)
    warm = {}
    try:
        done = subprocess.run([sys.executable, __file__, "--phase", "warm", "--subset", args.subset],
                              capture_output=True, text=True, timeout=240, env=dict(os.environ))
        warm = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as err:  # noqa: BLE001 - the cold table stands on its own
        print(f"warm phase failed: {err}", flush=True)
    command = "python benchmarks/gpu_suite.py " + " ".join(sys.argv[1:])
    text = report(rows, warm, command)
    print(text)
    stem = write_results(args.out, f"gpu_suite_{datetime.date.today().isoformat()}_{args.subset}",
                         text, {"rows": rows, "warm": warm, "command": command})
    plot(rows, stem + ".png")


if __name__ == "__main__":
    main()
