"""The key of a softmax attention: which attentions share one decision (fused or as written).

``jat.autotune`` finds softmax attention in a traced program (``jax_autotune.attention``):
two matmuls around a softmax, ``softmax(scale * q . k + mask) . v``. Whether it runs as
written or fused (``jax.nn.dot_product_attention``) is decided once per key and kept with
the matmul decisions. The key holds the sizes, exact (an attention's shapes are few per
model, and a fused kernel's speed depends on each), the dtype and the mask; the scale is
a value the fused kernel takes at run time, not part of the key, as an epilogue's
constants are not.

    >>> key = AttentionKey(batch=8, heads=12, t=1024, s=1024, head_dim=64, dtype="bfloat16", causal=True)
    >>> key.canonical()
    'attention:batch=8,heads=12,t=1024,s=1024,head_dim=64,dtype=bfloat16,causal=true'
    >>> AttentionKey.parse(key.canonical()) == key
    True
    >>> AttentionKey(8, 32, 1024, 1024, 128, "bfloat16", True, kv_heads=8).describe()
    'attention 8x32x1024x1024x128 bfloat16 causal kv_heads=8'
"""

from __future__ import annotations

import dataclasses

import ml_dtypes  # noqa: F401 - names bfloat16 and the float8s for NumPy
import numpy as np

PREFIX = "attention:"
SIZES = ("batch", "heads", "t", "s", "head_dim", "kv_heads")


@dataclasses.dataclass(frozen=True)
class AttentionKey:
    """q (batch, t, heads, head_dim) attending over k, v (batch, s, kv_heads, head_dim) in
    ``dtype``, under the lower-triangular mask (``causal``) or none; query head i reads
    kv head ``i // (heads // kv_heads)`` (None: as many kv heads as heads)."""

    batch: int
    heads: int
    t: int
    s: int
    head_dim: int
    dtype: str
    causal: bool
    kv_heads: int | None = None

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in SIZES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AttentionKey: {name} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"AttentionKey: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The query's (batch, t, heads, head_dim)."""
        return self.batch, self.t, self.heads, self.head_dim

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        """The keys' and values' (batch, s, kv_heads, head_dim)."""
        return self.batch, self.s, self.kv_heads, self.head_dim

    def canonical(self) -> str:
        """One line; ``AttentionKey.parse`` inverts it (``kv_heads`` only where fewer than
        ``heads``)."""
        fields = [f"{f.name}={str(getattr(self, f.name)).lower()}" for f in dataclasses.fields(self)
                  if f.name != "kv_heads" or self.kv_heads != self.heads]
        return PREFIX + ",".join(fields)

    __str__ = canonical

    def describe(self) -> str:
        """For people: ``8x12x1024x1024x64 bfloat16 causal`` (batch, heads, t, s, head_dim)."""
        sizes = "x".join(str(v) for v in (self.batch, self.heads, self.t, self.s, self.head_dim))
        grouped = f" kv_heads={self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"attention {sizes} {self.dtype}{' causal' if self.causal else ''}{grouped}"

    @classmethod
    def parse(cls, text: str) -> "AttentionKey":
        """Inverse of ``canonical()``; anything else is a ValueError naming what is wrong."""
        if not isinstance(text, str) or not text.startswith(PREFIX):
            raise ValueError(f"AttentionKey.parse: expected a string starting with {PREFIX!r}, got {text!r}")
        data = {}
        for part in text[len(PREFIX):].split(","):
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"AttentionKey.parse: expected name=value, got {part!r}")
            data[name] = value
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(set(data) | {"kv_heads"}) != sorted(names):
            raise ValueError(f"AttentionKey.parse: expected the fields {names} (kv_heads optional), "
                             f"got {sorted(data)}")
        if data["causal"] not in ("true", "false"):
            raise ValueError(f"AttentionKey.parse: causal must be true or false, got {data['causal']!r}")
        try:
            sizes = {n: int(data[n]) for n in SIZES if n in data}
        except ValueError as err:
            raise ValueError(f"AttentionKey.parse: a size is not an int in {text!r}") from err
        return cls(**sizes, dtype=data["dtype"], causal=data["causal"] == "true")


def is_attention_key(text: str) -> bool:
    """Whether a stored key string is an attention key's."""
    return isinstance(text, str) and text.startswith(PREFIX)


__all__ = ["AttentionKey", "is_attention_key", "PREFIX"]
