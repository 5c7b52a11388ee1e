"""Text tables for people: cells padded into columns, cut to fit a width.

    >>> rows = [("id", "key", "time"), ("ea73dc00d5", "256x512x512 bfloat16 NN DEFAULT", "11.0ms")]
    >>> aligned(rows, right={2})
    ['id          key                                time', 'ea73dc00d5  256x512x512 bfloat16 NN DEFAULT  11.0ms']
    >>> aligned(fitted(rows, width=40, cut=((1, 12),)), right={2})[1]
    'ea73dc00d5  256x512x512 bfloat1…  11.0ms'
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

GAP = "  "
LINE_WIDTH = 100  # characters of a line a person reads in a terminal, by default
CUT_MARK = "…"  # the last character of a cut cell


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def aligned(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """Rows of cells as lines, each column padded to its widest cell (the columns in
    ``right`` aligned right, as numbers are), trailing blanks dropped."""
    if not rows:
        return []
    widths = _widths(rows)
    return [GAP.join(cell.rjust(w) if i in right else cell.ljust(w)
                     for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def fitted(rows: Sequence[Sequence[str]], width: int,
           cut: Sequence[tuple[int, int]]) -> list[tuple[str, ...]]:
    """``rows`` with cells shortened (ending in ``CUT_MARK``) until ``aligned`` lines fit
    ``width`` characters: ``cut`` holds (column, narrowest width) pairs, each column cut
    in turn down to its narrowest before the next; where that is not enough, as narrow as
    they allow."""
    if not rows:
        return []
    widths = _widths(rows)
    excess = sum(widths) + len(GAP) * (len(widths) - 1) - width
    for column, narrowest in cut:
        take = min(max(excess, 0), max(0, widths[column] - narrowest))
        widths[column] -= take
        excess -= take

    def cell(text: str, limit: int) -> str:
        return text if len(text) <= limit else text[:limit - len(CUT_MARK)] + CUT_MARK
    return [tuple(cell(text, w) for text, w in zip(row, widths)) for row in rows]


__all__ = ["aligned", "fitted", "CUT_MARK", "LINE_WIDTH"]
