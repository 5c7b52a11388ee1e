"""Training steps of two models, plain against tuned: warmup cost, first step, step time.

    python benchmarks/model_step.py --out benchmarks/results [--models gpt2,llama]

* ``gpt2``: GPT-2-small in flax linen, 12 layers, d 768, 12 heads, vocabulary 50257 (an
  untied output head), batch 8 x 1024;
* ``llama``: a Llama-style decoder, 8 layers, d 2048, RMSNorm, grouped-query attention (16
  query heads, 4 key-value heads), SwiGLU MLP (hidden 5632), no biases, an untied head
  with an odd vocabulary (32003), batch 4 x 1024.
Both in bf16 compute with f32 parameters, AdamW (optax). Three variants of the same step:
* ``plain``: every Dense with ``lax.dot_general`` (flax's default);
* ``layers``: every Dense with ``dot_general=jat.dot_general``;
* ``autotune``: the plain model's loss through ``jat.autotune`` (every matmul, the
  attention einsums too).
For each: ``jat.warmup(loss, params, batch, grad=True)`` seconds, the first step after
warmup (compile only: the tuner must tune nothing), the median of the next steps, the
first losses (equal across variants within bf16 noise). Each variant runs in its own
process with a fresh tune store, so nothing is shared between them.
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

from report import child_result, write_results

VARIANTS = ("plain", "layers", "autotune")
MODELS = {  # name -> the sizes its builder takes
    "gpt2": dict(layers=12, d=768, heads=12, vocab=50257, batch=8, seq=1024),
    "llama": dict(layers=8, d=2048, heads=16, kv_heads=4, hidden=5632, vocab=32003, batch=4, seq=1024),
}


def build(model: str, variant: str, sizes: dict):
    """(flax module, loss(params, batch), optax optimizer, jitted train step)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    import jax_autotune as jat

    dot = jat.dot_general if variant == "layers" else jax.lax.dot_general
    module = (gpt2 if model == "gpt2" else llama)(nn, jax, jnp, dot, **{k: v for k, v in sizes.items() if k != "batch"})

    def loss(params, batch):
        tokens, targets = batch
        logits = module.apply(params, tokens).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    if variant == "autotune":
        loss = jat.autotune(loss)
    optimizer = optax.adamw(3e-4)

    @jax.jit
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return module, loss, optimizer, step


def gpt2(nn, jax, jnp, dot, *, layers: int, d: int, heads: int, vocab: int, seq: int):
    dense = lambda features, name: nn.Dense(features, dtype=jnp.bfloat16, dot_general=dot,  # noqa: E731
                                            name=name)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            b, t, _ = x.shape
            h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
            q, k, v = jnp.split(dense(3 * d, "qkv")(h).reshape(b, t, 3 * heads, d // heads), 3, axis=2)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
            causal = jnp.tril(jnp.ones((t, t), bool))
            weights = jax.nn.softmax(jnp.where(causal, scores, -1e9).astype(jnp.float32), axis=-1)
            attended = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(jnp.bfloat16), v).reshape(b, t, d)
            x = x + dense(d, "proj")(attended)
            h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
            return x + dense(d, "down")(nn.gelu(dense(4 * d, "up")(h)))

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, d, dtype=jnp.bfloat16)(tokens)
            x = x + self.param("pos", nn.initializers.normal(0.02), (seq, d)).astype(jnp.bfloat16)
            for i in range(layers):
                x = Block(name=f"block{i}")(x)
            return dense(vocab, "head")(nn.LayerNorm(dtype=jnp.bfloat16)(x))

    return GPT()


def llama(nn, jax, jnp, dot, *, layers: int, d: int, heads: int, kv_heads: int, hidden: int,
          vocab: int, seq: int):
    head_dim = d // heads
    dense = lambda features, name: nn.Dense(features, use_bias=False, dtype=jnp.bfloat16,  # noqa: E731
                                            dot_general=dot, name=name)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            b, t, _ = x.shape
            h = nn.RMSNorm(dtype=jnp.bfloat16)(x)
            q = dense(heads * head_dim, "q")(h).reshape(b, t, heads, head_dim)
            k = dense(kv_heads * head_dim, "k")(h).reshape(b, t, kv_heads, head_dim)
            v = dense(kv_heads * head_dim, "v")(h).reshape(b, t, kv_heads, head_dim)
            k, v = (jnp.repeat(z, heads // kv_heads, axis=2) for z in (k, v))  # grouped-query
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim ** 0.5
            causal = jnp.tril(jnp.ones((t, t), bool))
            weights = jax.nn.softmax(jnp.where(causal, scores, -1e9).astype(jnp.float32), axis=-1)
            attended = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(jnp.bfloat16), v).reshape(b, t, d)
            x = x + dense(d, "o")(attended)
            h = nn.RMSNorm(dtype=jnp.bfloat16)(x)
            return x + dense(d, "down")(jax.nn.silu(dense(hidden, "gate")(h)) * dense(hidden, "up")(h))

    class Llama(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, d, dtype=jnp.bfloat16)(tokens)
            for i in range(layers):
                x = Block(name=f"block{i}")(x)
            return dense(vocab, "head")(nn.RMSNorm(dtype=jnp.bfloat16)(x))

    return Llama()


def tuning_breakdown(decisions) -> dict:
    """Seconds of the warmup's tunings, summed over keys: all of each tuning, and its
    compiles of XLA dots less their waits for the device (XLA's GEMM autotuner runs in
    them with the device held alone: but for their lowering they never overlap, so their
    sum is close to a floor of the warmup)."""
    tuned = {d.key: d for d in decisions if d.source == "tuned"}.values()
    xla = [r for d in tuned for r in d.results if r.name.startswith(("xla_", "padded_xla_"))]
    return {"tuning_s_sum": sum(d.tuning_seconds or 0.0 for d in tuned),
            "xla_dot_compile_s_sum": sum((r.compile_seconds or 0.0) - (r.compile_wait_seconds or 0.0)
                                         for r in xla)}


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


def run_variant(args) -> dict:
    import jax
    import jax.numpy as jnp

    import jax_autotune as jat

    sizes = MODELS[args.model]
    model, loss, optimizer, step = build(args.model, args.variant, sizes)
    tokens = jax.random.randint(jax.random.key(0), (sizes["batch"], sizes["seq"]), 0, sizes["vocab"])
    batch = (tokens, jnp.roll(tokens, -1, axis=1))
    params = model.init(jax.random.key(1), tokens)
    opt_state = optimizer.init(params)
    row = {"model": args.model, "variant": args.variant}
    if args.variant != "plain":
        from jax_autotune.tuning.tuner import record_decisions
        primes = timed_priming()
        start = time.perf_counter()
        with record_decisions() as decided:
            report = jat.warmup(loss, params, batch, grad=True)
        row["warmup_s"] = time.perf_counter() - start
        row["xla_primes"] = [p for p in primes if p["primed"]]
        row["keys"] = len(report)
        row["winners"] = sorted({e.winner for e in report})
        row.update(tuning_breakdown(decided))
    before = jat.stats()
    start = time.perf_counter()
    params, opt_state, value = step(params, opt_state, batch)
    jax.block_until_ready(value)
    row["first_step_s"] = time.perf_counter() - start
    row["tuned_in_first_step"] = jat.stats()["tuned"] - before["tuned"]
    losses, times = [float(value)], []
    for _ in range(args.steps):
        start = time.perf_counter()
        params, opt_state, value = step(params, opt_state, batch)
        jax.block_until_ready(value)
        times.append(time.perf_counter() - start)
        losses.append(float(value))
    row.update(step_ms=statistics.median(times) * 1e3, losses=losses[:4])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--models", default="gpt2,llama", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=tempfile.mkdtemp(prefix=f"model_step_{model}_{variant}_"))
            child = ["--model", model, "--variant", variant, f"--steps={args.steps}"]
            try:
                rows.append(child_result(__file__, child, env, args.timeout_s))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as err:
                rows.append({"model": model, "variant": variant, "error": f"{type(err).__name__}: {err}"[-2000:]})
            print(json.dumps(rows[-1]), flush=True)
    import jax
    command = "python benchmarks/model_step.py " + " ".join(sys.argv[1:])
    text = report(rows, command, jax.__version__, jax.devices()[0].device_kind)
    print(text)
    write_results(args.out, f"model_step_{datetime.date.today().isoformat()}", text,
                  {"rows": rows, "command": command})


def report(rows, command, jax_version, device) -> str:
    lines = [f"# Model steps on {device}, {datetime.date.today().isoformat()}", "",
             f"jax {jax_version}; command: `{command}`", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += model_table(model, [r for r in rows if r["model"] == model])
    return "\n".join(lines) + "\n"


def model_table(model: str, rows: list[dict]) -> list[str]:
    sizes = ", ".join(f"{k} {v}" for k, v in MODELS[model].items())
    plain = next((r for r in rows if r["variant"] == "plain" and "step_ms" in r), None)
    lines = [f"## {model} ({sizes}; bf16 compute, AdamW)", "",
             "| variant | warmup s (XLA dot compiles, summed; XLA dots primed together) | keys | first step s | tuned in first step | step ms "
             "| plain / variant | first losses |",
             "|---|---|---|---|---|---|---|---|"]
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
                     f"{r['tuned_in_first_step']} | {r['step_ms']:.2f} | {ratio} | "
                     f"{', '.join(f'{x:.4f}' for x in r['losses'])} |")
    return lines + [""]


if __name__ == "__main__":
    main()
