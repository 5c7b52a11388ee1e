"""``jax-autotune keys``: print tune keys the way the reference page does.

    $ jax-autotune keys 512 768 1000 1024 1025 2048 1024T
     768  -> m=1024 n=1024 k=1024 lhs_pow2=4 lhs_stride=10 rhs_pow2=4 rhs_stride=10 ...
    key(768) == key(1024): true

A shape is ``S`` (an S x S x S square), ``MxNxK``, or ``BxMxNxK``; a trailing ``T`` means
the rhs is stored transposed (n, k).
"""

from __future__ import annotations

import jax

from jax_autotune.api import key_for
from jax_autotune.cli.parser import parse_shape
from jax_autotune.key import MatmulKey


def operand_shapes(text: str) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(lhs shape, rhs shape as stored, transpose_b) of a shape argument.

        >>> operand_shapes("4x8x16x32T")
        ((4, 8, 32), (4, 16, 32), True)
    """
    batch, m, n, k, transpose_b = parse_shape(text)
    lead = (batch,) if batch > 1 else ()
    return (*lead, m, k), ((*lead, n, k) if transpose_b else (*lead, k, n)), transpose_b


def key_of(text: str, dtype: str, level: str | None) -> MatmulKey:
    lhs_shape, rhs_shape, transpose_b = operand_shapes(text)
    lhs, rhs = (jax.ShapeDtypeStruct(shape, dtype) for shape in (lhs_shape, rhs_shape))
    return key_for(lhs, rhs, transpose_b=transpose_b, level=level)


def describe(key: MatmulKey) -> str:
    """The reference's one-line summary of a key."""
    batch = f" batch={key.batch}" if key.batch > 1 else ""
    return (f"m={key.m} n={key.n} k={key.k}{batch} lhs_pow2={key.lhs_pow2_factor} "
            f"lhs_stride={key.lhs_stride_factor} rhs_pow2={key.rhs_pow2_factor} "
            f"rhs_stride={key.rhs_stride_factor} layout_rhs={key.rhs_layout} "
            f"scale={key.scale.value} kind={key.kind.value}")


def key_table(shapes: list[str], dtype: str = "float32", level: str | None = None,
              all_fields: bool = False) -> list[str]:
    """The lines ``jax-autotune keys`` prints."""
    keys = {text: key_of(text, dtype, level) for text in shapes}
    lines = [f"{text:>4}".ljust(5) + " -> " + (key.canonical() if all_fields else describe(key))
             for text, key in keys.items()]
    # compare each unaligned square with the listed square of its bucket (768 vs 1024)
    for text, key in keys.items():
        bucket = str(key.m)
        if text.isdigit() and bucket != text and bucket in keys and key.m == key.n == key.k:
            same = str(key == keys[bucket]).lower()
            lines.append(f"key({text}) == key({bucket}): {same}")
    return lines


def run(args) -> int:
    for line in key_table(args.shapes, args.dtype, args.level, args.all_fields):
        print(line)
    return 0

