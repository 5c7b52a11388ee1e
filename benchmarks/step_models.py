"""The models that ``benchmarks/model_step.py`` times, each as a ``Case`` ready to run.

    >>> case = make_case("vit", "autotune", model_step.MODELS["vit"], "bfloat16")
    >>> case.warmup()                     # jat.warmup(case.fn, *case.args, grad=..., donate_argnums=...)
    >>> state, value = case.step(case.state, case.inputs)

Training steps (softmax cross-entropy, AdamW) of ``gpt2``, ``llama``, ``vit`` and ``moe`` (the
Llama decoder with top-2 mixture-of-experts feed-forwards, the experts as ``lax.ragged_dot``), and
``decode``: the Llama decoder's serving step, one new token a sequence over a KV cache,
forward only. All compute in bf16; every Dense takes ``dot`` as its ``dot_general``
(``jat.dot_general`` in the ``layers`` variant). Builders ignore the sizes they do not use.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jax_autotune as jat

BF16 = jnp.bfloat16


@dataclasses.dataclass
class Case:
    """One variant of one model: ``jat.warmup(fn, *args, grad=grad, donate_argnums=donate)``
    (``case.warmup()``), then ``state, value = step(state, inputs)`` again and again;
    ``value`` is the loss, or for ``decode`` the mean logsumexp of the new tokens' logits
    (finite iff the logits are). ``donate``: the positions of ``args`` the step donates.
    ``whole``: a training model's jitted step ``whole(params, opt_state, batch)`` (the
    optimizer in it), for ``case.warmup(whole=True)``; None where ``fn`` is the step already;
    ``whole_donate``: the positions of its arguments it donates.

        >>> state, loss = case.step(case.state, case.inputs)
    """

    fn: Callable
    args: tuple
    grad: bool
    step: Callable
    state: Any
    inputs: Any
    donate: tuple = ()
    whole: Callable | None = None
    whole_donate: tuple = ()

    def warmup(self, whole: bool = False, **options):
        """``jat.warmup`` of ``fn`` as ``step`` runs it, or with ``whole`` of the whole jitted
        training step (its check then times the optimizer too); ``options``: warmup's others."""
        if whole and self.whole is not None:
            return jat.warmup(self.whole, *self.state, self.inputs,  # (params, opt_state), batch
                              donate_argnums=self.whole_donate, **options)
        return jat.warmup(self.fn, *self.args, grad=self.grad, donate_argnums=self.donate, **options)


def make_case(model: str, variant: str, sizes: dict, param_dtype: str = "float32",
              donate_state: bool = False) -> Case:
    """The ``Case`` of ``model`` (gpt2, llama, vit, decode) in ``variant`` (plain, layers,
    autotune), its parameters initialized then cast to ``param_dtype``; ``donate_state``: a
    training step that donates its parameters and optimizer state, as flax's and MaxText's
    loops do (the decode step donates its cache either way).

        >>> make_case("gpt2", "layers", dict(layers=2, d=64, heads=4, vocab=1003, batch=2, seq=32))
    """
    if model == "decode":
        return decode_case(variant, sizes, param_dtype)
    module, loss, optimizer, step = train_parts(model, variant, sizes, donate_state)
    batch = example_batch(model, sizes)
    params = cast_params(module.init(jax.random.key(1), batch[0]), param_dtype)

    def train_step(state, batch):
        params, opt_state, value = step(*state, batch)
        return (params, opt_state), value

    return Case(loss, (params, batch), True, train_step, (params, optimizer.init(params)), batch, whole=step,
                whole_donate=(0, 1) if donate_state else ())


def train_parts(model: str, variant: str, sizes: dict, donate_state: bool = False):
    """(flax module, loss(params, batch), optax optimizer, jitted step(params, opt_state,
    batch) -> (params, opt_state, loss)) of a training model; the step donates params and
    opt_state where ``donate_state``.

        >>> module, loss, optimizer, step = train_parts("llama", "plain", sizes)
    """
    extra = {"ragged": layer_ragged_dot(variant)} if model == "moe" else {}
    module = BUILDERS[model](layer_dot(variant), **extra, **sizes, attention_by=attention_by(variant))

    def loss(params, batch):
        inputs, targets = batch
        logits = module.apply(params, inputs).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    if tuned_whole(variant):
        loss = jat.autotune(loss)
    optimizer = optax.adamw(3e-4)

    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return module, loss, optimizer, jax.jit(step, donate_argnums=(0, 1) if donate_state else ())


def decode_case(variant: str, sizes: dict, param_dtype: str) -> Case:
    """The Llama decoder's decode step: tokens (batch, 1) int32 at ``pos`` over a cache of
    per-layer (k, v), each (batch, cache, kv_heads, d // heads) bf16, filled with noise up
    to ``pos = cache // 2``. ``fn`` is the whole serving step, serve(params, cache, tokens,
    pos) -> ((cache, the greedy next tokens, pos + 1), mean logsumexp of the f32 logits), so
    that warmup's program check times what the step jits (the cache donated): the logits
    are reduced there, never written out.

        >>> case = decode_case("plain", dict(model_step.MODELS["decode"], batch=8), "float32")
    """
    module = llama(layer_dot(variant), **sizes)
    batch, length, layers = sizes["batch"], sizes["cache"], sizes["layers"]
    tokens = jax.random.randint(jax.random.key(0), (batch, 1), 0, sizes["vocab"])
    params = cast_params(module.init(jax.random.key(1), tokens), param_dtype)
    shape = (batch, length, sizes["kv_heads"], sizes["d"] // sizes["heads"])
    keys = iter(jax.random.split(jax.random.key(2), 2 * layers))
    cache = tuple((jax.random.normal(next(keys), shape, BF16), jax.random.normal(next(keys), shape, BF16))
                  for _ in range(layers))
    pos = jnp.asarray(length // 2, jnp.int32)

    def serve(params, cache, tokens, pos):
        logits, cache = module.apply(params, tokens, cache, pos)
        logits = logits[:, -1].astype(jnp.float32)
        chosen = jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]
        return (cache, chosen, pos + 1), jax.nn.logsumexp(logits, axis=-1).mean()

    if tuned_whole(variant):
        serve = jat.autotune(serve)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, params):
        return serve(params, *state)

    return Case(serve, (params, cache, tokens, pos), False, step, (cache, tokens, pos), params, donate=(1,))


def example_batch(model: str, sizes: dict) -> tuple:
    """(inputs, integer targets): tokens (batch, seq) and the same shifted by one, or for
    ``vit`` images (batch, image, image, 3) bf16 and labels (batch,) int32.

        >>> images, labels = example_batch("vit", model_step.MODELS["vit"])
    """
    if model == "vit":
        side = sizes["image"]
        images = jax.random.normal(jax.random.key(0), (sizes["batch"], side, side, 3), BF16)
        return images, jax.random.randint(jax.random.key(2), (sizes["batch"],), 0, sizes["classes"], jnp.int32)
    tokens = jax.random.randint(jax.random.key(0), (sizes["batch"], sizes["seq"]), 0, sizes["vocab"])
    return tokens, jnp.roll(tokens, -1, axis=1)


def cast_params(params, dtype: str):
    """``params`` with every floating leaf cast to ``dtype`` (bf16 master weights)."""
    return jax.tree.map(lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)


def layer_ragged_dot(variant: str) -> Callable:
    """The experts' grouped matmul: ``jat.ragged_dot`` for ``layers``, else lax's."""
    return jat.ragged_dot if variant == "layers" else jax.lax.ragged_dot


def layer_dot(variant: str) -> Callable:
    """The ``dot_general`` of every Dense: ``jat.dot_general`` for ``layers``, else lax's."""
    return jat.dot_general if variant == "layers" else jax.lax.dot_general


def attention_by(variant: str) -> str | None:
    """How ``variant``'s attention is written: None, as two einsums around a softmax;
    "cudnn", ``jax.nn.dot_product_attention`` with cuDNN's implementation on a GPU (the
    ``*fused_attention`` variants: what a JAX user writes for cuDNN's fused attention);
    "jax", ``jax.nn.dot_product_attention`` with no implementation named (the
    ``*jax_attention`` variants: JAX's XLA implementation, what flax nnx's attention runs)."""
    if variant.endswith("fused_attention"):
        return "cudnn"
    return "jax" if variant.endswith("jax_attention") else None


def tuned_whole(variant: str) -> bool:
    """Whether ``variant``'s loss goes through ``jat.autotune`` (``autotune*``)."""
    return variant.startswith("autotune")


def dense_layer(dot: Callable, bias: bool) -> Callable:
    """``dense(features, name)``: a bf16 ``nn.Dense`` through ``dot`` (inside a compact call)."""
    return lambda features, name: nn.Dense(features, use_bias=bias, dtype=BF16, dot_general=dot, name=name)


def attention(q, k, v, mask=None, by: str | None = None):
    """Softmax attention, (batch, t, heads * head_dim) bf16, of q (batch, t, heads,
    head_dim) over k, v (batch, s, kv_heads, head_dim): each key-value head serves
    heads // kv_heads query heads; ``mask`` (broadcast to (batch, heads, t, s)) keeps
    where true, ``"causal"`` is the lower triangle (t == s), None keeps all. ``by``
    (``attention_by``): "cudnn" or "jax", through ``jax.nn.dot_product_attention`` (cuDNN's
    implementation on a GPU, or JAX's default), where the mask is causal or none; else as
    written, two einsums around a softmax.

        >>> attention(q, k, v, "causal")
    """
    b, t, heads, head_dim = q.shape
    if by and (mask is None or isinstance(mask, str)):
        implementation = "cudnn" if by == "cudnn" and jax.default_backend() == "gpu" else None
        out = jax.nn.dot_product_attention(q, k, v, is_causal=mask is not None, implementation=implementation)
        return out.reshape(b, t, heads * head_dim)
    if k.shape[2] != heads:  # grouped-query
        k, v = (jnp.repeat(z, heads // k.shape[2], axis=2) for z in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim ** 0.5
    if isinstance(mask, str):
        mask = jnp.tril(jnp.ones((t, t), bool))
    if mask is not None:
        scores = jnp.where(mask, scores, -1e9)
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(BF16), v).reshape(b, t, heads * head_dim)


def pre_ln_block(dot: Callable, *, d: int, heads: int, hidden: int, causal: bool, attention_by: str | None = None):
    """The GPT-2 / ViT block class: LayerNorm, fused qkv, attention (causal or not), proj;
    LayerNorm, GELU MLP of ``hidden``; both residual."""
    dense = dense_layer(dot, bias=True)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            b, t, _ = x.shape
            h = nn.LayerNorm(dtype=BF16)(x)
            q, k, v = jnp.split(dense(3 * d, "qkv")(h).reshape(b, t, 3 * heads, d // heads), 3, axis=2)
            x = x + dense(d, "proj")(attention(q, k, v, "causal" if causal else None, attention_by))
            h = nn.LayerNorm(dtype=BF16)(x)
            return x + dense(d, "down")(nn.gelu(dense(hidden, "up")(h)))

    return Block


def gpt2(dot, *, layers: int, d: int, heads: int, vocab: int, seq: int, attention_by: str | None = None, **_):
    """GPT-2: token and learned position embeddings, causal blocks, an untied head;
    tokens (batch, seq) -> logits (batch, seq, vocab).

        >>> gpt2(jax.lax.dot_general, layers=12, d=768, heads=12, vocab=50257, seq=1024)
    """
    block = pre_ln_block(dot, d=d, heads=heads, hidden=4 * d, causal=True, attention_by=attention_by)
    dense = dense_layer(dot, bias=True)

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, d, dtype=BF16)(tokens)
            x = x + self.param("pos", nn.initializers.normal(0.02), (seq, d)).astype(BF16)
            for i in range(layers):
                x = block(name=f"block{i}")(x)
            return dense(vocab, "head")(nn.LayerNorm(dtype=BF16)(x))

    return GPT()


def vit(dot, *, layers: int, d: int, heads: int, mlp: int, image: int, patch: int, classes: int,
        attention_by: str | None = None, **_):
    """ViT: images (batch, image, image, 3) cut into (image // patch)**2 patches of
    patch * patch * 3, a Dense to d, a class token in front, learned positions,
    bidirectional blocks, a head on the class token -> logits (batch, classes).

        >>> vit(jax.lax.dot_general, layers=12, d=768, heads=12, mlp=3072, image=224, patch=16, classes=1000)
    """
    block = pre_ln_block(dot, d=d, heads=heads, hidden=mlp, causal=False, attention_by=attention_by)
    dense = dense_layer(dot, bias=True)
    grid = image // patch

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, images):
            b = images.shape[0]
            patches = images.reshape(b, grid, patch, grid, patch, 3).transpose(0, 1, 3, 2, 4, 5)
            x = dense(d, "patch")(patches.reshape(b, grid * grid, patch * patch * 3))
            cls = jnp.broadcast_to(self.param("cls", nn.initializers.zeros, (1, 1, d)).astype(BF16), (b, 1, d))
            x = jnp.concatenate([cls, x], axis=1)
            x = x + self.param("pos", nn.initializers.normal(0.02), (grid * grid + 1, d)).astype(BF16)
            for i in range(layers):
                x = block(name=f"block{i}")(x)
            return dense(classes, "head")(nn.LayerNorm(dtype=BF16)(x[:, 0]))

    return ViT()


def experts_ffn(ragged: Callable, x, router_logits, wg, wu, wd, top_k: int):
    """Top-``top_k`` mixture of SwiGLU experts of the tokens ``x`` (t, d): each token's rows
    sorted by expert, the experts' weights (experts, d, hidden) / (experts, hidden, d) applied
    by ``ragged`` (``lax.ragged_dot``'s signature), the outputs weighted by the router's
    softmax probabilities and summed back per token."""
    t, d = x.shape
    probs, chosen = jax.lax.top_k(jax.nn.softmax(router_logits.astype(jnp.float32)), top_k)
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat)
    rows = jnp.repeat(x, top_k, axis=0)[order]
    sizes = jnp.bincount(flat, length=wg.shape[0]).astype(jnp.int32)
    h = jax.nn.silu(ragged(rows, wg, sizes)) * ragged(rows, wu, sizes)
    out = jnp.zeros((t * top_k, d), h.dtype).at[order].set(ragged(h, wd, sizes))
    return (out.reshape(t, top_k, d) * probs[..., None].astype(out.dtype)).sum(axis=1)


def moe(dot, *, ragged=jax.lax.ragged_dot, experts: int, top_k: int, d: int, hidden: int, **sizes):
    """``llama`` with every feed-forward a top-``top_k`` mixture of ``experts`` SwiGLU experts
    (``experts_ffn``; the router a Dense through ``dot``).

        >>> moe(jax.lax.dot_general, layers=4, d=2048, heads=16, kv_heads=4, hidden=1408,
        ...     vocab=32003, experts=8, top_k=2)
    """
    dense = dense_layer(dot, bias=False)

    class Experts(nn.Module):
        @nn.compact
        def __call__(self, h):
            init = nn.initializers.lecun_normal(batch_axis=(0,))
            wg = self.param("gate", init, (experts, d, hidden)).astype(BF16)
            wu = self.param("up", init, (experts, d, hidden)).astype(BF16)
            wd = self.param("down", init, (experts, hidden, d)).astype(BF16)
            b, t, _ = h.shape
            x = h.reshape(b * t, d)
            return experts_ffn(ragged, x, dense(experts, "router")(x), wg, wu, wd, top_k).reshape(b, t, d)

    return llama(dot, d=d, hidden=hidden, ffn=Experts, **sizes)


def llama(dot, *, layers: int, d: int, heads: int, kv_heads: int, hidden: int, vocab: int, ffn=None,
          attention_by: str | None = None, **_):
    """Llama-style: RMSNorm, grouped-query attention, SwiGLU, no biases, an untied head.
    ``apply(params, tokens)`` -> logits (batch, t, vocab), causal over the tokens;
    ``apply(params, tokens, cache, pos)`` -> (logits, cache): each layer writes the tokens'
    k, v into its cache (k, v) at ``pos`` and attends over the cache up to them.

        >>> llama(jax.lax.dot_general, layers=8, d=2048, heads=16, kv_heads=4, hidden=5632, vocab=32003)
    """
    head_dim = d // heads
    dense = dense_layer(dot, bias=False)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, cache=None, pos=None):
            b, t, _ = x.shape
            h = nn.RMSNorm(dtype=BF16)(x)
            q = dense(heads * head_dim, "q")(h).reshape(b, t, heads, head_dim)
            k = dense(kv_heads * head_dim, "k")(h).reshape(b, t, kv_heads, head_dim)
            v = dense(kv_heads * head_dim, "v")(h).reshape(b, t, kv_heads, head_dim)
            mask = "causal"
            if cache is not None:
                k, v = (jax.lax.dynamic_update_slice(c, z.astype(c.dtype), (0, pos, 0, 0))
                        for c, z in zip(cache, (k, v)))
                mask = jnp.arange(k.shape[1])[None, :] <= pos + jnp.arange(t)[:, None]  # (t, s) causal
            x = x + dense(d, "o")(attention(q, k, v, mask, attention_by))
            h = nn.RMSNorm(dtype=BF16)(x)
            if ffn is not None:
                x = x + ffn(name="experts")(h)
            else:
                x = x + dense(d, "down")(jax.nn.silu(dense(hidden, "gate")(h)) * dense(hidden, "up")(h))
            return x if cache is None else (x, (k, v))

    class Llama(nn.Module):
        @nn.compact
        def __call__(self, tokens, cache=None, pos=None):
            x, written = nn.Embed(vocab, d, dtype=BF16)(tokens), []
            for i in range(layers):
                if cache is None:
                    x = Block(name=f"block{i}")(x)
                else:
                    x, kv = Block(name=f"block{i}")(x, cache[i], pos)
                    written.append(kv)
            logits = dense(vocab, "head")(nn.RMSNorm(dtype=BF16)(x))
            return logits if cache is None else (logits, tuple(written))

    return Llama()


BUILDERS = {"gpt2": gpt2, "llama": llama, "vit": vit, "moe": moe}  # the training models' builders
