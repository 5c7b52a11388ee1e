"""The GPU suite: the tuned matmul against the peers a user would pick, by device time.

    python benchmarks/gpu_suite.py --out benchmarks/results [--subset bf16|f32|all|misaligned]
        [--budget-s 300] [--inductor-budget-s 150] [--exhaustive-budget-s 60]

Cases: square and large shapes, shapes from real models (transformer projections and
MLPs at prefill and decode, vocabulary heads with odd vocabulary sizes, batched
attention matmuls with a transposed operand) and misaligned large shapes (a row whose
byte stride is not a multiple of 16). Per case, side by side in one run:
* XLA's dot and the tuned choice: CUPTI device time (median of 3 alternating rounds of
  20 iterations); XLA's dot compiled a second time, in the same rounds ("XLA again",
  named apart so that the compilation cache cannot serve it), shows how much two
  compiles of one program differ;
* cuBLAS through ``torch.matmul`` and Inductor ``max-autotune-no-cudagraphs``: the
  summed kernel time of one call from ``torch.profiler`` (``peers.py``; Inductor's first
  call compiles and autotunes, its seconds reported; cases in order until its budget);
* XLA with ``--xla_gpu_exhaustive_tiling_search=true`` in a child process, with its
  compile seconds, cases in order until its budget;
* the cold tune of the key (compile + measure; the process's first key pays the
  probes), its candidate compiles and whether a Pallas round ran;
* the warm-process first call (a second process, the same store and compilation cache).
Writes gpu_suite_<date>_<subset>.{json,md} to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the device

import peers  # noqa: E402
from report import child_result, geomean, write_results  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Case:
    group: str  # "square" | "model" | "misaligned"
    name: str
    dtype: str
    m: int
    n: int
    k: int
    batch: int = 1
    transpose_b: bool = False

    @property
    def label(self) -> str:
        dims = f"{self.m}x{self.n}x{self.k}" if self.batch == 1 else f"{self.batch}x{self.m}x{self.n}x{self.k}"
        return f"{dims}{' T' if self.transpose_b else ''}"


def _squares(dtype):
    return [Case("square", f"{s}^3", dtype, s, s, s) for s in (768, 1000, 1024, 2048, 4096)]


BF16 = "bfloat16"
CASES = {
    "bf16": _squares(BF16) + [
        Case("model", "GPT-2 qkv, prefill 8x1024", BF16, 8192, 2304, 768),
        Case("model", "GPT-2 MLP up", BF16, 8192, 3072, 768),
        Case("model", "GPT-2 MLP down", BF16, 8192, 768, 3072),
        Case("model", "Llama-3-8B MLP up, prefill 4096", BF16, 4096, 14336, 4096),
        Case("model", "Llama-3-8B MLP down", BF16, 4096, 4096, 14336),
        Case("model", "Llama-3-8B MLP up, decode 16", BF16, 16, 14336, 4096),
        Case("model", "Llama-3-8B proj, decode 16", BF16, 16, 4096, 4096),
        Case("model", "attention q k^T (8x12 heads)", BF16, 1024, 1024, 64, batch=96, transpose_b=True),
        Case("model", "attention p v", BF16, 1024, 64, 1024, batch=96),
        Case("misaligned", "GPT-2 vocab head 50257", BF16, 8192, 50257, 768),
        Case("misaligned", "GPT-2 vocab head, d input", BF16, 8192, 768, 50257),
        Case("misaligned", "vocab head 32001", BF16, 4096, 32001, 4096),
        Case("misaligned", "1025^3", BF16, 1025, 1025, 1025),
        Case("misaligned", "2049^3", BF16, 2049, 2049, 2049),
        Case("misaligned", "4097^3", BF16, 4097, 4097, 4097),
    ],
    "f32": _squares("float32") + [
        Case("misaligned", "1025^3", "float32", 1025, 1025, 1025),
        Case("model", "128x8192x8192", "float32", 128, 8192, 8192),
        Case("model", "8192x8192x128", "float32", 8192, 8192, 128),
    ],
}
PEAK = {"bfloat16": 790e12, "float32": 400e12}
BANDWIDTH = 4.3e12


def cases(subset: str) -> list[Case]:
    """The cases of ``subset``: 'bf16', 'f32', 'all', or 'misaligned' (both dtypes: the
    keys with a Pallas round, for timing cold tuning alone)."""
    if subset in ("all", "misaligned"):
        every = CASES["bf16"] + CASES["f32"]
        return every if subset == "all" else [c for c in every if c.group == "misaligned"]
    return CASES[subset]


def floor_us(c: Case) -> float:
    size = 2 if c.dtype == BF16 else 4
    return c.batch * max(2 * c.m * c.n * c.k / PEAK[c.dtype],
                         (c.m * c.k + c.k * c.n + c.m * c.n) * size / BANDWIDTH) * 1e6


def run_cold(args, exhaustive: dict, torch: dict) -> list[dict]:
    import jax
    import jax_autotune as jat
    from jax_autotune import config
    from jax_autotune.kernels.xla import xla_dot
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.registry import tuner_for
    from jax_autotune.tuning import counters
    from jax_autotune.tuning.timing import random_operands

    tuner = tuner_for("gpu")
    device = jax.local_devices(backend="gpu")[0]
    rows, start_all = [], time.perf_counter()
    for c in cases(args.subset):
        if time.perf_counter() - start_all > args.budget_s:
            print(f"budget reached; skipping {c.dtype} {c.label}", flush=True)
            continue
        problem = MatmulProblem(c.batch, c.m, c.n, c.k, c.dtype, c.dtype, c.dtype, transpose_b=c.transpose_b)
        operands = random_operands(problem, device, seed=7)
        before = counters.stats()
        t0 = time.perf_counter()
        decision = tuner.select(problem, policy=config.policy())
        cold_s = time.perf_counter() - t0
        after = counters.stats()
        winner = tuner.candidate_set.by_name(decision.winner)
        xla = jax.jit(lambda a, b: xla_dot(a, b, problem))

        def xla_again(a, b):  # a module of another name: compiled again, not served by the cache
            return xla_dot(a, b, problem)
        xla_again = jax.jit(xla_again)
        tuned = jax.jit(lambda a, b: winner.fn(a, b, problem))
        row = {**dataclasses.asdict(c), "label": c.label, "winner": decision.winner,
               "source": decision.source, "floor_us": floor_us(c), "cold_tune_s": cold_s,
               "compiles": after["candidate_compiles"] - before["candidate_compiles"],
               "pallas_round": any(r.name.startswith(("triton", "mosaic")) and r.outcome != "skipped"
                                   for r in decision.results),
               "probe_launches": after["probe_launches"] - before["probe_launches"],
               "phase_seconds": decision.bounds.get("phase_seconds"),
               "outcomes": {r.name: r.outcome for r in decision.results},
               "scores_us": {r.name: r.score * 1e6 for r in decision.results if r.score is not None},
               "compile_s": {r.name: r.compile_seconds for r in decision.results if r.compile_seconds is not None},
               "compile_wait_s": {r.name: r.compile_wait_seconds for r in decision.results
                                  if r.compile_wait_seconds is not None},
               "reason": decision.reason}
        row["xla_us"], row["tuned_us"], row["xla_again_us"] = peers.interleaved_device_us((xla, tuned, xla_again), operands)
        case = (c.dtype, c.batch, c.m, c.n, c.k, c.transpose_b)
        row.update(torch.get(case, {}))
        found = exhaustive.get(case)
        if found:
            row["exhaustive_us"], row["exhaustive_compile_s"] = found["us"], found["compile_s"]
        peers_us = [row.get(name) for name in ("xla_us", "xla_again_us", "cublas_us", "inductor_us", "exhaustive_us")]
        row["best_peer_us"] = min(p for p in peers_us if p)
        row["vs_best_peer"] = row["best_peer_us"] / row["tuned_us"]
        row["vs_xla"] = row["xla_us"] / row["tuned_us"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("outcomes", "scores_us", "compile_s", "compile_wait_s", "phase_seconds")}), flush=True)
    print("stats", json.dumps(jat.stats()), flush=True)
    return rows


def run_warm(args) -> dict:
    """A second process: first call of the tuned matmul per key, store and cache warm."""
    import jax
    import jax.numpy as jnp
    import jax_autotune as jat

    firsts = {}
    for c in cases(args.subset):
        lead = (c.batch,) if c.batch > 1 else ()
        a = jnp.ones((*lead, c.m, c.k), c.dtype)
        b = jnp.ones((*lead, c.n, c.k) if c.transpose_b else (*lead, c.k, c.n), c.dtype)
        f = (jax.jit(lambda x, y: jat.dot_general(x, y, (((x.ndim - 1,), (y.ndim - 1,)),
                                                          (tuple(range(x.ndim - 2)),) * 2)))
             if c.transpose_b else jax.jit(jat.matmul))
        jax.block_until_ready((a, b))
        t0 = time.perf_counter()
        jax.block_until_ready(f(a, b))
        firsts[f"{c.dtype} {c.label}"] = time.perf_counter() - t0
    return {"first_call_s": firsts, "stats": jat.stats()}


def _cell(value, fmt="{:.1f}"):
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def report(rows, warm, command, exhaustive_budget_s) -> str:
    import jax
    date = datetime.date.today().isoformat()
    lines = [f"# GPU suite on an H200, {date}", "", f"jax {jax.__version__}; command: `{command}`", "",
             "Device times in us: CUPTI for XLA, XLA exhaustive and tuned; torch.profiler kernel "
             "time for cuBLAS (torch.matmul) and Inductor (max-autotune-no-cudagraphs). "
             "vs best = best peer / tuned (>= 0.97: at most 3% behind); vs XLA = XLA / tuned. "
             f"XLA exhaustive ran in a child within {exhaustive_budget_s:.0f} s (compile s in brackets).", "",
             "| group | case | dtype | m x n x k | floor | XLA | XLA again | XLA exhaustive | cuBLAS | Inductor (tune s) "
             "| tuned | vs best | vs XLA | winner | cold tune s (XLA's compile) | warm first call s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        exhaustive = (f"{r['exhaustive_us']:.1f} ({r['exhaustive_compile_s']:.0f} s)" if "exhaustive_us" in r else "-")
        inductor = (f"{r['inductor_us']:.1f} ({r['inductor_tune_s']:.0f} s)" if "inductor_us" in r else "-")
        cold = (f"{r['cold_tune_s']:.2f} ({_cell(xla_compile_s(r), '{:.2f}')})" if r["source"] == "tuned"
                else f"- ({r['source']})")
        warm_s = warm.get("first_call_s", {}).get(f"{r['dtype']} {r['label']}")
        lines.append(f"| {r['group']} | {r['name']} | {r['dtype']} | {r['label']} | {r['floor_us']:.1f} | "
                     f"{r['xla_us']:.1f} | {r['xla_again_us']:.1f} | {exhaustive} | {_cell(r.get('cublas_us'))} | "
                     f"{inductor} | {r['tuned_us']:.1f} | {r['vs_best_peer']:.2f} | {r['vs_xla']:.2f} | "
                     f"{r['winner']} | {cold} | {_cell(warm_s, '{:.3f}')} |")
    misaligned = [r["vs_best_peer"] for r in rows if r["group"] == "misaligned"]
    colds = [r for r in rows if r["source"] == "tuned"]
    pallas = [r["cold_tune_s"] for r in colds if r["pallas_round"]]
    beyond_xla = [r["cold_tune_s"] - xla_compile_s(r) for r in colds if r["pallas_round"] and xla_compile_s(r)]
    lines += ["", "| goal | target | reached |", "|---|---|---|",
              f"| min of best peer / tuned, every case | >= 0.97 | {min(r['vs_best_peer'] for r in rows):.2f} |",
              f"| geomean of best peer / tuned, misaligned cases | >= 1.1 | {geomean(misaligned):.2f} ({len(misaligned)} cases) |",
              f"| min of XLA / tuned, every case | >= 0.97 | {min(r['vs_xla'] for r in rows):.2f} |",
              f"| XLA / XLA again (one program compiled twice), range | - | {spread(rows)} |"]
    if colds:
        lines.append(f"| first key of the process, probes included | <= 2.0 s | {colds[0]['cold_tune_s']:.2f} s |")
    if pallas:
        lines.append(f"| median cold tune of a key with a Pallas round | <= 1.5 s | "
                     f"{statistics.median(pallas):.2f} s ({len(pallas)} keys) |")
    if beyond_xla:
        lines.append(f"| the same, less XLA's compile of its own dot (its GEMM autotuner) | - | "
                     f"{statistics.median(beyond_xla):.2f} s |")
    behind = [r for r in rows if r["vs_best_peer"] < 0.97]
    if behind:
        lines += ["", "Behind the best peer by more than 3%: " + "; ".join(
            f"{r['dtype']} {r['label']} ({r['vs_best_peer']:.2f})" for r in behind) + "."]
    errors = [f"{r['dtype']} {r['label']}: {r[k]}" for r in rows for k in ("cublas_error", "inductor_error") if k in r]
    if errors:
        lines += ["", "Peer errors: " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


def xla_compile_s(row) -> float | None:
    """Seconds the key's tuning spent compiling XLA's dot (XLA's GEMM autotuner runs in
    it), less its wait for the device where the run recorded that (in results written
    before ``compile_wait_s`` existed, the wait is included)."""
    seconds = row.get("compile_s", {}).get("xla_dot")
    return None if seconds is None else seconds - row.get("compile_wait_s", {}).get("xla_dot", 0.0)


def spread(rows) -> str:
    ratios = [r["xla_us"] / r["xla_again_us"] for r in rows if r.get("xla_again_us")]
    return f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--subset", choices=["bf16", "f32", "all", "misaligned"], default="all")
    parser.add_argument("--budget-s", type=float, default=300.0, help="the tuned side, all cases")
    parser.add_argument("--inductor-budget-s", type=float, default=150.0)
    parser.add_argument("--exhaustive-budget-s", type=float, default=60.0)
    parser.add_argument("--phase", choices=["all", "warm"], default="all", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "warm":
        print(json.dumps(run_warm(args)))
        return
    os.environ.setdefault("JAX_AUTOTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="gpu_suite_"))
    all_cases = [(c.dtype, c.batch, c.m, c.n, c.k, c.transpose_b) for c in cases(args.subset)]
    exhaustive = peers.xla_exhaustive(all_cases, args.exhaustive_budget_s) if args.exhaustive_budget_s > 0 else {}
    torch = peers.torch_peers(all_cases, args.inductor_budget_s, timeout_s=args.inductor_budget_s + 120)
    rows = run_cold(args, exhaustive, torch)
    warm = {}
    try:
        warm = child_result(__file__, ["--phase", "warm", "--subset", args.subset], dict(os.environ), 300)
    except Exception as err:  # noqa: BLE001 - the cold table stands on its own
        print(f"warm phase failed: {err}", flush=True)
    command = "python benchmarks/gpu_suite.py " + " ".join(sys.argv[1:])
    text = report(rows, warm, command, args.exhaustive_budget_s)
    print(text)
    write_results(args.out, f"gpu_suite_{datetime.date.today().isoformat()}_{args.subset}", text,
                  {"rows": rows, "warm": warm, "exhaustive": [list(k) + [v] for k, v in exhaustive.items()],
                   "torch": [list(k) + [v] for k, v in torch.items()], "command": command})


if __name__ == "__main__":
    main()
