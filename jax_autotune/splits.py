"""The representative group-size splits a grouped matmul (``lax.ragged_dot``) is tuned on.

A grouped matmul's group sizes are runtime values, so its key holds only the number of
groups; a decision must be right for every split. Candidates are checked and timed on
``SPLITS`` splits at once, each a (groups,) vector of sizes over ``rows`` ragged rows:

* ``equal``: every row in a group, the sizes within one of each other (sum == rows);
* ``skewed``: half the rows in group 0, group 1 empty (when there are 3 or more groups),
  the rest spread over the others, and an eighth of the rows (at least one, when rows > 1)
  in no group, so the rows lax leaves zero are checked too.

    >>> representative_splits(10, 3).tolist()
    [[4, 3, 3], [4, 0, 5]]
"""

from __future__ import annotations

import numpy as np

SPLITS = 2  # equal, skewed


def equal_split(rows: int, groups: int) -> np.ndarray:
    """``rows`` spread over ``groups``, the first ``rows % groups`` groups one larger."""
    sizes = np.full(groups, rows // groups, np.int64)
    sizes[:rows % groups] += 1
    return sizes


def skewed_split(rows: int, groups: int) -> np.ndarray:
    """Half the rows in group 0, group 1 empty (3 groups or more), an eighth of the rows
    in no group, the rest spread over the other groups."""
    left_out = max(rows // 8, 1 if rows > 1 else 0)
    first = (rows - left_out) // 2 if groups > 1 else rows - left_out
    sizes = np.zeros(groups, np.int64)
    sizes[0] = first
    rest = range(2 if groups > 2 else 1, groups)
    if len(rest):
        sizes[list(rest)] = equal_split(rows - left_out - first, len(rest))
    return sizes


def representative_splits(rows: int, groups: int) -> np.ndarray:
    """(SPLITS, groups) int32: the equal split, then the skewed one."""
    return np.stack([equal_split(rows, groups), skewed_split(rows, groups)]).astype(np.int32)


__all__ = ["SPLITS", "equal_split", "skewed_split", "representative_splits"]
