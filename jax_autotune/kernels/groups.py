"""Where the groups of a grouped matmul (``lax.ragged_dot``) lie in its ragged rows.

    >>> starts, ends = group_bounds(jnp.array([3, 0, 4]), rows=5)
    >>> starts.tolist(), ends.tolist()
    ([0, 3, 3], [3, 3, 5])
"""

from __future__ import annotations

import jax.numpy as jnp


def group_bounds(group_sizes, rows: int):
    """(starts, ends) of the groups over ``rows`` rows, clipped to them, as lax counts them."""
    ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), rows)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    return starts, ends


__all__ = ["group_bounds"]
