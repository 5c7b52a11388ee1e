"""Our Mosaic GPU grouped GEMM (``kernels/gpu/mosaic_grouped.py``) against ``lax.ragged_dot``
and a dense matmul of the same FLOPs, bf16, on an H200.

    python benchmarks/mosaic_grouped_probe.py --out DIR      # about 200 s at most

For mixtral_up, mixtral_down and qwen_moe_up (``moe_suite.CASES``), on the equal and the
skewed split (``moe_suite.group_sizes``): each ``configs_for_grouped`` config's max relative
error against ``lax.ragged_dot`` and its device time (CUPTI, ``moe_suite.timed_us``; wall
clock where CUPTI cannot follow) beside XLA's and the dense product's. A markdown table is
printed, every row goes to DIR/mosaic_grouped_probe.json; a failing case is recorded and
the rest run; configs past the deadline are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_suite  # noqa: E402  (sets XLA_PYTHON_CLIENT_PREALLOCATE)

CASE_NAMES = ("mixtral_up", "mixtral_down", "qwen_moe_up")


def case_rows(case, split: str, deadline: float) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    from jax_autotune.kernels.gpu import mosaic_grouped as mgr

    x, w, _ = moe_suite.operands(case, "bare", "bfloat16")
    sizes = jnp.asarray(moe_suite.group_sizes(case, split))
    xla = jax.jit(lambda a, b, s: lax.ragged_dot(a, b, s, preferred_element_type=jnp.float32).astype(a.dtype))
    dense = jax.jit(moe_suite.dense_product)
    want = xla(x, w, sizes)
    clock, (xla_us, dense_us) = moe_suite.timed_us([xla, dense], [(x, w, sizes)] * 2)
    base = {"case": case.name, "split": split, "m": case.m, "k": case.k, "n": case.n, "groups": case.experts,
            "xla_us": round(xla_us, 1), "dense_us": round(dense_us, 1), "clock": clock}
    rows = []
    for config in mgr.configs_for_grouped(case.m, case.n, case.k, case.experts, "bfloat16"):
        row = {**base, "config": config.name}
        if time.monotonic() > deadline:
            rows.append({**row, "error": "skipped: past the deadline"})
            continue
        try:
            fn = jax.jit(lambda a, b, s, c=config: mgr.mosaic_grouped_gemm(a, b, s, config=c))
            row["max_rel_error"] = moe_suite.max_rel_error(fn(x, w, sizes), want)
            row["clock"], (us,) = moe_suite.timed_us([fn], [(x, w, sizes)])
            row["us"] = round(us, 1)
            row["tflops"] = round(case.flops("bare") / us / 1e6, 1)
        except Exception as err:  # noqa: BLE001 - one failing config must not stop the rest
            row["error"] = f"{type(err).__name__}: {err}"[:400]
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| case | split | config | max rel error | us | TFLOP/s | XLA us | dense us | clock |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        err = f"{r['max_rel_error']:.2e}" if "max_rel_error" in r else r.get("error", "")
        lines.append(f"| {r['case']} | {r['split']} | {r.get('config', '-')} | {err} | {r.get('us', '-')} | "
                     f"{r.get('tflops', '-')} | {r.get('xla_us', '-')} | {r.get('dense_us', '-')} | "
                     f"{r.get('clock', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for mosaic_grouped_probe.json")
    parser.add_argument("--budget-s", type=float, default=200.0, help="skip configs after this many seconds")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import jax
    deadline = time.monotonic() + args.budget_s
    rows: list[dict] = []
    cases = [c for c in moe_suite.CASES if c.name in CASE_NAMES]
    for case in cases:
        for split in moe_suite.SPLITS:
            try:
                found = case_rows(case, split, deadline)
            except Exception as err:  # noqa: BLE001 - a failing case is a row, not the end
                traceback.print_exc()
                found = [{"case": case.name, "split": split, "error": f"{type(err).__name__}: {err}"[:400]}]
            for row in found:
                print(json.dumps(row), flush=True)
            rows.extend(found)
    print(markdown(rows), flush=True)
    with open(os.path.join(args.out, "mosaic_grouped_probe.json"), "w") as f:
        json.dump({"jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
