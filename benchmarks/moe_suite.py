"""Grouped matmuls (MoE experts, ``lax.ragged_dot``) on a GPU: XLA, tuned and peers, against dense.

    python benchmarks/moe_suite.py --out benchmarks/results [--cases NAME,NAME] [--modes bare,swiglu,backward]

Each case is one expert layer: ``experts`` weight matrices (k, n) and ``m`` rows (tokens times
top-k) split among them, in two splits: ``equal`` and ``skewed`` (group sizes falling
geometrically, the last eighth of the experts empty). Each is measured in three modes:
* bare: ``ragged_dot(x, w, sizes)``;
* swiglu: the up projection in its context, ``silu(ragged_dot(x, wg)) * ragged_dot(x, wu)``;
* backward: the forward and both gradients (``jax.grad`` of a weighted sum, wrt x and w).
Variants, side by side in one process: XLA (``jax.jit`` of the lax function), tuned
(``jax.jit(jat.autotune(fn))``, the same function unchanged) and a dense matmul of the same
FLOPs ((m, k) x (k, n), in the same mode), and the memory floor: every array moved once at the
HBM's specified bandwidth, the experts' weights included, which bounds a case with many small
experts above the dense matmul's time. Device time of all the
kernels of one call: CUPTI, median of 3 rounds of 20 runs; where CUPTI cannot follow a
program (the ``timer`` column says "wall"), the median wall time of 20 waited-for runs. The tuned result is
compared with XLA's (max relative error) in every row. Peers in a child process each:
torch's grouped matmul (``torch._grouped_mm``, bf16, in every mode: the backward by autograd)
when this torch has it, and tokamax's ``ragged_dot`` (bare) when tokamax imports; a peer that
fails or is absent is reported as such, a mode a peer does not time says "not timed". Writes moe_suite_<date>.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the device

import peers  # noqa: E402
from report import geomean, write_results  # noqa: E402

MODES = ("bare", "swiglu", "backward")
SPLITS = ("equal", "skewed")
# products per call; backward: both gradients only, the loss being linear in the forward's
# result, XLA drops the forward product (so did the dense matmul's 675 TFLOP/s on an H200)
FLOP_FACTOR = {"bare": 1, "swiglu": 2, "backward": 2}
# the HBM's specified bandwidth by device kind (the first fragment the name holds)
HBM_BYTES_PER_S = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12))


def hbm_bytes_per_s(device_kind: str) -> float | None:
    """The specified HBM bandwidth of ``device_kind``, or None for a device not listed.

        >>> hbm_bytes_per_s("NVIDIA H100 80GB HBM3")
        3350000000000.0
    """
    return next((rate for fragment, rate in HBM_BYTES_PER_S if fragment in device_kind), None)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    experts: int
    m: int  # rows: tokens x top-k
    k: int
    n: int

    def flops(self, mode: str) -> float:
        return 2.0 * self.m * self.k * self.n * FLOP_FACTOR[mode]

    def floor_bytes(self, mode: str, itemsize: int = 2) -> float:
        """What a call must move at least: each array once, every expert's weights included
        (the dense matmul of the same FLOPs reads one expert's). bare: x, W, y; swiglu: x, two
        W, y; backward: dy, W and dx (the input gradient), x and dW (the weight gradient)."""
        x, w, y = self.m * self.k, self.experts * self.k * self.n, self.m * self.n
        elements = {"bare": x + w + y, "swiglu": x + 2 * w + y, "backward": 2 * x + y + 2 * w}[mode]
        return float(elements * itemsize)

    def memory_floor_us(self, mode: str, bytes_per_s: float) -> float:
        return self.floor_bytes(mode) / bytes_per_s * 1e6


CASES = [
    Case("mixtral_up", 8, 8192, 4096, 14336),
    Case("mixtral_down", 8, 8192, 14336, 4096),
    Case("dbrx_up", 16, 8192, 6144, 10752),
    Case("deepseek_up", 64, 16384, 2048, 1408),
    Case("qwen_moe_up", 128, 16384, 2048, 768),
    Case("qwen_moe_down", 128, 16384, 768, 2048),
]


def group_sizes(case: Case, split: str):
    """int32 sizes summing to ``case.m``: equal, or falling by a factor 0.8 per expert with
    the last eighth empty."""
    import numpy as np

    from jax_autotune.splits import equal_split
    if split == "equal":
        return equal_split(case.m, case.experts).astype(np.int32)
    live = max(1, case.experts - case.experts // 8)
    weights = 0.8 ** np.arange(live)
    sizes = np.concatenate([np.floor(weights / weights.sum() * case.m), np.zeros(case.experts - live)])
    sizes = sizes.astype(np.int32)
    sizes[0] += case.m - sizes.sum()
    return sizes


def functions(mode: str, ragged):
    """``fn(x, w, extra, sizes)`` computing ``mode`` with ``ragged(x, w, sizes)`` as the grouped
    product; ``extra`` is the second weight (swiglu) or the output's cotangent (backward)."""
    import jax
    import jax.numpy as jnp

    if mode == "bare":
        return lambda x, w, extra, sizes: ragged(x, w, sizes)
    if mode == "swiglu":
        return lambda x, w, extra, sizes: jax.nn.silu(ragged(x, w, sizes)) * ragged(x, extra, sizes)

    def loss(x, w, cotangent, sizes):
        return jnp.sum(ragged(x, w, sizes).astype(jnp.float32) * cotangent)
    return jax.grad(loss, argnums=(0, 1))


def dense_product(x, w, sizes):
    """The floor: one (m, k) x (k, n) matmul, the same FLOPs as the grouped one."""
    import jax.numpy as jnp
    return jnp.dot(x, w[0])


def operands(case: Case, mode: str, dtype: str):
    import jax
    import jax.numpy as jnp
    keys = jax.random.split(jax.random.key(case.experts * 7 + case.n), 3)
    x = jax.random.normal(keys[0], (case.m, case.k), jnp.float32).astype(dtype)
    w = (jax.random.normal(keys[1], (case.experts, case.k, case.n), jnp.float32) / case.k ** 0.5).astype(dtype)
    shape = (case.m, case.n) if mode == "backward" else (case.experts, case.k, case.n)
    extra = (jax.random.normal(keys[2], shape, jnp.float32) / case.k ** 0.5).astype(
        jnp.float32 if mode == "backward" else dtype)
    return x, w, extra


def max_rel_error(got, want) -> float:
    import jax
    import numpy as np
    errors = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        errors.append(float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30))
    return max(errors)


def _branches(fn, args) -> bool:
    """Whether ``fn``'s compiled program holds a device-side branch (``lax.cond``)."""
    return "conditional(" in fn.lower(*args).compile().as_text()


def timed_us(fns, args) -> tuple[str, list[float]]:
    """("cupti", device us of each ``fns[i](*args[i])``), or where CUPTI cannot follow a
    program ("wall", the median wall time of 20 runs each, every run waited for, in
    alternating rounds): kernels that differ between runs, or a device-side branch, whose
    kernels CUPTI did not count on an H200 (a weight gradient whose fallback branch runs
    XLA's ragged_dot read 1.6 ms by CUPTI, less than the 2.6 ms of dense matmuls of its FLOPs)."""
    import statistics
    import jax
    if not any(_branches(fn, a) for fn, a in zip(fns, args)):
        try:
            return "cupti", [peers.interleaved_device_us([fn], a)[0] for fn, a in zip(fns, args)]
        except RuntimeError as err:
            if "not consistent" not in str(err):
                raise
    samples = [[] for _ in fns]
    for _ in range(20):
        for fn, a, out in zip(fns, args, samples):
            start = time.perf_counter()
            jax.block_until_ready(fn(*a))
            out.append((time.perf_counter() - start) * 1e6)
    return "wall", [statistics.median(s) for s in samples]


def decision_summary(decision) -> dict:
    """A grouped key's winner, where its tuning time went, and each candidate's outcome,
    score (s), samples, compile seconds and error."""
    return {"key": decision.key.canonical(), "winner": decision.winner, "source": decision.source,
            "reason": (decision.reason or "")[:400], "tuning_seconds": round(decision.tuning_seconds, 2),
            "phase_seconds": decision.bounds.get("phase_seconds"),
            "results": [{"name": r.name, "outcome": r.outcome, "score": r.score, "samples": len(r.samples),
                         "compile_seconds": r.compile_seconds, "error": r.error[:200]} for r in decision.results]}


def jax_rows(case: Case, modes, dtype: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_autotune as jat
    from jax_autotune.tuning.tuner import record_decisions

    rows = []
    for mode in modes:
        x, w, extra = operands(case, mode, dtype)
        xla_fn = jax.jit(functions(mode, lax.ragged_dot))
        tuned_fn = jax.jit(jat.autotune(functions(mode, lax.ragged_dot)))
        dense_fn = jax.jit(functions(mode, dense_product))
        dense_extra = extra if mode == "backward" else extra[:1]
        for split in SPLITS:
            sizes = jnp.asarray(group_sizes(case, split))
            row = {"case": case.name, "mode": mode, "split": split, "experts": case.experts,
                   "m": case.m, "k": case.k, "n": case.n, "dtype": dtype}
            try:
                started = time.perf_counter()
                with record_decisions() as asked:
                    tuned_out = jax.block_until_ready(tuned_fn(x, w, extra, sizes))
                row["tuned_first_call_s"] = round(time.perf_counter() - started, 2)
                row["decisions"] = [decision_summary(d) for d in asked if d.key.groups]
                row["tuned_max_rel_error"] = max_rel_error(tuned_out, xla_fn(x, w, extra, sizes))
                row["timer"], (xla_us, tuned_us, dense_us) = timed_us(
                    [xla_fn, tuned_fn, dense_fn], [(x, w, extra, sizes)] * 2 + [(x, w[:1], dense_extra, sizes)])
                row.update(xla_us=xla_us, tuned_us=tuned_us, dense_us=dense_us)
            except Exception as err:  # noqa: BLE001 - a failed row is reported, not fatal
                row["error"] = f"{type(err).__name__}: {err}"[:300]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def _peer_child(peer: str, cases: list) -> None:
    """In a child: one JSON line per (case, split) with the peer's bare forward time."""
    for name, experts, m, k, n, split in cases:
        row: dict = {"case": [name, split]}
        try:
            row.update((_torch_grouped_us if peer == "torch" else _tokamax_us)(
                Case(name, experts, m, k, n), split))
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"[:200]
        print(json.dumps(row), flush=True)


def _torch_grouped_us(case: Case, split: str) -> dict:
    """torch's grouped matmul in each mode, as ``functions`` computes it: bare ("us"), the
    SwiGLU up ("swiglu_us") and both gradients by autograd ("backward_us"); a mode that
    fails is reported under "<mode>_error", the others still timed."""
    import torch
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(f"torch {torch.__version__} has no _grouped_mm")
    x = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w, up = (torch.randn(case.experts, case.k, case.n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
             for _ in range(2))
    offsets = torch.tensor(group_sizes(case, split), device="cuda").cumsum(0).to(torch.int32)

    def grouped(weights):
        return torch._grouped_mm(x, weights, offs=offsets)

    def swiglu():
        with torch.no_grad():
            return torch.nn.functional.silu(grouped(w)) * grouped(up)

    def bare():
        with torch.no_grad():
            return grouped(w)

    row = {"us": peers.torch_kernel_us(bare)}
    try:
        row["swiglu_us"] = peers.torch_kernel_us(swiglu)
    except Exception as err:  # noqa: BLE001 - one mode failing is reported
        row["swiglu_error"] = f"{type(err).__name__}: {err}"[:200]
    try:
        y = grouped(w)
        cotangent = torch.randn_like(y)
        row["backward_us"] = peers.torch_kernel_us(
            lambda: torch.autograd.grad(y, (x, w), cotangent, retain_graph=True))
    except Exception as err:  # noqa: BLE001
        row["backward_error"] = f"{type(err).__name__}: {err}"[:200]
    return row


TOKAMAX_IMPLEMENTATIONS = (None, "mosaic", "triton")  # its default pick first


def _tokamax_us(case: Case, split: str) -> dict:
    """tokamax's fastest implementation that runs here (its default can fail on a jax
    newer than it), and what the others raised."""
    import jax
    import jax.numpy as jnp

    from jax_autotune.kernels.gpu.tokamax_ragged import import_tokamax
    tokamax = import_tokamax()  # as the candidates import it: this child's own flags are not tokamax's
    x = jax.random.normal(jax.random.key(0), (case.m, case.k), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (case.experts, case.k, case.n), jnp.bfloat16)
    sizes = jnp.asarray(group_sizes(case, split))
    timed, failed = {}, {}
    for impl in TOKAMAX_IMPLEMENTATIONS:
        try:
            fn = jax.jit(lambda x, w, s, impl=impl: tokamax.ragged_dot(x, w, s, implementation=impl))
            timed[str(impl)] = peers.interleaved_device_us([fn], (x, w, sizes))[0]
        except Exception as err:  # noqa: BLE001 - one implementation failing is reported
            failed[str(impl)] = f"{type(err).__name__}: {err}"[:120]
    if not timed:
        raise RuntimeError("; ".join(f"{k}: {v}" for k, v in failed.items()))
    best = min(timed, key=timed.get)
    return {"us": timed[best], "implementation": best, "timed": timed, "failed": failed}


def peer_rows(peer: str, cases: list[Case], timeout_s: float) -> dict:
    """{(case, split): {'us' or 'error'}} from a child process of its own (torch.profiler
    keeps CUPTI subscribed; tokamax's imports stay out of the tuned process)."""
    args = [[c.name, c.experts, c.m, c.k, c.n, s] for c in cases for s in SPLITS]
    return peers.case_rows_from_child(__file__, ["--peer-child", peer, json.dumps(args)], dict(os.environ),
                                      timeout_s)


def _us(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def _peer_us(found: dict | None, mode: str) -> str:
    """A peer's cell: its time in ``mode``; "not timed" where it was not asked (tokamax
    times the bare product only), "-" where it failed (the notes say why)."""
    if found is None:
        return "not timed"
    field = "us" if mode == "bare" else f"{mode}_us"
    if field not in found and "error" not in found and f"{mode}_error" not in found:
        return "not timed"
    return _us(found.get(field))


def markdown(rows: list[dict], peer_found: dict, header: str, bytes_per_s: float | None) -> str:
    """The report; the memory floor at ``bytes_per_s`` (None: "-", a device not listed)."""
    lines = [header, ""]
    for mode in MODES:
        mode_rows = [r for r in rows if r["mode"] == mode]
        if not mode_rows:
            continue
        lines += [f"## {mode}", "",
                  "| case | experts | m x k x n | split | XLA us | tuned us | dense us | torch us | tokamax us "
                  "| XLA / tuned | tuned TFLOP/s | tuned / dense speed | memory floor us | floor / tuned "
                  "| tuned first call s | max rel err | timer |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mode_rows:
            case = next(c for c in CASES if c.name == r["case"])
            peer = {p: peer_found[p].get((r["case"], r["split"]), {}) for p in peer_found}
            tuned, xla, dense_us = r.get("tuned_us"), r.get("xla_us"), r.get("dense_us")
            ok = tuned and xla and dense_us
            floor = case.memory_floor_us(mode, bytes_per_s) if bytes_per_s else None
            lines.append(
                f"| {r['case']} | {r['experts']} | {r['m']}x{r['k']}x{r['n']} | {r['split']} | {_us(xla)} "
                f"| {_us(tuned)} | {_us(dense_us)} | {_peer_us(peer.get('torch'), mode)} "
                f"| {_peer_us(peer.get('tokamax'), mode)} | {f'{xla / tuned:.2f}' if ok else '-'} "
                f"| {f'{case.flops(mode) / tuned / 1e6:.0f}' if ok else '-'} "
                f"| {f'{dense_us / tuned:.2f}' if ok else '-'} | {_us(floor)} "
                f"| {f'{floor / tuned:.2f}' if tuned and floor else '-'} | {r.get('tuned_first_call_s', '-')} "
                f"| {r.get('tuned_max_rel_error', r.get('error', '-'))} | {r.get('timer', '-')} |")
        done = [r for r in mode_rows if r.get("tuned_us") and r.get("xla_us")]
        lines += ["", f"Geomean XLA / tuned: {geomean([r['xla_us'] / r['tuned_us'] for r in done]):.2f}; "
                      f"tuned / dense speed: {geomean([r['dense_us'] / r['tuned_us'] for r in done]):.2f}.", ""]
    for peer, found in peer_found.items():
        errors = sorted({row["error"] for row in found.values() if "error" in row}
                        | {f"{k.removesuffix('_error')}: {v}" for row in found.values()
                           for k, v in row.items() if k.endswith("_error")})
        if errors or not found:
            lines.append(f"- {peer}: " + ("; ".join(errors) if errors else "no result (the child failed)"))
        picked = sorted({row["implementation"] for row in found.values() if "implementation" in row})
        failed = sorted({f"{k}: {v}" for row in found.values() for k, v in row.get("failed", {}).items()})
        if picked:
            lines.append(f"- {peer}: the fastest implementation that ran ({', '.join(picked)})"
                         + (f"; failed: {'; '.join(failed)}" if failed else ""))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--peers", default="torch,tokamax", help="comma-separated; '' for none")
    parser.add_argument("--peer-timeout-s", type=float, default=240)
    parser.add_argument("--peer-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_child:
        return _peer_child(args.peer_child[0], json.loads(args.peer_child[1]))
    names = [n for n in args.cases.split(",") if n]
    cases = [c for c in CASES if not names or c.name in names]
    modes = [m for m in args.modes.split(",") if m]
    peer_found = {p: peer_rows(p, cases, args.peer_timeout_s) for p in args.peers.split(",") if p}
    rows = [row for case in cases for row in jax_rows(case, modes, args.dtype)]
    import jax
    kind = jax.devices()[0].device_kind
    bytes_per_s = hbm_bytes_per_s(kind)
    floor = f"{bytes_per_s / 1e12:.2f} TB/s, as specified" if bytes_per_s else "this device's bandwidth is not listed"
    header = (f"# Grouped matmuls on {kind}, {datetime.date.today()} "
              f"(jax {jax.__version__}, {args.dtype})\n\n`python benchmarks/moe_suite.py {' '.join(sys.argv[1:])}`; "
              "device time per call (CUPTI; a row timed `wall` holds a device-side branch or kernels that vary, "
              "and reads the median wall time of 20 waited runs), tuned = `jax.jit(jat.autotune(fn))` of the unchanged function; "
              f"the memory floor at the HBM's {floor}.")
    stem = f"moe_suite_{datetime.date.today()}"
    print(write_results(args.out, stem, markdown(rows, peer_found, header, bytes_per_s), {
        "rows": rows, "hbm_bytes_per_s": bytes_per_s, "peers": {
        p: {"|".join(k): v for k, v in found.items()} for p, found in peer_found.items()}}))


if __name__ == "__main__":
    main()
