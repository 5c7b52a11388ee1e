"""The suite's model programs in plain JAX with dict parameters, and the registry of every
program (the flax ones are in ``zoo_flax``). Each program is built by ``make(size)`` into
float32 parameters, a batch (int tokens, float inputs) and ``loss(params, batch)``."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from harness import Size, rng_for, tokens
from zoo_layers import (Init, attention, gelu_mlp, gelu_mlp_params, layer_norm, layer_norm_params,
                        mha, mha_params, next_token_loss, rms_norm, rope, swiglu, swiglu_params)


@dataclasses.dataclass(frozen=True)
class Built:
    params: Any  # float32
    batch: dict
    loss: Callable  # (params, batch) -> a scalar


# ------------------------------------------------------------------ GPT: tied head, gelu MLP


def make_gpt(size: Size, dropout: float = 0.0, key=None) -> Built:
    """With ``dropout``, the batch holds ``key`` and the residual branches drop activations."""
    rng = rng_for("gpt", size)
    init, d = Init(rng), size.d_model
    params = {"wte": init.weight(size.vocab, d, scale=0.5), "wpe": init.weight(size.seq, d, scale=0.1),
              "blocks": [{"ln1": layer_norm_params(init, d), "attn": mha_params(init, d),
                          "ln2": layer_norm_params(init, d), "mlp": gelu_mlp_params(init, d, 4 * d)}
                         for _ in range(size.layers)],
              "ln_f": layer_norm_params(init, d)}
    batch = {"tokens": tokens(rng, size.batch, size.seq, vocab=size.vocab)}
    if dropout:
        batch["key"] = key

    def drop(x, key):
        keep = jax.random.bernoulli(key, 1.0 - dropout, x.shape)
        return jnp.where(keep, x / (1.0 - dropout), 0).astype(x.dtype)

    def loss(params, batch):
        x = params["wte"][batch["tokens"]] + params["wpe"]
        keys = iter(jax.random.split(batch["key"], 2 * len(params["blocks"])) if dropout else [])
        branch = (lambda y: drop(y, next(keys))) if dropout else (lambda y: y)
        for block in params["blocks"]:
            x = x + branch(mha(layer_norm(x, block["ln1"]), block["attn"], size.heads, causal=True))
            x = x + branch(gelu_mlp(layer_norm(x, block["ln2"]), block["mlp"]))
        logits = layer_norm(x, params["ln_f"]) @ params["wte"].T  # the head is the embedding
        return next_token_loss(logits, batch["tokens"])
    return Built(params, batch, loss)


# -------------------------------------------------------- Llama: GQA, RoPE, SwiGLU, RMSNorm


def make_llama(size: Size) -> Built:
    rng = rng_for("llama", size)
    init, d, h, kv = Init(rng), size.d_model, size.heads, size.kv_heads
    hd = d // h
    params = {"embed": init.weight(size.vocab, d),
              "layers": [{"attn_norm": init.near_one(d), "wq": init.dense(d, d, h, hd),
                          "wk": init.dense(d, d, kv, hd), "wv": init.dense(d, d, kv, hd),
                          "wo": init.dense(d, h, hd, d), "mlp_norm": init.near_one(d),
                          "mlp": swiglu_params(init, d, 3 * d)} for _ in range(size.layers)],
              "norm": init.near_one(d), "lm_head": init.dense(d, d, size.vocab)}
    batch = {"tokens": tokens(rng, size.batch, size.seq, vocab=size.vocab)}

    def loss(params, batch):
        x = params["embed"][batch["tokens"]]
        positions = jnp.arange(x.shape[1])
        for layer in params["layers"]:
            y = rms_norm(x, layer["attn_norm"])
            q = rope(jnp.einsum("btd,dhk->bthk", y, layer["wq"]), positions)
            k = rope(jnp.einsum("btd,dhk->bthk", y, layer["wk"]), positions)
            v = jnp.einsum("btd,dhk->bthk", y, layer["wv"])
            x = x + jnp.einsum("bthk,hkd->btd", attention(q, k, v, causal=True), layer["wo"])
            x = x + swiglu(rms_norm(x, layer["mlp_norm"]), layer["mlp"])
        return next_token_loss(rms_norm(x, params["norm"]) @ params["lm_head"], batch["tokens"])
    return Built(params, batch, loss)


# ------------------------------------ cross-attention: a decoder block reading an encoder's output


def make_cross_attention(size: Size) -> Built:
    rng = rng_for("cross_attention", size)
    init, d = Init(rng), size.d_model
    params = {"embed": init.weight(size.vocab, d),
              "ln_self": layer_norm_params(init, d), "self": mha_params(init, d),
              "ln_cross": layer_norm_params(init, d), "cross": mha_params(init, d, cross=True),
              "ln_mlp": layer_norm_params(init, d), "mlp": gelu_mlp_params(init, d, 2 * d),
              "head": init.dense(d, d, size.vocab)}
    batch = {"tokens": tokens(rng, size.batch, size.seq, vocab=size.vocab),
             "memory": init.weight(size.batch, size.memory, d)}

    def loss(params, batch):
        x = params["embed"][batch["tokens"]]
        x = x + mha(layer_norm(x, params["ln_self"]), params["self"], size.heads, causal=True)
        x = x + mha(layer_norm(x, params["ln_cross"]), params["cross"], size.heads, causal=False,
                    memory=batch["memory"])
        x = x + gelu_mlp(layer_norm(x, params["ln_mlp"]), params["mlp"])
        return next_token_loss(x @ params["head"], batch["tokens"])
    return Built(params, batch, loss)


# ------------------------------------ MoE: top-k router, one-hot dispatch and combine by einsum


def moe_layer(x, p, top_k, capacity):
    """Switch/GShard-style mixture of experts over tokens x [n, d]: the router runs in float32
    (a tie broken the other way would change which expert a token reaches)."""
    n, experts = x.shape[0], p["router"].shape[1]
    probs = jax.nn.softmax(x.astype(jnp.float32) @ p["router"].astype(jnp.float32), axis=-1)
    gates, chosen = jax.lax.top_k(probs, top_k)  # [n, k]
    gates = gates / gates.sum(-1, keepdims=True)
    mask = jax.nn.one_hot(chosen, experts, dtype=jnp.int32)  # [n, k, e]
    # the slot of each (token, choice) in its expert's buffer: earlier choices first
    slot = jnp.cumsum(mask.transpose(1, 0, 2).reshape(top_k * n, experts), axis=0)
    slot = (slot.reshape(top_k, n, experts).transpose(1, 0, 2) - 1) * mask
    keep = mask * (slot < capacity)
    dispatch = jax.nn.one_hot(slot, capacity, dtype=x.dtype) * keep[..., None].astype(x.dtype)
    combine = (dispatch * gates[..., None, None].astype(x.dtype)).sum(1)  # [n, e, c]
    dispatch = dispatch.sum(1)
    expert_in = jnp.einsum("nec,nd->ecd", dispatch, x)
    hidden = jax.nn.gelu(jnp.einsum("ecd,edh->ech", expert_in, p["w_in"]))
    expert_out = jnp.einsum("ech,ehd->ecd", hidden, p["w_out"])
    balance = experts * jnp.sum(mask.sum(1).mean(0) * probs.mean(0)) / top_k
    return jnp.einsum("nec,ecd->nd", combine, expert_out), balance


def make_moe(size: Size) -> Built:
    rng = rng_for("moe", size)
    init, d, e = Init(rng), size.d_model, size.experts
    top_k, tokens_per_batch = 2, size.batch * size.seq
    capacity = max(1, int(1.25 * top_k * tokens_per_batch / e))
    params = {"embed": init.weight(size.vocab, d), "norm": init.near_one(d),
              "moe": {"router": init.dense(d, d, e), "w_in": init.dense(d, e, d, 2 * d),
                      "w_out": init.dense(2 * d, e, 2 * d, d)},
              "head": init.dense(d, d, size.vocab)}
    batch = {"tokens": tokens(rng, size.batch, size.seq, vocab=size.vocab)}

    def loss(params, batch):
        x = params["embed"][batch["tokens"]]
        tokens_in = rms_norm(x, params["norm"]).reshape(-1, d)
        y, balance = moe_layer(tokens_in, params["moe"], top_k, capacity)
        x = x + y.reshape(x.shape)
        return next_token_loss(x @ params["head"], batch["tokens"]) + 0.01 * balance
    return Built(params, batch, loss)


# ----------------------------------- layers stacked and scanned, each block under jax.checkpoint


def make_scan_remat(size: Size, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                    inner=lambda block: block) -> Built:
    """``inner`` wraps the block inside ``jax.checkpoint`` (``jat.autotune``: tuned per block)."""
    rng = rng_for("scan_remat", size)
    init, d, layers = Init(rng), size.d_model, max(size.layers, 2)
    blocks = [{"ln1": layer_norm_params(init, d), "attn": mha_params(init, d),
               "ln2": layer_norm_params(init, d), "mlp": gelu_mlp_params(init, d, 4 * d)}
              for _ in range(layers)]
    params = {"embed": init.weight(size.vocab, d, scale=0.5),
              "blocks": jax.tree.map(lambda *xs: jnp.stack(xs), *blocks),  # [layers, ...]
              "ln_f": layer_norm_params(init, d)}
    batch = {"tokens": tokens(rng, size.batch, size.seq, vocab=size.vocab)}

    def block(x, p):
        x = x + mha(layer_norm(x, p["ln1"]), p["attn"], size.heads, causal=True)
        return x + gelu_mlp(layer_norm(x, p["ln2"]), p["mlp"]), None

    remat_block = jax.checkpoint(inner(block), policy=policy, prevent_cse=False)

    def loss(params, batch):
        x, _ = jax.lax.scan(remat_block, params["embed"][batch["tokens"]], params["blocks"])
        logits = layer_norm(x, params["ln_f"]) @ params["embed"].T
        return next_token_loss(logits, batch["tokens"])
    return Built(params, batch, loss)


def programs() -> dict[str, Callable[[Size], Built]]:
    """Every program of the suite, by name."""
    from zoo_flax import make_linen_mixer, make_linen_vit  # a module of its own; it imports this one

    return {"gpt": make_gpt, "llama": make_llama, "vit": make_linen_vit,
            "mixer": make_linen_mixer, "cross_attention": make_cross_attention,
            "moe": make_moe, "scan_remat": make_scan_remat}
