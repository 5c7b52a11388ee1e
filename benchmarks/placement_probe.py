"""Which tuned keys a whole training step gains from: the step with sets of keys left plain.

    python benchmarks/placement_probe.py --out benchmarks/results [--models gpt2,llama] [--param-dtype bfloat16]

For each model (``benchmarks/step_models.py``, variant ``autotune``): ``jat.warmup(loss, ...,
grad=True)`` as a user runs it, its whole-program check included; then, with the same
compiled plain program and the check's own interleaved wall-clock timing
(``program_check.WallClock``), the step with each of these sets of keys left plain:
the lowest-claimed-gain prefixes of the check's order (a quarter, half, three quarters of
the keys), the batched keys (attention's einsums), the keys with an epilogue, the keys whose
winner is padded, the keys whose winner is XLA's dot. Each row is one compile and
``ROUNDS`` timed runs beside plain's; speedup = plain / that program. Per key: uses, winner,
XLA's and the winner's tuned times, the claimed gain in the step (uses x (XLA - winner)).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import child_result, write_results  # noqa: E402


def subsets(keys: list, entries: dict, gains: dict) -> list[tuple[str, frozenset]]:
    """(label, keys left plain) to time, ``keys`` in the check's order (lowest claimed gain first)."""
    out = [("all tuned", frozenset())]
    for gap_us in (5, 20):
        small = [k for k in keys if gains.get(k, 0.0) * 1e6 < gap_us]
        out.append((f"gain per use < {gap_us} us plain", frozenset(small)))
    for fraction in (0.25, 0.5, 0.75):
        count = max(1, round(len(keys) * fraction))
        out.append((f"lowest-gain {count} of {len(keys)} plain", frozenset(keys[:count])))
    groups = {
        "batched keys plain": [k for k in keys if k.batch > 1],
        "epilogue keys plain": [k for k in keys if not k.epilogue.is_bare],
        "padded winners plain": [k for k in keys if entries[k]["winner"].startswith("padded_")],
        "xla-won keys plain": [k for k in keys if entries[k]["winner"].startswith("xla_")],
    }
    out += [(label, frozenset(group)) for label, group in groups.items() if group]
    return out


def probe(model: str, size: str, param_dtype: str) -> dict:
    """One model: warmup with its check, then every subset of ``subsets`` timed beside plain."""
    from jax_autotune import program_check
    from step_models import make_case

    from model_step import sizes_of

    case = make_case(model, "autotune", sizes_of(model, size), param_dtype)
    seen = {}
    original = program_check.check

    def check(target, args, program_ids, uses, gains, tuner, measure=None, xla_won=frozenset(), donate=()):
        keys = program_check.claimed_order(uses, gains)
        clock = program_check.WallClock(target, args, program_ids, tuner, frozenset(keys), donate)
        seen.update(clock=clock, keys=keys, uses=uses, gains=gains, program_ids=program_ids, tuner=tuner)
        return original(target, args, program_ids, uses, gains, tuner, measure=clock, xla_won=xla_won,
                        donate=donate)

    program_check.check = check
    start = time.perf_counter()
    report = case.warmup()
    row = {"model": model, "param_dtype": param_dtype, "warmup_s": time.perf_counter() - start,
           "program_check": str(report.program)}
    if "clock" not in seen:
        return {**row, "error": "the warmup made no program check (nothing compiled tuned)"}
    entries = {e.key: {"winner": e.winner, "xla_us": _us(e.xla_seconds), "winner_us": _us(e.winner_seconds)}
               for e in report}
    keys, uses, gains = seen["keys"], seen["uses"], seen["gains"]
    row["keys"] = [{"key": k.canonical(), "label": key_label(k), "uses": uses[k], **entries.get(k, {"winner": "?"}),
                    "claimed_gain_us": round(max(gains.get(k, 0.0), 0.0) * uses[k] * 1e6, 1)} for k in keys]
    entries = {k: entries.get(k, {"winner": "?"}) for k in keys}
    row["trials"] = []
    for label, left in subsets(keys, entries, gains):
        started = time.perf_counter()
        (seconds, plain), = seen["clock"](left)
        row["trials"].append({"set": label, "left_plain": len(left), "ms": seconds * 1e3,
                              "plain_ms": plain * 1e3, "speedup": plain / seconds,
                              "seconds": time.perf_counter() - started})
        print(json.dumps(row["trials"][-1]), flush=True)
    return row


def key_label(key) -> str:
    """A key in a few words: dims, batch, transposed operands, epilogue ops."""
    text = f"{key.m}x{key.n}x{key.k}" + (f" batch {key.batch}" if key.batch > 1 else "")
    text += "".join(f" {side}.T" for side, layout in (("lhs", key.lhs_layout), ("rhs", key.rhs_layout))
                    if "transposed:true" in str(layout).replace(" ", ""))
    ops = str(key.epilogue).split("|")[-1] if not key.epilogue.is_bare else ""
    return f"{text} {key.lhs_dtype}->{key.out_dtype}" + (f" then {ops[:60]}" if ops else "")


def _us(seconds):
    return None if seconds is None else round(seconds * 1e6, 1)


def report(rows: list[dict], command: str, device: str, jax_version: str) -> str:
    lines = [f"# Keys left plain in a whole step ({datetime.date.today().isoformat()})", "",
             f"`{command}` on {device}, jax {jax_version}; wall ms per step (the program check's"
             " timing: median of interleaved runs beside the plain program).", ""]
    for row in rows:
        lines += [f"## {row['model']} ({row['param_dtype']} parameters)", ""]
        if "error" in row:
            lines += [f"failed: {row['error']}", ""]
            continue
        lines += [f"warmup {row['warmup_s']:.1f} s; {row['program_check']}", "",
                  "| keys left plain | count | step ms | plain ms | plain / step |", "|---|---|---|---|---|"]
        lines += [f"| {t['set']} | {t['left_plain']} | {t['ms']:.2f} | {t['plain_ms']:.2f} | {t['speedup']:.3f}x |"
                  for t in row["trials"]]
        lines += ["", "| key | uses | winner | XLA us | winner us | claimed gain us |", "|---|---|---|---|---|---|"]
        lines += [f"| {k['label']} | {k['uses']} | {k['winner']} | {k.get('xla_us')} | {k.get('winner_us')} "
                  f"| {k['claimed_gain_us']} |" for k in row["keys"]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--param-dtype", default="bfloat16")
    parser.add_argument("--size", default="real", help="tiny: every model shrunk, for a CPU")
    parser.add_argument("--timeout-s", type=float, default=280.0)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model:
        print(json.dumps(probe(args.model, args.size, args.param_dtype)))
        return
    rows = []
    for model in args.models.split(","):
        env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=tempfile.mkdtemp(prefix=f"placement_{model}_"))
        try:
            rows.append(child_result(__file__, ["--model", model, f"--size={args.size}",
                                                f"--param-dtype={args.param_dtype}"], env, args.timeout_s))
        except Exception as err:  # noqa: BLE001 - a failed model is a row saying why
            rows.append({"model": model, "param_dtype": args.param_dtype, "error": f"{type(err).__name__}: {err}"[-2000:]})
    import jax
    command = "python benchmarks/placement_probe.py " + " ".join(sys.argv[1:])
    text = report(rows, command, jax.devices()[0].device_kind, jax.__version__)
    print(text)
    write_results(args.out, f"placement_probe_{datetime.date.today().isoformat()}", text,
                  {"rows": rows, "command": command})


if __name__ == "__main__":
    main()
