"""The README's main job: ``jax-autotune shapes`` cold then warm, in two fresh processes."""

import json
from pathlib import Path

import pytest

from jax_autotune.cli import main
from jax_autotune.cli.shapes import disk_backend, fresh_cache_dir


@pytest.mark.slow
@pytest.mark.parametrize("backend, database", [("sqlite", "default.db"), ("directory", "default.d")])
def test_shapes_runs_cold_then_warm_and_the_warm_process_tunes_nothing(tmp_path, capsys, monkeypatch,
                                                                       backend, database):
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", backend)
    report = tmp_path / "shapes.json"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.txt").write_text("the user's own file")
    (cache / "default.db").write_bytes(b"the user's own database")
    assert main(["shapes", "4x64x64x64", "3x64x64x64", "100", "--cache-dir", str(cache),
                 "--json", str(report)]) == 0
    out, err = capsys.readouterr()
    assert "## process 1: cold cache" in out and "## process 2: warm cache" in out
    runs = json.loads(report.read_text())
    used = Path(runs["cache_dir"])
    assert used.parent == cache and err.splitlines()[0] == f"database: {used / database}"
    assert (used / database).exists()
    assert (cache / "notes.txt").read_text() == "the user's own file"  # nothing of the user's is touched
    assert (cache / "default.db").read_bytes() == b"the user's own database"
    cold, warm = ({row["shape"]: row for row in runs[name]} for name in ("cold", "warm"))
    assert cold["4x64x64x64"]["tuned"] == 1
    assert cold["3x64x64x64"]["tuned"] == 0  # a batch of 3 buckets to 4: the same key
    assert cold["100"]["tuned"] == 1
    assert all(row["tuned"] == 0 and row["candidate_runs"] == 0 for row in warm.values())
    assert warm["4x64x64x64"]["store_hits"] == 1 and warm["100"]["store_hits"] == 1
    assert all(0 < row["min_s"] <= row["median_s"] for row in cold.values())


def test_every_run_gets_a_new_empty_folder_of_its_own(tmp_path):
    first, second = fresh_cache_dir(str(tmp_path / "runs")), fresh_cache_dir(str(tmp_path / "runs"))
    assert first != second and Path(first).parent == Path(second).parent == tmp_path / "runs"
    assert list(Path(first).iterdir()) == [] and list(Path(second).iterdir()) == []


@pytest.mark.parametrize("setting, backend", [("sqlite", "sqlite"), ("directory", "directory"),
                                              ("memory", "sqlite")])
def test_the_experiment_keeps_its_store_on_disk_whatever_the_store_setting(monkeypatch, setting, backend):
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", setting)
    assert disk_backend() == backend
