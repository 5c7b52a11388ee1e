"""Matmuls in the context a model runs them: plain, tuned and Inductor, bare and with the epilogue.

    python benchmarks/context_suite.py --out benchmarks/results [--phase all|inductor|jax]
        [--inductor-case-budget-s 120] [--cases "NAME;NAME"] [--misaligned]

Each case is a matmul and the ops a model puts after it (bias, residual, activation,
convert, the reduction of a loss), measured two ways, side by side in one process:
* bare: the matmul alone, ``lax.dot_general`` (plain) against ``jat.dot_general`` (tuned, the
  bare key);
* in context: the whole computation, ``jax.jit(fn)`` (plain: XLA fuses what it can) against
  ``jax.jit(jat.autotune(fn))`` (tuned: the key holds the epilogue, its candidates are timed
  with it, fused or not).
Device time of all the kernels of the jitted function: CUPTI, median of 3 alternating rounds
of 20 runs. Inductor (``torch.compile(..., mode="max-autotune-no-cudagraphs")``) on the same
computation, bare (``torch.matmul``) and in context, from torch.profiler's kernel times;
each (case, variant) compiles in a child of its own with its own budget, so a slow one
cannot hide the others, and a child that fails or runs out of time is reported as failed.
The cases: those of the issue that asked for this suite, and the matmuls of the two model
benchmarks (``model_step.py``: GPT-2-small and the Llama-style decoder) with their real
epilogues. Writes context_suite_<date>.{md,json} (phase ``inductor`` writes only the
Inductor rows, which phase ``jax`` then reads from --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the device

import peers  # noqa: E402
from report import geomean, write_results  # noqa: E402

BF16 = "bfloat16"


@dataclasses.dataclass(frozen=True)
class Case:
    """``lhs`` (m, k) or (k, m) when ``transpose_a``; ``rhs`` (k, n) or (n, k) when
    ``transpose_b``; ``after``: the epilogue's name (see ``jax_fn`` / ``torch_fn``)."""

    name: str
    group: str  # "issue" | "gpt2" | "llama"
    m: int
    n: int
    k: int
    after: str
    transpose_a: bool = False
    transpose_b: bool = False
    misaligned: bool = False

    @property
    def label(self) -> str:
        flags = (" lhs^T" if self.transpose_a else "") + (" rhs^T" if self.transpose_b else "")
        return f"{self.m}x{self.n}x{self.k}{flags}"


CASES = [
    Case("MLP down + bias + residual", "issue", 8192, 768, 3072, "bias_residual"),
    Case("rhs^T + bias + residual", "issue", 4096, 2048, 512, "bias_residual", transpose_b=True),
    Case("lhs^T + bias + residual", "issue", 2048, 512, 4096, "bias_residual", transpose_a=True),
    Case("SwiGLU gate, decode 96", "issue", 96, 11008, 4096, "silu_gate"),
    Case("vocabulary head, f32 logsumexp", "issue", 2048, 50257, 768, "logsumexp", misaligned=True),
    Case("4095^3, sum of squares", "issue", 4095, 4095, 4095, "sum_squares", misaligned=True),
    Case("GPT-2 qkv + bias", "gpt2", 8192, 2304, 768, "bias"),
    Case("GPT-2 attention proj + bias + residual", "gpt2", 8192, 768, 768, "bias_residual"),
    Case("GPT-2 MLP up + bias, gelu", "gpt2", 8192, 3072, 768, "bias_gelu"),
    Case("GPT-2 head 50257 + bias, f32", "gpt2", 8192, 50257, 768, "bias_f32", misaligned=True),
    Case("Llama o-proj + residual", "llama", 4096, 2048, 2048, "residual"),
    Case("Llama MLP gate, SwiGLU", "llama", 4096, 5632, 2048, "silu_gate"),
    Case("Llama MLP down + residual", "llama", 4096, 2048, 5632, "residual"),
    Case("Llama head 32003, f32", "llama", 4096, 32003, 2048, "f32", misaligned=True),
]
EPILOGUE_OPERANDS = {"bias_residual": ("row", "full"), "bias": ("row",), "residual": ("full",),
                     "silu_gate": ("full",), "bias_gelu": ("row",), "bias_f32": ("row",),
                     "logsumexp": (), "sum_squares": (), "f32": ()}


def shapes(c: Case) -> list[tuple[int, ...]]:
    lhs = (c.k, c.m) if c.transpose_a else (c.m, c.k)
    rhs = (c.n, c.k) if c.transpose_b else (c.k, c.n)
    extra = {"row": (c.n,), "full": (c.m, c.n)}
    return [lhs, rhs, *(extra[r] for r in EPILOGUE_OPERANDS[c.after])]


# ---------------------------------------------------------------- the computations

def jax_product(c: Case, dot_general):
    def product(a, b):
        dims = (((0 if c.transpose_a else 1,), (1 if c.transpose_b else 0,)), ((), ()))
        return dot_general(a, b, dims)
    return product


def jax_epilogue(c: Case):
    import jax
    import jax.numpy as jnp
    return {
        "bias_residual": lambda y, b, r: y + b + r, "bias": lambda y, b: y + b,
        "residual": lambda y, r: y + r, "silu_gate": lambda y, g: jax.nn.silu(y) * g,
        "bias_gelu": lambda y, b: jax.nn.gelu(y + b), "bias_f32": lambda y, b: (y + b).astype(jnp.float32),
        "f32": lambda y: y.astype(jnp.float32),
        "logsumexp": lambda y: jax.nn.logsumexp(y.astype(jnp.float32), axis=-1),
        "sum_squares": lambda y: jnp.sum(jnp.square(y.astype(jnp.float32))),
    }[c.after]


def torch_fn(c: Case, in_context: bool):
    import torch
    import torch.nn.functional as F

    def product(a, b):
        return (a.t() if c.transpose_a else a) @ (b.t() if c.transpose_b else b)
    if not in_context:
        return product
    epilogue = {
        "bias_residual": lambda y, b, r: y + b + r, "bias": lambda y, b: y + b,
        "residual": lambda y, r: y + r, "silu_gate": lambda y, g: F.silu(y) * g,
        "bias_gelu": lambda y, b: F.gelu(y + b, approximate="tanh"),
        "bias_f32": lambda y, b: (y + b).float(), "f32": lambda y: y.float(),
        "logsumexp": lambda y: torch.logsumexp(y.float(), dim=-1),
        "sum_squares": lambda y: torch.sum(torch.square(y.float())),
    }[c.after]
    return lambda a, b, *ops: epilogue(product(a, b), *ops)


# ---------------------------------------------------------------- Inductor, one child per (case, variant)

def inductor_child(name: str, in_context: bool) -> None:
    import torch
    c = next(c for c in CASES if c.name == name)
    args = [torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in shapes(c)]
    if not in_context:
        args = args[:2]
    compiled = torch.compile(torch_fn(c, in_context), mode="max-autotune-no-cudagraphs", dynamic=False)
    start = time.perf_counter()
    compiled(*args)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - start
    print(json.dumps({"us": peers.torch_kernel_us(lambda: compiled(*args)), "tune_s": tune_s}), flush=True)


def run_inductor(cases: list[Case], budget_s: float, on_row=lambda found: None) -> dict:
    """{case name: {'bare': {...}, 'context': {...}}}, each {'us', 'tune_s'} or {'error'};
    ``on_row(found)`` after each child, so that a run cut short keeps what it measured."""
    found: dict = {}
    for c in cases:
        for variant in ("bare", "context"):
            cmd = [sys.executable, __file__, "--inductor-child", c.name, variant]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s)
                lines = done.stdout.strip().splitlines()
                row = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                    "error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else ''}"}
            except subprocess.TimeoutExpired:
                row = {"error": f"no result within its budget of {budget_s:.0f} s"}
            found.setdefault(c.name, {})[variant] = row
            on_row(found)
            print(json.dumps({"inductor": c.name, variant: row}), flush=True)
    return found


# ---------------------------------------------------------------- JAX: plain and tuned

def run_jax(cases: list[Case], on_row=lambda rows: None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_autotune as jat
    from jax_autotune.tuning.tuner import record_decisions

    rows = []
    for index, c in enumerate(cases):
        keys = jax.random.split(jax.random.key(index), len(shapes(c)))
        args = [jax.random.normal(k, s, jnp.bfloat16) for k, s in zip(keys, shapes(c))]
        epilogue = jax_epilogue(c)
        plain_bare = jax_product(c, lax.dot_general)
        tuned_bare = jax_product(c, jat.dot_general)

        def in_context(a, b, *ops, product=plain_bare, epilogue=epilogue):
            return epilogue(product(a, b), *ops)

        row = {**dataclasses.asdict(c), "label": c.label}
        compiled = {}
        for name, fn, inputs in (("plain_bare", plain_bare, args[:2]), ("tuned_bare", tuned_bare, args[:2]),
                                 ("plain_context", in_context, args), ("tuned_context", jat.autotune(in_context), args)):
            start = time.perf_counter()
            with record_decisions() as decided:
                compiled[name] = jax.jit(fn).lower(*inputs).compile()
            row[f"{name}_compile_s"] = time.perf_counter() - start
            if name.startswith("tuned"):
                row[f"{name}_decisions"] = [{"key": d.key.describe(), "winner": d.winner, "source": d.source,
                                             "tuning_s": d.tuning_seconds} for d in decided]
        row["plain_bare_us"], row["tuned_bare_us"] = peers.interleaved_device_us(
            [compiled["plain_bare"], compiled["tuned_bare"]], args[:2])
        row["plain_context_us"], row["tuned_context_us"] = peers.interleaved_device_us(
            [compiled["plain_context"], compiled["tuned_context"]], args)
        plain_out = compiled["plain_context"](*args)
        tuned_out = compiled["tuned_context"](*args)
        diff = jnp.linalg.norm((tuned_out.astype(jnp.float32) - plain_out.astype(jnp.float32)).ravel())
        row["context_rel_diff"] = float(diff / jnp.linalg.norm(plain_out.astype(jnp.float32).ravel()))
        rows.append(row)
        on_row(rows)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("decisions")}), flush=True)
    return rows


# ---------------------------------------------------------------- report

def _us(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def _inductor(cell) -> str:
    if not cell:
        return "not run"
    if "us" in cell:
        return f"{cell['us']:.1f}"
    return f"failed ({cell['error']})"


def winner(row, variant: str) -> str:
    decided = [d for d in row.get(f"tuned_{variant}_decisions", [])]
    return ", ".join(sorted({d["winner"] for d in decided})) or "-"


def report(rows, inductor, command, jax_version, commit="") -> str:
    date = datetime.date.today().isoformat()
    lines = [f"# Matmuls in context on an H200, {date}", "",
             f"jax {jax_version}; {f'commit {commit}; ' if commit else ''}command: `{command}`", "",
             "bf16. Device time in us of all the kernels of the jitted function (CUPTI; Inductor: "
             "torch.profiler). bare: the matmul alone; context: with the ops after it. plain = "
             "`lax.dot_general` (XLA), tuned = `jat.dot_general` bare and `jat.autotune` in context.", "",
             "| case | m x n x k | after | bare plain / tuned / Inductor | tuned bare winner "
             "| context plain / tuned / Inductor | plain / tuned | tuned context winner | rel. diff to plain |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ind = inductor.get(r["name"], {})
        lines.append(
            f"| {r['name']} | {r['label']} | {r['after']} | {_us(r['plain_bare_us'])} / {_us(r['tuned_bare_us'])} / "
            f"{_inductor(ind.get('bare'))} | {winner(r, 'bare')} | {_us(r['plain_context_us'])} / "
            f"{_us(r['tuned_context_us'])} / {_inductor(ind.get('context'))} | "
            f"{r['plain_context_us'] / r['tuned_context_us']:.2f} | {winner(r, 'context')} | {r['context_rel_diff']:.1e} |")
    ratios = [r["plain_context_us"] / r["tuned_context_us"] for r in rows]
    beats = [r for r in rows if r["tuned_bare_us"] * 1.02 < r["plain_bare_us"]]
    ahead = [(r, inductor.get(r["name"], {}).get("context", {})) for r in rows if r["misaligned"]]
    lines += ["", "| goal | target | reached |", "|---|---|---|",
              f"| in context, plain / tuned, every case | >= 0.98 | min {min(ratios):.2f} |",
              f"| geomean plain / tuned in context, where a candidate beats XLA bare | >= 1.15 | "
              f"{geomean([r['plain_context_us'] / r['tuned_context_us'] for r in beats]):.2f} ({len(beats)} cases) |",
              "| ahead of Inductor in context, every misaligned case | Inductor / tuned > 1 | " + "; ".join(
                  f"{r['name']}: {(cell['us'] / r['tuned_context_us']):.2f}" if "us" in cell else
                  f"{r['name']}: Inductor {_inductor(cell)}" for r, cell in ahead) + " |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--phase", choices=["all", "inductor", "jax", "report"], default="all",
                        help="inductor / jax: measure one side into --out; report: join them")
    parser.add_argument("--date", default=datetime.date.today().isoformat(), help="of the runs to join")
    parser.add_argument("--commit", default="", help="the commit the runs measured, for the report")
    parser.add_argument("--inductor-case-budget-s", type=float, default=120.0)
    parser.add_argument("--cases", default="", help="case names separated by ';' (default: all)")
    parser.add_argument("--misaligned", action="store_true", help="only the cases with a misaligned size")
    parser.add_argument("--inductor-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inductor_child:
        inductor_child(args.inductor_child[0], args.inductor_child[1] == "context")
        return
    chosen = [c for c in CASES if (not args.cases or c.name in args.cases.split(";"))
              and (c.misaligned or not args.misaligned)]
    stem = os.path.join(args.out, f"context_suite_{args.date}")
    command = "python benchmarks/context_suite.py " + " ".join(sys.argv[1:])
    os.makedirs(args.out, exist_ok=True)
    if args.phase in ("all", "inductor"):
        run_inductor(chosen, args.inductor_case_budget_s,
                     lambda found: _dump(f"{stem}_inductor.json", {"inductor": found, "command": command}))
    if args.phase in ("all", "jax"):
        os.environ.setdefault("JAX_AUTOTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="context_suite_"))
        import jax
        run_jax(chosen, lambda rows: _dump(f"{stem}_jax.json", {"rows": rows, "jax": jax.__version__,
                                                               "command": command}))
    if args.phase in ("all", "report"):
        jax_side, inductor_side = _load(f"{stem}_jax.json"), _load(f"{stem}_inductor.json")
        commands = "`, `".join(dict.fromkeys(s["command"] for s in (jax_side, inductor_side) if s.get("command")))
        text = report(jax_side["rows"], inductor_side.get("inductor", {}), commands, jax_side["jax"], args.commit)
        print(text)
        write_results(args.out, os.path.basename(stem), text, {**jax_side, **inductor_side})


def _dump(path: str, data) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)


def _load(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    main()
