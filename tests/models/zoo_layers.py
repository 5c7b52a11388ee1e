"""Plain-JAX building blocks the suite's models share, written as users write them: dict
parameters, ``@`` and ``jnp.einsum`` for the matmuls, norms and softmax in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from harness import normal


class Init:
    """Draws parameters from one generator, scaled by fan-in so activations stay near 1."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def dense(self, fan_in, *shape):
        """A weight of ``shape`` whose products sum ``fan_in`` terms."""
        return normal(self.rng, *shape, scale=fan_in ** -0.5)

    def weight(self, *shape, scale=1.0):
        return normal(self.rng, *shape, scale=scale)

    def near_one(self, *shape):  # norm scales: near 1, never exactly 1
        return 1.0 + normal(self.rng, *shape, scale=0.1)

    def like(self, shapes):
        """Values for a tree of ``jax.ShapeDtypeStruct`` (a flax model's ``jax.eval_shape``
        of its init), by each leaf's name: kernels scaled by their fan-in, norm scales near 1,
        biases and the rest small. Drawn here rather than by flax's initializers, whose
        sampling programs take longer to compile than the models' training steps."""
        def value(path, leaf):
            name, shape = str(getattr(path[-1], "key", path[-1])), leaf.shape
            if name == "kernel":
                return self.dense(int(np.prod(shape[:-1])), *shape)
            return self.near_one(*shape) if name == "scale" else self.weight(*shape, scale=0.1)
        return jax.tree_util.tree_map_with_path(value, shapes)

    def initializer(self, key, shape, dtype=jnp.float32):
        """A flax ``kernel_init`` that draws from this generator (and ignores ``key``)."""
        del key
        return self.dense(int(np.prod(shape[:-1])), *shape).astype(dtype)


def layer_norm(x, p, eps=1e-5):
    y = x.astype(jnp.float32)
    y = (y - y.mean(-1, keepdims=True)) * jax.lax.rsqrt(y.var(-1, keepdims=True) + eps)
    return (y * p["scale"] + p["bias"]).astype(x.dtype)


def layer_norm_params(init: Init, d):
    return {"scale": init.near_one(d), "bias": init.weight(d, scale=0.1)}


def rms_norm(x, scale, eps=1e-6):
    y = x.astype(jnp.float32)
    y = y * jax.lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + eps)
    return (y * scale).astype(x.dtype)


def gelu_mlp(x, p):
    return jax.nn.gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def gelu_mlp_params(init: Init, d, hidden):
    return {"w_in": init.dense(d, d, hidden), "b_in": init.weight(hidden, scale=0.1),
            "w_out": init.dense(hidden, hidden, d), "b_out": init.weight(d, scale=0.1)}


def swiglu(x, p):
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def swiglu_params(init: Init, d, hidden):
    return {"w_gate": init.dense(d, d, hidden), "w_up": init.dense(d, d, hidden),
            "w_down": init.dense(hidden, hidden, d)}


def rope(x, positions, base=10000.0):
    """Rotary position embedding of ``x`` [batch, seq, heads, head_dim] (rotate-half form)."""
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions[:, None].astype(jnp.float32) * freq  # [seq, half]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def attention(q, k, v, *, causal, softmax_f32=True):
    """q [b, t, heads, d], k and v [b, s, kv_heads, d]: each group of heads reads one key/value
    head (grouped-query attention; kv_heads == heads is plain multi-head attention)."""
    b, t, heads, d = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, t, kv_heads, heads // kv_heads, d)
    logits = jnp.einsum("btkgd,bskd->bkgts", q, k) * (d ** -0.5)
    if causal:
        mask = jnp.tril(jnp.ones((t, k.shape[1]), bool))
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    if softmax_f32:
        weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(v.dtype)
    else:
        weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", weights, v)
    return out.reshape(b, t, heads, d)


def mha(x, p, heads, *, causal, memory=None):
    """Multi-head attention with one fused qkv projection (GPT-2 style), or cross-attention
    to ``memory`` with a query projection and a fused key/value one."""
    b, t, dm = x.shape
    if memory is None:
        q, k, v = jnp.split(x @ p["w_qkv"] + p["b_qkv"], 3, axis=-1)
    else:
        q = x @ p["w_q"]
        k, v = jnp.split(memory @ p["w_kv"], 2, axis=-1)
    q, k, v = (a.reshape(b, a.shape[1], heads, dm // heads) for a in (q, k, v))
    out = attention(q, k, v, causal=causal, softmax_f32=False).reshape(b, t, dm)
    return out @ p["w_o"] + p["b_o"]


def mha_params(init: Init, d, *, cross=False):
    qkv = {"w_q": init.dense(d, d, d), "w_kv": init.dense(d, d, 2 * d)} if cross else {
        "w_qkv": init.dense(d, d, 3 * d), "b_qkv": init.weight(3 * d, scale=0.1)}
    return {**qkv, "w_o": init.dense(d, d, d), "b_o": init.weight(d, scale=0.1)}


def next_token_loss(logits, tokens):
    """Mean cross-entropy of predicting tokens[:, 1:] from logits[:, :-1], in float32."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
