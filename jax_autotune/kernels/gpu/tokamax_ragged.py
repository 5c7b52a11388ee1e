"""tokamax's grouped matmuls (``tokamax.ragged_dot_general``), where tokamax is installed.

tokamax (Google's Pallas kernel library; an optional extra, ``pip install tokamax``, never
required) picks among its implementations by a fixed priority list; as our candidates
each implementation competes on its own, checked and timed like every other. The module
never imports tokamax until a candidate lowers (``INSTALLED`` only looks for it), so the
package imports as fast with tokamax as without.

    >>> INSTALLED                         # whether ``import tokamax`` can find it
    >>> one = tokamax_one("triton")       # (lhs, rhs, group_sizes, dimension_numbers, options)
    >>> out = one(lhs, rhs, sizes, lax.RaggedDotDimensionNumbers(...), {"precision": None,
    ...           "preferred_element_type": jnp.bfloat16})
"""

from __future__ import annotations

import importlib.util

from jax_autotune.kernels.gpu import triton_backend

INSTALLED = importlib.util.find_spec("tokamax") is not None
# tokamax's names; "triton" lowers through Pallas's Triton backend, so only where it ships
IMPLEMENTATIONS = ("mosaic", "triton")


def implementation_available(implementation: str) -> bool:
    """tokamax installed, and for "triton" Pallas's Triton backend shipped by this jax."""
    return INSTALLED and (implementation != "triton" or triton_backend.SHIPPED)


def import_tokamax():
    """``import tokamax``, absl's flags marked parsed first where the program never parsed them."""
    from absl import flags  # tokamax depends on absl
    # tokamax reads its options as absl flags and, where the program never parsed any,
    # parses sys.argv, which fails on any flag of the user's own program: mark them parsed
    # (their defaults) first
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    import tokamax
    return tokamax


def tokamax_one(implementation: str):
    """``one(lhs, rhs, group_sizes, dimension_numbers, options)``: tokamax's
    ``ragged_dot_general`` with ``implementation`` alone (it raises where that one cannot
    run the problem; tokamax does not fall back to another)."""
    def one(lhs, rhs, group_sizes, dimension_numbers, options):
        tokamax = import_tokamax()
        return tokamax.ragged_dot_general(lhs, rhs, group_sizes, dimension_numbers,
                                          implementation=implementation, **options)
    return one


__all__ = ["INSTALLED", "IMPLEMENTATIONS", "implementation_available", "import_tokamax", "tokamax_one"]
