"""Shared by the benchmark scripts: geomeans and writing a run's table and data.

    >>> write_results("benchmarks/results", "cpu_suite_2026-11-29", markdown_text, rows)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys


def geomean(values) -> float:
    values = [v for v in values if v]
    return statistics.geometric_mean(values) if values else float("nan")


def child_result(script: str, args: list[str], env: dict, timeout_s: float) -> dict:
    """Run ``python script *args`` and return the last line it prints, a JSON object;
    a failure raises RuntimeError with the end of its stderr.

        >>> child_result(__file__, ["--variant", "plain"], dict(os.environ), 240)
    """
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env=env, timeout=timeout_s)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{os.path.basename(script)} {' '.join(args)} failed "
                           f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def write_results(out_dir: str, stem: str, markdown: str, data) -> str:
    """Write ``<stem>.md`` and ``<stem>.json`` into ``out_dir``; returns the path stem."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem)
    with open(path + ".md", "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    return path
