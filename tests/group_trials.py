"""Random group sizes for the tests of a grouped kernel's tables.

    >>> for rows, groups, tile, sizes in group_trials(): ...
"""

import numpy as np


def group_trials(trials: int = 200, seed: int = 0):
    """(rows, groups, tile, sizes) per trial: 1-699 rows, 1-8 groups, a tile of 64 or 128,
    sizes summing below and above the rows, empty groups among them."""
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        rows, groups, tile = int(rng.integers(1, 700)), int(rng.integers(1, 9)), int(rng.choice([64, 128]))
        yield rows, groups, tile, rng.integers(0, 2 * rows // groups + 2, groups)
