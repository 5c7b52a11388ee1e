"""The README's main job: ``jax-autotune shapes`` cold then warm, in two fresh processes."""

import json

from jax_autotune.cli import main


def test_shapes_runs_cold_then_warm_and_the_warm_process_tunes_nothing(tmp_path, capsys):
    report = tmp_path / "shapes.json"
    assert main(["shapes", "4x64x64x64", "3x64x64x64", "100", "--cache-dir", str(tmp_path / "cache"),
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "## process 1: cold cache" in out and "## process 2: warm cache" in out
    runs = json.loads(report.read_text())
    cold, warm = ({row["shape"]: row for row in runs[name]} for name in ("cold", "warm"))
    assert cold["4x64x64x64"]["tuned"] == 1
    assert cold["3x64x64x64"]["tuned"] == 0  # a batch of 3 buckets to 4: the same key
    assert cold["100"]["tuned"] == 1
    assert all(row["tuned"] == 0 and row["candidate_runs"] == 0 for row in warm.values())
    assert warm["4x64x64x64"]["store_hits"] == 1 and warm["100"]["store_hits"] == 1
    assert all(0 < row["min_s"] <= row["median_s"] for row in cold.values())
