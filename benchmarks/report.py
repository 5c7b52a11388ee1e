"""Shared by the benchmark scripts: geomeans and writing a run's table and data.

    >>> write_results("benchmarks/results", "cpu_suite_2026-11-29", markdown_text, rows)
"""

from __future__ import annotations

import json
import os
import statistics


def geomean(values) -> float:
    values = [v for v in values if v]
    return statistics.geometric_mean(values) if values else float("nan")


def write_results(out_dir: str, stem: str, markdown: str, data) -> str:
    """Write ``<stem>.md`` and ``<stem>.json`` into ``out_dir``; returns the path stem."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem)
    with open(path + ".md", "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    return path
