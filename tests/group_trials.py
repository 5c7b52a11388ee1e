"""Group sizes for the tests of grouped kernels: random ones for their tables, and named
splits for their numbers.

    >>> for rows, groups, tile, sizes in group_trials(): ...
    >>> split_sizes(1000, 4, "below")          # the last two groups empty: a sum below the rows
"""

import numpy as np

from jax_autotune.splits import representative_splits


def split_sizes(rows: int, groups: int, split: str):
    """Sizes of ``groups`` groups over ``rows`` rows: the tuner's ``equal`` or ``skewed``
    split, ``below`` (equal, the last two groups empty) or ``above`` (equal, three times
    over: clipped to the rows as lax does)."""
    if split in ("equal", "skewed"):
        return representative_splits(rows, groups)[0 if split == "equal" else 1]
    sizes = representative_splits(rows, groups)[0] * (3 if split == "above" else 1)
    if split == "below":
        sizes[-2:] = 0
    return sizes


def group_trials(trials: int = 200, seed: int = 0):
    """(rows, groups, tile, sizes) per trial: 1-699 rows, 1-8 groups, a tile of 64 or 128,
    sizes summing below and above the rows, empty groups among them."""
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        rows, groups, tile = int(rng.integers(1, 700)), int(rng.integers(1, 9)), int(rng.choice([64, 128]))
        yield rows, groups, tile, rng.integers(0, 2 * rows // groups + 2, groups)
