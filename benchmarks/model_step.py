"""Training and decode steps of five models, plain against tuned: warmup cost, first step, step time.

    python benchmarks/model_step.py --out benchmarks/results [--models gpt2,llama,vit,decode,moe]
        [--variants plain,layers,autotune[,fused_attention,autotune_fused_attention,jax_attention,...]] [--param-dtype float32|bfloat16] [--size real|tiny]
        [--decode-batch 8..64] [--steps 10] [--timeout-s 240]

* ``gpt2``: GPT-2-small in flax linen, 12 layers, d 768, 12 heads, vocabulary 50257 (an
  untied output head), batch 8 x 1024;
* ``llama``: a Llama-style decoder, 8 layers, d 2048, RMSNorm, grouped-query attention (16
  query heads, 4 key-value heads), SwiGLU MLP (hidden 5632), no biases, an untied head
  with an odd vocabulary (32003), batch 4 x 1024;
* ``vit``: a ViT-B/16-like encoder, 224 x 224 x 3 images cut into 196 patches of 16 x 16 x
  3 (a Dense to d 768), a class token in front: 197 tokens, 12 layers, 12 heads, MLP 3072,
  bidirectional attention, a 1000-class head on the class token, batch 64;
* ``decode``: the ``llama`` decoder serving: one new token for each of 32 sequences
  (``--decode-batch``) over a KV cache of 2048 (per layer k, v of 32 x 2048 x 4 x 128 bf16,
  written at the position by ``lax.dynamic_update_slice``), the new token's logits and the
  cache out, forward only (no gradient, no optimizer);
* ``moe``: the ``llama`` decoder with 4 layers and every MLP a top-2 mixture of 8 SwiGLU
  experts (hidden 2816; tokens sorted by expert, the experts as ``lax.ragged_dot``; the
  ``layers`` variant uses ``jat.ragged_dot``), batch 4 x 1024.
The training models take softmax cross-entropy against integer targets and AdamW (optax).
All compute in bf16; parameters are f32, or with ``--param-dtype bfloat16`` cast to bf16
after init (bf16 master weights, optimizer state too). ``--size tiny`` shrinks every model
(2 layers, d 64, 4 heads, vocabulary 1003, 32 x 32 images of patch 8 -> 17 tokens, cache
64, batch 2) to run on a CPU in minutes. Variants of the same step:
* ``plain``: every Dense with ``lax.dot_general`` (flax's default);
* ``layers``: every Dense with ``dot_general=jat.dot_general``;
* ``autotune``: the plain model's loss (decode: decode function) through ``jat.autotune``
  (every matmul, the attention einsums too);
* ``fused_attention`` (not run by default): the plain model with its attention written as
  ``jax.nn.dot_product_attention`` (cuDNN's fused attention on a GPU; causal or unmasked
  attention only, so decode keeps its einsums), the peer a JAX user writes by hand;
  ``autotune_fused_attention``: that model through ``jat.autotune``;
* ``jax_attention`` (not run by default): the same with ``jax.nn.dot_product_attention``
  naming no implementation (JAX's XLA one, what flax nnx's attention runs), and
  ``autotune_jax_attention``: that model through ``jat.autotune``, which fuses it where
  it wins (Llama's grouped queries too, given unrepeated).
For each: ``jat.warmup(loss, params, batch, grad=True)`` seconds (decode: ``jat.warmup(
decode, params, cache, tokens, pos, donate_argnums=1)``, the cache donated as the step
donates it), the first step after warmup (compile only: the
tuner must tune nothing), the median of the next steps, the first losses (decode: the mean
logsumexp of the new token's logits; equal across variants within bf16 noise). Each
variant runs in its own process with a fresh tune store, so nothing is shared between them.
Each tuned variant's process then also builds the plain step and runs the two in turns
(``--steps`` pairs; ``--no-beside-plain`` skips it): both medians, ``beside_plain_ms`` and
``beside_ms``, come from one process and one stretch of time, the table's "in turns" ratio;
``--beside-layers`` adds ``layers``' step to an ``autotune`` process's turns (``beside_layers_ms``).
``--warm-whole-step`` warms up a training model's whole jitted step (its optimizer in the
program check's timing) instead of its loss with ``grad=True``. ``--donate-state``: every
training step donates its parameters and optimizer state (its whole-step warmup passes
``donate_argnums=(0, 1)``), as flax's and MaxText's loops do; without it no step donates.
Each tuned variant's row carries its store's per-key tuning cost (``tuning_cost``, as
``benchmarks/tuning_cost.py`` reads it), so the JSON alone says where the warmup went.
Why: across processes one program measured 0.91-0.94x of itself on the CPU (tiny decode and
GPT-2 `autotune` with every key left plain, compiled to plain's HLO; in turns, 300 pairs,
143.7 against 142.8 us for decode).
Models are in ``benchmarks/step_models.py``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from report import child_result, write_results
from tuning_cost import store_keys

VARIANTS = ("plain", "layers", "autotune", "fused_attention", "autotune_fused_attention", "jax_attention",
            "autotune_jax_attention")
UNTUNED = ("plain", "fused_attention", "jax_attention")  # the variants that warm up nothing
DEFAULT_VARIANTS = ("plain", "layers", "autotune")
PARAM_DTYPES = ("float32", "bfloat16")
_LLAMA = dict(layers=8, d=2048, heads=16, kv_heads=4, hidden=5632, vocab=32003)
MODELS = {  # name -> the sizes its builder takes (and its inputs': batch, seq, image, cache)
    "gpt2": dict(layers=12, d=768, heads=12, vocab=50257, batch=8, seq=1024),
    "llama": dict(_LLAMA, batch=4, seq=1024),
    "vit": dict(layers=12, d=768, heads=12, mlp=3072, image=224, patch=16, classes=1000, batch=64),
    "decode": dict(_LLAMA, batch=32, cache=2048),
    "moe": dict(_LLAMA, layers=4, hidden=2816, experts=8, top_k=2, batch=4, seq=1024),
}
_TINY_LLAMA = dict(layers=2, d=64, heads=4, kv_heads=2, hidden=176, vocab=1003)
SIZES = {"real": MODELS, "tiny": {
    "gpt2": dict(layers=2, d=64, heads=4, vocab=1003, batch=2, seq=32),
    "llama": dict(_TINY_LLAMA, batch=2, seq=33),
    "vit": dict(layers=2, d=64, heads=4, mlp=256, image=32, patch=8, classes=1003, batch=2),
    "decode": dict(_TINY_LLAMA, batch=2, cache=64),
    "moe": dict(_TINY_LLAMA, hidden=96, experts=4, top_k=2, batch=2, seq=33),
}}


def sizes_of(model: str, size: str = "real", decode_batch: int | None = None) -> dict:
    """The sizes of ``model`` in preset ``size``, decode's batch replaced where given.

        >>> sizes_of("decode", "real", 64)["batch"]
        64
    """
    sizes = dict(SIZES[size][model])
    if model == "decode" and decode_batch:
        sizes["batch"] = decode_batch
    return sizes


def build(model: str, variant: str, sizes: dict):
    """(flax module, loss(params, batch), optax optimizer, jitted step(params, opt_state,
    batch)) of a training model, as ``benchmarks/cold_runs.py`` takes it.

        >>> module, loss, optimizer, step = build("gpt2", "layers", MODELS["gpt2"])
    """
    from step_models import train_parts
    return train_parts(model, variant, sizes)



def tuning_breakdown(decisions) -> dict:
    """Seconds of the warmup's tunings, summed over keys: all of each tuning, its
    compiles of XLA dots less their waits for the device (XLA's GEMM autotuner runs in
    them with the device held alone: but for their lowering they never overlap, so their
    sum is close to a floor of the warmup), every candidate's compiles less their waits and
    the waits, and how many candidates compiled."""
    tuned = {d.key: d for d in decisions if d.source == "tuned"}.values()
    xla = [r for d in tuned for r in d.results if r.name.startswith(("xla_", "padded_xla_"))]
    def compiling(results):
        return sum((r.compile_seconds or 0.0) - (r.compile_wait_seconds or 0.0) for r in results)

    every = [r for d in tuned for r in d.results]
    return {"tuning_s_sum": sum(d.tuning_seconds or 0.0 for d in tuned),
            "xla_dot_compile_s_sum": compiling(xla), "compile_s_sum": compiling(every),
            "compile_wait_s_sum": sum(r.compile_wait_seconds or 0.0 for r in every),
            "candidates_compiled": sum(1 for r in every if r.compile_seconds)}


def timed_priming() -> list[dict]:
    """From now on, each priming compile's count and seconds (``tuning.xla_priming``)."""
    from jax_autotune.tuning import xla_priming
    primes, original = [], xla_priming.prime

    def timed(pairs, device):
        start = time.perf_counter()
        primed = original(pairs, device)
        primes.append({"primed": primed, "seconds": time.perf_counter() - start})
        return primed

    xla_priming.prime = timed
    return primes


def timed_warmup(case, whole: bool = False) -> dict:
    """``jat.warmup`` of the case's function (``whole``: of its whole training step): seconds,
    keys, winners, tunings, primes."""
    from jax_autotune.tuning.tuner import record_decisions

    primes = timed_priming()
    start = time.perf_counter()
    with record_decisions() as decided:
        report = case.warmup(whole=whole)
    row = {"warmup_s": time.perf_counter() - start, "xla_primes": [p for p in primes if p["primed"]],
           "keys": len(report), "winners": sorted({e.winner for e in report}),
           "program_check": str(report.program) if report.program else "",
           "program_check_s": report.program.seconds if report.program else 0.0,
           "plain_compile_s": report.program.plain_compile_seconds if report.program else None,
           "plain_compile_wait_s": report.program.plain_compile_wait_seconds if report.program else None,
           "warmup_phases_s": dict(report.seconds),
           "attention": [f"{d.key.describe()}: {d.winner}" for d in report.attention]}
    return {**row, **tuning_breakdown(decided)}


def run_variant(args) -> dict:
    """One variant in this process: warmup (but plain), first step, the next steps.

        >>> run_variant(argparse.Namespace(model="vit", variant="autotune", size="tiny",
        ...             param_dtype="float32", decode_batch=None, steps=3))
    """
    import jax_autotune as jat
    from step_models import make_case

    case = make_case(args.model, args.variant, sizes_of(args.model, args.size, args.decode_batch),
                     args.param_dtype, getattr(args, "donate_state", False))
    row = {"model": args.model, "variant": args.variant, "size": args.size, "param_dtype": args.param_dtype}
    if getattr(args, "key_threads", None):
        importlib.import_module("jax_autotune.warmup").KEY_THREADS = row["key_threads"] = args.key_threads
    if args.variant not in UNTUNED:
        whole = getattr(args, "warm_whole_step", False)
        row.update(timed_warmup(case, whole), **({"warm_whole_step": True} if whole else {}))
    if getattr(args, "donate_state", False):
        row["donate_state"] = True
    before = jat.stats()
    state, value, row["first_step_s"] = timed_step(case, case.state)
    row["tuned_in_first_step"] = jat.stats()["tuned"] - before["tuned"]
    losses, times = [float(value)], []
    for _ in range(args.steps):
        state, value, seconds = timed_step(case, state)
        times.append(seconds)
        losses.append(float(value))
    row.update(step_ms=statistics.median(times) * 1e3, losses=losses[:4])
    if getattr(args, "beside_plain", False) and args.variant not in UNTUNED:
        row.update(in_turns(args, case, state))
    return row


def timed_step(case, state):
    """``case.step`` on ``state``, waited for: (state, value, wall seconds)."""
    import jax

    start = time.perf_counter()
    state, value = case.step(state, case.inputs)
    jax.block_until_ready(value)
    return state, value, time.perf_counter() - start


def in_turns(args, case, state) -> dict:
    """The tuned step and the plain one, built in this process, run in turns: their medians
    (``beside_ms``, ``beside_plain_ms``); with ``--beside-layers`` an ``autotune`` step also
    turns with ``layers``' (warmed up here first; ``beside_layers_ms``)."""
    from step_models import make_case

    others = ["plain"] + (["layers"] if getattr(args, "beside_layers", False) and args.variant == "autotune" else [])
    cases, states = {"tuned": case}, {"tuned": state}
    for name in others:
        cases[name] = make_case(args.model, name, sizes_of(args.model, args.size, args.decode_batch), args.param_dtype,
                                getattr(args, "donate_state", False))
        if name not in UNTUNED:
            cases[name].warmup()
        states[name] = timed_step(cases[name], cases[name].state)[0]  # its compile
    times: dict = {name: [] for name in cases}
    for _ in range(args.steps):
        for name in cases:
            states[name], _, seconds = timed_step(cases[name], states[name])
            times[name].append(seconds)
    medians = {name: statistics.median(seconds) * 1e3 for name, seconds in times.items()}
    return {"beside_ms": medians.pop("tuned"), **{f"beside_{name}_ms": ms for name, ms in medians.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--models", default="gpt2,llama", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, of {VARIANTS}")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--param-dtype", choices=PARAM_DTYPES, default="float32",
                        help="dtype of the parameters after init (compute is bf16 either way)")
    parser.add_argument("--size", choices=sorted(SIZES), default="real", help="tiny: every model shrunk, for a CPU")
    parser.add_argument("--decode-batch", type=int, default=None, help="sequences of the decode step (real: 32)")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--beside-plain", action=argparse.BooleanOptionalAction, default=True,
                        help="also run each tuned step in turns with the plain step in its process")
    parser.add_argument("--beside-layers", action="store_true",
                        help="also run the autotune step in turns with layers' (hand placement) in its process")
    parser.add_argument("--warm-whole-step", action="store_true",
                        help="warm up a training model's whole jitted step (optimizer too), not its loss with grad=True")
    parser.add_argument("--donate-state", action="store_true",
                        help="training steps donate their parameters and optimizer state (as flax's and MaxText's loops do)")
    parser.add_argument("--key-threads", type=int, default=None,
                        help="keys a GPU warmup tunes at once (default: the package's KEY_THREADS)")
    parser.add_argument("--keep-stores", default=None, metavar="DIR",
                        help="keep each variant's tune store in a new DIR/<model>_<variant>_* (default: a temporary folder)")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    options = [f"--steps={args.steps}", f"--size={args.size}", f"--param-dtype={args.param_dtype}"]
    options += [f"--decode-batch={args.decode_batch}"] if args.decode_batch else []
    options += [f"--key-threads={args.key_threads}"] if args.key_threads else []
    options += ["--beside-plain"] if args.beside_plain else []
    options += ["--beside-layers"] if args.beside_layers else []
    options += ["--warm-whole-step"] if args.warm_whole_step else []
    options += ["--donate-state"] if args.donate_state else []
    rows = []
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            store = store_dir(args.keep_stores, model, variant)
            env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=store)
            try:
                rows.append(child_result(__file__, ["--model", model, "--variant", variant, *options], env,
                                         args.timeout_s))
                if variant not in UNTUNED:
                    rows[-1]["tuning_cost"] = store_keys(store)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as err:
                rows.append({"model": model, "variant": variant, "size": args.size, "param_dtype": args.param_dtype,
                             "error": f"{type(err).__name__}: {err}"[-2000:]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "tuning_cost"}), flush=True)
    import jax
    command = "python benchmarks/model_step.py " + " ".join(sys.argv[1:])
    sizes = {model: sizes_of(model, args.size, args.decode_batch) for model in args.models.split(",")}
    text = report(rows, command, jax.__version__, jax.devices()[0].device_kind, sizes)
    print(text)
    suffix = "".join(f"_{word}" for word, default in ((args.size, "real"), (args.param_dtype, "float32"))
                     if word != default)
    write_results(args.out, f"model_step_{datetime.date.today().isoformat()}{suffix}", text,
                  {"rows": rows, "command": command, "size": args.size, "param_dtype": args.param_dtype})


def store_dir(keep: str | None, model: str, variant: str) -> str:
    """A fresh folder for one variant's tune store: a new ``keep/<model>_<variant>_*``, to read
    its decisions afterwards, else a temporary one.

        >>> store_dir("/tmp/stores", "gpt2", "autotune")
        '/tmp/stores/gpt2_autotune_k2x9'
    """
    if keep is not None:
        os.makedirs(keep, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{model}_{variant}_" if keep else f"model_step_{model}_{variant}_", dir=keep)


def report(rows, command, jax_version, device, sizes: dict | None = None) -> str:
    """The markdown of a run: a table a model (``sizes``: model -> its sizes; default MODELS)."""
    lines = [f"# Model steps on {device}, {datetime.date.today().isoformat()}", "",
             f"jax {jax_version}; command: `{command}`", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += model_table(model, [r for r in rows if r["model"] == model], (sizes or MODELS)[model])
    return "\n".join(lines) + "\n"


def model_table(model: str, rows: list[dict], sizes: dict) -> list[str]:
    params = next((r["param_dtype"] for r in rows if "param_dtype" in r), "float32")
    plain = next((r for r in rows if r["variant"] == "plain" and "step_ms" in r), None)
    kind, values = ("forward only, KV cache", "first mean logsumexp of logits") if model == "decode" else \
        ("AdamW", "first losses")
    lines = [f"## {model} ({', '.join(f'{k} {v}' for k, v in sizes.items())}; bf16 compute, {params} params, "
             f"{kind})", "",
             "| variant | warmup s (XLA dot compiles, summed; XLA dots primed together) | keys | first step s | tuned in first step | step ms "
             f"| plain / variant | in turns with plain: ms, plain / variant | {values} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | error: {r['error'].splitlines()[-1][:120] if r['error'] else '?'} |")
            continue
        ratio = f"{plain['step_ms'] / r['step_ms']:.3f}" if plain else "-"
        warm = f"{r['warmup_s']:.1f}" if "warmup_s" in r else "-"
        if "xla_dot_compile_s_sum" in r:
            warm += f" ({r['xla_dot_compile_s_sum']:.1f})"
        for prime in r.get("xla_primes", []):
            warm += f"; {prime['primed']} primed in {prime['seconds']:.1f} s"
        lines.append(f"| {r['variant']} | {warm} | {r.get('keys', '-')} | {r['first_step_s']:.2f} | "
                     f"{r['tuned_in_first_step']} | {r['step_ms']:.2f} | {ratio} | {_in_turns(r)} | "
                     f"{', '.join(f'{x:.4f}' for x in r['losses'])} |")
    checks = [f"- {r['variant']}: {r['program_check']}" for r in rows if r.get("program_check")]
    checks += [f"- {r['variant']} warmup: " + ", ".join(f"{phase} {s:.1f} s" for phase, s in r["warmup_phases_s"].items())
               for r in rows if r.get("warmup_phases_s")]
    checks += [f"- {r['variant']} attention: {a}" for r in rows for a in r.get("attention", [])]
    return lines + ([""] + checks if checks else []) + [""]


def _in_turns(row: dict) -> str:
    if "beside_ms" not in row:
        return "-"
    text = f"{row['beside_ms']:.2f} / {row['beside_plain_ms']:.2f}, **{row['beside_plain_ms'] / row['beside_ms']:.3f}**"
    if "beside_layers_ms" in row:
        text += f"; layers {row['beside_layers_ms']:.2f}, layers / variant **{row['beside_layers_ms'] / row['beside_ms']:.3f}**"
    return text


if __name__ == "__main__":
    main()
