"""The suite's flax programs: a ViT and an MLP-Mixer in linen, and an nnx classifier with
BatchNorm and Dropout, each written with flax's own layers, as a flax user writes them."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from harness import Size, normal, rng_for
from zoo import Built
from zoo_layers import Init

# ------------------------------------------- ViT: patches by a strided conv, plus a class token


class EncoderBlock(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(nn.LayerNorm()(x))
        y = nn.Dense(2 * x.shape[-1])(nn.LayerNorm()(x))
        return x + nn.Dense(x.shape[-1])(nn.gelu(y))


class ViT(nn.Module):
    size: Size

    @nn.compact
    def __call__(self, images):
        s = self.size
        x = nn.Conv(s.d_model, (s.patch, s.patch), strides=(s.patch, s.patch))(images)
        x = x.reshape(x.shape[0], -1, s.d_model)  # [batch, patches, d]
        cls = self.param("cls", nn.initializers.normal(1.0), (1, 1, s.d_model), x.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, s.d_model)), x], axis=1)
        x = x + self.param("pos", nn.initializers.normal(0.1), x.shape[1:], x.dtype)
        for _ in range(s.layers):
            x = EncoderBlock(s.heads)(x)
        return nn.Dense(10)(nn.LayerNorm()(x)[:, 0])  # classify from the class token


def make_linen_vit(size: Size) -> Built:
    rng = rng_for("vit", size)
    model = ViT(size)
    batch = {"images": normal(rng, size.batch, size.image, size.image, 3),
             "labels": jnp.asarray(rng.integers(0, 10, size.batch), jnp.int32)}
    params = Init(rng).like(jax.eval_shape(model.init, jax.random.key(1), batch["images"]))

    def loss(params, batch):
        logits = model.apply(params, batch["images"]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return Built(params, batch, loss)


# ---------------------------------------------- MLP-Mixer: token mixing and channel mixing MLPs


class MlpBlock(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.hidden)(x)))


class Mixer(nn.Module):
    size: Size

    @nn.compact
    def __call__(self, patches):  # [batch, tokens, channels in]
        x = nn.Dense(self.size.d_model)(patches)
        for _ in range(self.size.layers):
            y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)
            x = x + jnp.swapaxes(MlpBlock(2 * x.shape[1])(y), 1, 2)  # mixes tokens
            x = x + MlpBlock(2 * self.size.d_model)(nn.LayerNorm()(x))  # mixes channels
        return nn.Dense(10)(nn.LayerNorm()(x).mean(axis=1))


def make_linen_mixer(size: Size) -> Built:
    rng = rng_for("mixer", size)
    model = Mixer(size)
    n_patches = (size.image // size.patch) ** 2
    batch = {"patches": normal(rng, size.batch, n_patches + 1, 3 * size.patch ** 2),
             "labels": jnp.asarray(rng.integers(0, 10, size.batch), jnp.int32)}
    params = Init(rng).like(jax.eval_shape(model.init, jax.random.key(2), batch["patches"]))

    def loss(params, batch):  # in the compute dtype: optax's loss keeps the logits' dtype
        logits = model.apply(params, batch["patches"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return Built(params, batch, loss)


# ------------------------------------------------- nnx: Linear, BatchNorm, Dropout with Rngs


class NnxClassifier(nnx.Module):
    def __init__(self, d_in, d, classes, *, dtype, param_dtype, kernel_init, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        kw_linear = dict(kw, kernel_init=kernel_init)
        self.inp = nnx.Linear(d_in, d, **kw_linear)
        self.bn1 = nnx.BatchNorm(d, **kw)
        self.drop1 = nnx.Dropout(0.25, rngs=rngs)
        self.hidden = nnx.Linear(d, d, **kw_linear)
        self.bn2 = nnx.BatchNorm(d, **kw)
        self.drop2 = nnx.Dropout(0.25, rngs=rngs)
        self.out = nnx.Linear(d, classes, **kw_linear)

    def __call__(self, x):
        x = self.drop1(nnx.relu(self.bn1(self.inp(x))))
        x = self.drop2(nnx.gelu(self.bn2(self.hidden(x))))
        return self.out(x)


def make_nnx_classifier(size: Size, mode) -> tuple[NnxClassifier, dict]:
    """A fresh model (the same weights and dropout stream on every call) and a batch. ``mode``
    gives the dtypes: f32 master weights with bf16 compute are flax's ``param_dtype`` and
    ``dtype``."""
    rng = rng_for("nnx", size)
    model = NnxClassifier(3 * size.patch ** 2, size.d_model, 10, dtype=mode.compute_dtype,
                          param_dtype=mode.param_dtype, kernel_init=Init(rng).initializer,
                          rngs=nnx.Rngs(params=3, dropout=4))
    batch = {"x": normal(rng, size.batch * size.seq, 3 * size.patch ** 2).astype(mode.compute_dtype),
             "labels": jnp.asarray(rng.integers(0, 10, size.batch * size.seq), jnp.int32)}
    return model, batch


def nnx_loss(model, batch):
    logits = model(batch["x"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
