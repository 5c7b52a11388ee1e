"""Where a warmup's tuning went, per key and per candidate family, read from kept tune stores
(``model_step.py --keep-stores DIR``): what each key compiled, how long, and how far each
compiled candidate finished from the key's winner, so a cost rule can be checked against
what the device measured.

    python benchmarks/tuning_cost.py DIR [DIR ...] [--json OUT.json]
    python benchmarks/tuning_cost.py model_step_DATE.json     # the rows' ``tuning_cost``

A ``model_step.py`` results JSON holds the same summaries (each tuned row's ``tuning_cost``),
read at the end of its run, so its stores need not be kept.

For each store (``DIR/*/default.db`` or a ``default.db`` itself): one row per tuned key
(winner, candidates compiled, compile seconds summed, tuning seconds), then per family (the
candidate name up to its config: ``mosaic_gemm``, ``triton_gemm``, ``cublaslt``...): how
many compiled, their compile seconds, how many won, and how many finished over 1.3x and
over 2x the key's winner (compiles a rule that knew the result would have saved).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sqlite3
import statistics

MATMUL_NAMESPACE = "autotune/"  # the store's namespace of matmul decisions (then version/jax/device)


def stores(paths: list[str]) -> list[str]:
    """The ``default.db`` files under ``paths``."""
    found = []
    for path in paths:
        found += [path] if path.endswith(".db") else sorted(glob.glob(os.path.join(path, "**", "default.db"),
                                                                      recursive=True))
    return found


def decisions(db: str) -> list[dict]:
    """The matmul decisions of one store, as stored (JSON)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT value FROM entries WHERE namespace LIKE ?", (MATMUL_NAMESPACE + "%",))
        return [json.loads(value) for (value,) in rows]


def store_keys(folder: str) -> list[dict]:
    """Each tuned key's ``summary`` in the stores under ``folder`` (a variant's tune store).

        >>> [k["winner"] for k in store_keys("/tmp/stores/gpt2_autotune_k2x9")]
        ['xla_dot', 'cublaslt_algo0', ...]
    """
    return [key for db in stores([folder]) for key in db_keys(db)]


def db_keys(db: str) -> list[dict]:
    """Each tuned key's ``summary`` in the store file ``db``."""
    return [summary(d) for d in decisions(db)]


def from_results(path: str) -> dict[str, list[dict]]:
    """``model_step.py`` results: ``"PATH: model variant"`` -> that row's ``tuning_cost``."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {f"{path}: {r['model']} {r['variant']}": r["tuning_cost"] for r in rows if r.get("tuning_cost")}


def family(name: str) -> str:
    """A candidate's family: its name without the config (``mosaic_gemm_128x256_s4`` -> ``mosaic_gemm``)."""
    words = []
    for word in name.split("_"):
        if re.search(r"\d", word):
            break
        words.append(word)
    return "_".join(words) or name


def short_key(text: str) -> str:
    """A key's text without its alignment factors, a transposed layout as ``T``."""
    text = re.sub(r" \w+_(pow2|stride)_factor=\d+", "", text)
    return re.sub(r"MildlyPermuted\{transposed:true,batch_swap:false\}", "T", text)


def summary(decision: dict) -> dict:
    """One key: winner, what compiled, and each compiled candidate's score over the winner's."""
    results = decision.get("results", [])
    compiled = [r for r in results if r.get("compile_seconds") is not None]
    scores = {r["name"]: r["score"] for r in results if r.get("score")}
    best = scores.get(decision["winner"])
    return {"key": short_key(decision["key_string"]), "winner": decision["winner"], "source": decision.get("source", ""),
            "tuning_s": decision.get("tuning_seconds"), "compiled": len(compiled),
            "phases_s": (decision.get("bounds") or {}).get("phase_seconds", {}),
            "compile_wait_s": sum(r.get("compile_wait_seconds") or 0.0 for r in compiled),
            "compile_s": sum(r["compile_seconds"] for r in compiled),
            "candidates": [{"name": r["name"], "family": family(r["name"]), "outcome": r["outcome"],
                            "compile_s": r["compile_seconds"],
                            "over_winner": scores[r["name"]] / best if best and r["name"] in scores else None}
                           for r in compiled]}


def families(keys: list[dict]) -> dict[str, dict]:
    """Per family: compiles, their seconds, wins, and compiles that finished over 1.3x / 2x the winner."""
    table: dict[str, dict] = {}
    for key in keys:
        for c in key["candidates"]:
            row = table.setdefault(c["family"], dict(compiled=0, compile_s=0.0, won=0, over_1_3=0, over_2=0,
                                                     over_1_3_s=0.0, failed=0))
            row["compiled"] += 1
            row["compile_s"] += c["compile_s"] or 0.0
            row["won"] += c["name"] == key["winner"]
            ratio = c["over_winner"]
            if ratio is None and c["outcome"] != "ok":
                row["failed"] += 1
            if ratio is not None and ratio > 1.3:
                row["over_1_3"] += 1
                row["over_1_3_s"] += c["compile_s"] or 0.0
            row["over_2"] += ratio is not None and ratio > 2.0
    return table


def report(source: str, keys: list[dict]) -> str:
    """The markdown of one store's keys (``source`` names it: a .db, or a results row)."""
    lines = [f"## {source}", "", f"{len(keys)} keys; {sum(k['compiled'] for k in keys)} compiles, "
             f"{sum(k['compile_s'] for k in keys):.1f} s summed; tuning "
             f"{sum(k['tuning_s'] or 0 for k in keys):.1f} s summed"
             + (f", median {statistics.median(k['tuning_s'] or 0 for k in keys):.2f} s" if keys else ""), "",
             "Summed over keys, by phase of a key's tuning: "
             + ", ".join(f"{phase} {sum(k['phases_s'].get(phase, 0.0) for k in keys):.1f} s"
                         for phase in dict.fromkeys(p for k in keys for p in k["phases_s"]))
             + f"; compiles waiting for the device {sum(k['compile_wait_s'] for k in keys):.1f} s", "",
             "| key | winner | compiled | compile s | tuning s |", "|---|---|---|---|---|"]
    for k in sorted(keys, key=lambda k: -(k["tuning_s"] or 0)):
        lines.append(f"| {k['key']} | {k['winner']} | {k['compiled']} | {k['compile_s']:.1f} | "
                     f"{k['tuning_s'] or 0:.2f} |")
    lines += ["", "| family | compiled | compile s | won | failed | over 1.3x winner (compile s) | over 2x |",
              "|---|---|---|---|---|---|---|"]
    for name, row in sorted(families(keys).items(), key=lambda item: -item[1]["compile_s"]):
        lines.append(f"| {name} | {row['compiled']} | {row['compile_s']:.1f} | {row['won']} | {row['failed']} | "
                     f"{row['over_1_3']} ({row['over_1_3_s']:.1f}) | {row['over_2']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+",
                        help="kept store folders (model_step.py --keep-stores), .db files or model_step results .json")
    parser.add_argument("--json", default=None, help="also write every key's summary here")
    args = parser.parse_args()
    everything = {}
    for path in args.paths:
        if path.endswith(".json"):
            everything.update(from_results(path))
    for db in stores([p for p in args.paths if not p.endswith(".json")]):
        everything[db] = db_keys(db)
    for name, keys in everything.items():
        print(report(name, keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
