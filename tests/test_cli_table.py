"""``jax-autotune show | explain | export | import | clear`` through ``cli.main``."""

import json

import jax
import pytest

from jax_autotune import cli
from jax_autotune import tuners as tuner_module
from jax_autotune.cli.table import format_seconds
from jax_autotune.tuning.namespace import throughput_namespace
from jax_autotune.tuning.store import open_store
from jax_autotune.tables.summary import key_id
from test_table import PROBLEM_A, PROBLEM_B, make_tuner, tuned_tuner  # noqa: F401

pytestmark = pytest.mark.usefixtures("fresh_tuning")  # tmp cache dir, no tuners, fresh counters


@pytest.fixture
def tuner(monkeypatch):
    """The default backend's tuner: two tuned keys, in the configured (tmp) store."""
    built = tuned_tuner(open_store())
    monkeypatch.setitem(tuner_module._tuners, jax.default_backend(), built)
    yield built
    built.store.close()


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_prints_one_line_per_decision_with_the_winner_and_the_speedup(tuner, capsys):
    code, out, _ = run(capsys, "show")
    assert code == 0
    assert f"device {tuner.device.fingerprint}: 2 decisions" in out
    rows = [line for line in out.splitlines() if key_id(PROBLEM_A.key()) in line]
    assert len(rows) == 1
    for expected in ("fast", "1.00s", "3.00s", "3.00x", "ok=3"):
        assert expected in rows[0]


def test_show_filters_by_key_and_device(tuner, capsys):
    _, out, _ = run(capsys, "show", "--key", key_id(PROBLEM_B.key()))
    assert key_id(PROBLEM_B.key()) in out and key_id(PROBLEM_A.key()) not in out
    _, out, _ = run(capsys, "show", "--device", "gpu-nothing-mem0")
    assert "no tuned decisions" in out


def test_explain_lists_every_candidate_with_outcome_samples_and_score(tuner, capsys):
    code, out, _ = run(capsys, "explain", PROBLEM_A.key().canonical())
    assert code == 0
    assert PROBLEM_A.key().canonical() in out
    assert "winner     fast (1.00s)" in out
    lines = {line.split()[1] if line.startswith("*") else line.split()[0]: line
             for line in out.splitlines()[out.splitlines().index("") + 2:]}
    assert set(lines) == {"fast", "slow", "xla_dot"}
    assert lines["fast"].startswith("*") and " ok " in lines["slow"]
    code, by_id, _ = run(capsys, "explain", key_id(PROBLEM_A.key()))
    assert code == 0 and by_id == out


def test_explain_refuses_an_ambiguous_or_unknown_key(tuner, capsys):
    code, _, err = run(capsys, "explain", "k=")
    assert code == 2 and "matches 2 decisions" in err and key_id(PROBLEM_B.key()) in err
    code, _, err = run(capsys, "explain", "m=999999")
    assert code == 2 and "no decision matches" in err


def test_export_clear_import_restores_the_decisions_and_keeps_probes(tuner, capsys, tmp_path, monkeypatch):
    store = tuner.store
    store.put(throughput_namespace(tuner.device.fingerprint), "peaks", "v1", {"flops": 1.0})
    path = tmp_path / "exported.json"
    code, out, _ = run(capsys, "export", str(path))
    assert code == 0 and "exported 2 decisions" in out
    assert json.loads(path.read_text())["schema_version"] == 1

    code, out, _ = run(capsys, "clear")
    assert code == 0 and "deleted 2 stored decisions" in out
    assert store.entries(tuner.namespace) == []
    assert store.entries(throughput_namespace(tuner.device.fingerprint)) != []
    assert tuner.decisions() == []
    _, out, _ = run(capsys, "show")
    assert "no tuned decisions" in out

    fresh = make_tuner(open_store())  # a new process on the same machine
    monkeypatch.setitem(tuner_module._tuners, jax.default_backend(), fresh)
    code, out, _ = run(capsys, "import", str(path))
    assert code == 0 and f"installed 2 decisions for {tuner.device.fingerprint}" in out
    assert fresh.select(PROBLEM_A, mode="require").winner == "fast"
    _, out, _ = run(capsys, "show")
    assert key_id(PROBLEM_A.key()) in out and "fast" in out


def test_clear_with_a_device_deletes_only_that_device(tuner, capsys):
    code, out, _ = run(capsys, "clear", "--device", "gpu-other-mem1")
    assert code == 0 and "deleted 0" in out
    assert len(tuner.store.entries(tuner.namespace)) == 2


def test_import_of_a_damaged_file_names_the_field(tuner, capsys, tmp_path):
    path = tmp_path / "t.json"
    run(capsys, "export", str(path))
    data = json.loads(path.read_text())
    data["devices"][tuner.device.fingerprint]["entries"][0]["winner"] = 3
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "import", str(path))
    assert code == 2 and "entries[0].winner: expected a string" in err
    code, _, err = run(capsys, "import", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json" in err


@pytest.mark.parametrize("seconds, text", [(None, "-"), (2.5, "2.50s"), (0.0015, "1.5ms"),
                                           (1.5e-5, "15.0us"), (2e-8, "20ns")])
def test_times_are_printed_with_a_unit(seconds, text):
    assert format_seconds(seconds) == text
