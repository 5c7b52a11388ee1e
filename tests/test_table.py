"""Tune tables: what they hold, their JSON schema, validation on load, installing, merging."""

import copy
import dataclasses
import functools
import json
import os
import pickle
import re
import subprocess
import sys
import warnings

import jax
import pytest

from fakes import CPU, FakeClock, FakeTimer, candidate_set, fake_candidate
from jax_autotune.attention_key import AttentionKey
from jax_autotune.tuning import attention_decisions, counters, programs
from jax_autotune.tuning.attention_decisions import AttentionDecision
from jax_autotune.tuning.programs import ProgramRecord
from jax_autotune import tuners as tuner_module
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.decision import Decision
from jax_autotune.epilogue import Epilogue
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.roofline import Peaks
from jax_autotune.tuning.namespaces import decision_namespace
from jax_autotune.tuning.store import store_at
from jax_autotune.tables import table_file
from jax_autotune.tables.install import load_table, read_table, table
from jax_autotune.tables.table_file import (LIMITS, SCHEMA_VERSION, DeviceTable, KeptRow, TuneTable, TuneTableError,
                                            TuneTableWarning)
from jax_autotune.tuners import current_tuners
from jax_autotune.tuning.tuner import Tuner

pytestmark = pytest.mark.usefixtures("fresh_tuning")  # tmp cache dir, no tuners, fresh counters

PROBLEM_A = MatmulProblem(1, 16, 8, 12, "float32", "float32", "float32")
PROBLEM_B = MatmulProblem(1, 64, 8, 12, "float32", "float32", "float32")
OTHER_GPU = "gpu-Other-GPU-mem1"


class FakeProbes:
    def peaks_for(self, problem):
        return Peaks(compute=1e12, bandwidth=1e11, launch_overhead=1e-6)


def make_tuner(store, device: DeviceInfo = CPU, extra=()) -> Tuner:
    """A tuner with three fake candidates: ``fast`` (1 s) beats ``slow`` (2 s) and
    ``xla_dot`` (3 s)."""
    cset = candidate_set([("g", 1)], [(fake_candidate("fast"), [("g", 1)]),
                                      (fake_candidate("slow"), [("g", 1)]), *extra])
    timer = FakeTimer({"xla_dot": [3.0], "fast": [1.0], "slow": [2.0], "new": [0.5]},
                      real_outputs=True)
    return Tuner(device, cset, jax_device=jax.devices("cpu")[0], timer=timer, store=store,
                 clock=FakeClock(), probes=FakeProbes())


@functools.cache
def tuned_decisions() -> tuple[Decision, ...]:
    """Real decisions of PROBLEM_A and PROBLEM_B, benchmarked once per test session (each
    benchmark compiles fresh operands: seconds on a busy machine)."""
    tuner = make_tuner(store_at(None))
    return tuple(tuner.select(p) for p in (PROBLEM_A, PROBLEM_B))


def tuned_tuner(store) -> Tuner:
    """A tuner that has tuned PROBLEM_A and PROBLEM_B: in memory and in ``store``."""
    tuner = make_tuner(store)
    for decision in tuned_decisions():
        assert tuner.known.install(decision)
    return tuner




def fresh_tuner(tmp_path, name="fresh.db") -> Tuner:
    return make_tuner(store_at(tmp_path / name))


def write_json(path, data):
    path.write_text(json.dumps(data))
    return path


def load_quietly(path, tuners):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = read_table(path, tuners=tuners)
    return loaded, [w for w in caught if issubclass(w.category, TuneTableWarning)]


# ---------------------------------------------------------------- what a table holds

def test_a_context_keys_entry_saves_and_loads_beside_bare_ones(store, tmp_path):
    tuner = tuned_tuner(store)
    in_context = dataclasses.replace(PROBLEM_A, epilogue=Epilogue.parse("row:float32|add(y,$0)"))
    decision = tuner.select(in_context)
    path = table(tuners=[tuner]).save(tmp_path / "t.json")
    loaded = read_table(path, tuners=[fresh_tuner(tmp_path)])
    keys = {d.key for d in loaded.devices[CPU.fingerprint].entries}
    assert decision.key in keys and PROBLEM_A.key() in keys and len(keys) == 3
    assert "epilogue" not in json.loads(path.read_text())["devices"][CPU.fingerprint]["entries"][0]["key"]


def test_a_table_holds_every_decision_with_every_candidate_result(store):
    tuner = tuned_tuner(store)
    t = table(tuners=[tuner])
    section = t.devices[CPU.fingerprint]
    assert section.checksum == tuner.checksum
    assert section.candidates == ("xla_dot", "fast", "slow")
    assert len(t) == 2
    for decision in section.entries:
        assert decision.winner == "fast"
        assert {r.name for r in decision.results} == {"xla_dot", "fast", "slow"}
        assert decision.limit is not None and decision.bounds


def test_a_table_includes_the_store_entries_of_every_device_of_this_version(store, tmp_path):
    tuned_tuner(store)
    later = make_tuner(store)  # a new process: nothing in memory, the same database
    foreign = dataclasses.replace(later.known.lookup(PROBLEM_A.key()), device=OTHER_GPU, checksum="gpu-set")
    store.put(decision_namespace(OTHER_GPU), PROBLEM_A.key().canonical(), "gpu-set",
              foreign.to_json())
    store.put("autotune/0.0.1/0.4.0/old-device/matmul", "k", "c", foreign.to_json())  # old version
    t = table(tuners=[later])
    assert set(t.devices) == {CPU.fingerprint, OTHER_GPU}
    assert len(t.devices[CPU.fingerprint].entries) == 2
    assert t.devices[OTHER_GPU].checksum == "gpu-set"
    assert set(t.devices[OTHER_GPU].candidates) == {"xla_dot", "fast", "slow"}


def test_the_default_table_reads_the_tuners_built_in_this_process(store, monkeypatch):
    tuner = tuned_tuner(store)
    assert len(table()) == 0
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, "cpu", tuner)
    assert len(table()) == 2
    from jax_autotune.registry import ragged_tuner_for
    assert current_tuners() == [tuner, ragged_tuner_for("cpu")]  # the device's dense and grouped tuners
    assert current_tuners()[1].store is tuner.store


# ---------------------------------------------------------------- the JSON schema

def test_save_then_load_round_trips_the_table(store, tmp_path):
    tuner = tuned_tuner(store)
    t = table(tuners=[tuner])
    path = t.save(tmp_path / "out" / "table.json")
    data = json.loads(path.read_text())
    assert data["schema"] == "jax_autotune.tune_table" and data["schema_version"] == SCHEMA_VERSION
    assert set(data) == {"schema", "schema_version", "jax_autotune_version", "jax_version",
                         "created", "devices"}
    assert set(data["devices"][CPU.fingerprint]) == {"checksum", "candidates", "entries"}
    assert read_table(path, tuners=[tuner]) == t



def test_save_without_overwrite_never_replaces_a_file(store, tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    (folder / "table.json").write_text("mine")
    with pytest.raises(FileExistsError):
        table(tuners=[tuned_tuner(store)]).save(folder / "table.json", overwrite=False)
    assert (folder / "table.json").read_text() == "mine"
    assert [p.name for p in folder.iterdir()] == ["table.json"]  # no temporary file left
    table(tuners=[tuned_tuner(store)]).save(folder / "new.json", overwrite=False)
    assert json.loads((folder / "new.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_text_that_is_not_json_is_a_tune_table_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "jax_autotune.tune_table", ')
    with pytest.raises(TuneTableError, match="not a JSON tune table"):
        read_table(path, tuners=[])


def test_a_pickle_is_never_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    path = tmp_path / "table.pkl"
    path.write_bytes(pickle.dumps(Boom()))
    with pytest.raises(TuneTableError):
        read_table(path, tuners=[])


@pytest.mark.parametrize("field, value, message", [
    ("schema", "someone.else", "schema: expected 'jax_autotune.tune_table'"),
    ("schema_version", 2, "schema_version: this build reads version 1, got 2"),
    ("schema_version", "1", "schema_version: expected an integer"),
])
def test_an_unknown_schema_or_version_is_refused(store, tmp_path, field, value, message):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    data[field] = value
    with pytest.raises(TuneTableError, match=message):
        read_table(write_json(tmp_path / "t.json", data), tuners=[])


def _set(path_in_entry, value):
    def mutate(data):
        target = data["devices"][CPU.fingerprint]
        *parents, last = path_in_entry
        for part in parents:
            target = target[part]
        target[last] = value
    return mutate


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(created=12), "created"),
    (lambda d: d.update(devices=[]), "devices"),
    (_set(["checksum"], 5), 'devices["cpu-fake-cpu-mem0"].checksum'),
    (_set(["candidates"], "xla_dot"), "candidates"),
    (_set(["candidates", 1], 7), "candidates[1]"),
    (_set(["entries", 0, "winner"], 5), "entries[0].winner"),
    (_set(["entries", 1, "timestamp"], "yesterday"), "entries[1].timestamp"),
    (_set(["entries", 0, "results", 1, "samples"], "fast"), "results[1].samples"),
    (_set(["entries", 0, "results", 0, "outcome"], "great"), "results[0].outcome"),
    (_set(["entries", 0, "key", "m"], "big"), "'m'"),
    (_set(["entries", 0, "problem"], None), "entries[0].problem"),
    (_set(["entries", 0, "tuning_seconds"], 10**400), "entries[0].tuning_seconds"),
    (_set(["entries", 0, "results", 0, "score"], -10**400), "results[0].score"),
    (_set(["entries", 0, "results", 0, "paired_ratio"], "1.05"), "results[0].paired_ratio"),
], ids=["created", "devices", "checksum", "candidates", "candidate-name", "winner",
        "timestamp", "samples", "outcome", "key-field", "problem", "huge-int", "huge-score", "paired-ratio"])
def test_a_field_of_the_wrong_type_is_an_error_naming_the_field(store, tmp_path, mutate, field):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    mutate(data)
    with pytest.raises(TuneTableError) as info:
        read_table(write_json(tmp_path / "t.json", data), tuners=[])
    assert field in str(info.value)
    assert "t.json" in str(info.value)


# ---------------------------------------------------------------- entries this build cannot use

def test_entries_with_an_unknown_winner_are_skipped_with_one_warning(store, tmp_path):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    for entry in data["devices"][CPU.fingerprint]["entries"]:
        entry["winner"] = "renamed_kernel"
    loaded, caught = load_quietly(write_json(tmp_path / "t.json", data), [fresh_tuner(tmp_path)])
    assert len(caught) == 1
    assert "skipped 2 tune-table entries" in str(caught[0].message)
    assert "winner" in str(caught[0].message)
    assert len(loaded) == 0


def test_a_winner_listed_by_the_table_but_unknown_to_this_build_is_skipped(store, tmp_path):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    data["devices"][CPU.fingerprint]["candidates"].append("renamed_kernel")
    data["devices"][CPU.fingerprint]["entries"][0]["winner"] = "renamed_kernel"
    loaded, caught = load_quietly(write_json(tmp_path / "t.json", data), [fresh_tuner(tmp_path)])
    assert len(caught) == 1 and "skipped 1 tune-table entry" in str(caught[0].message)
    assert len(loaded) == 1


def test_entries_of_a_changed_candidate_set_are_skipped(store, tmp_path):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    grown = make_tuner(store_at(tmp_path / "grown.db"), extra=[(fake_candidate("new"), [("g", 1)])])
    loaded, caught = load_quietly(write_json(tmp_path / "t.json", data), [grown])
    assert len(caught) == 1 and "checksum" in str(caught[0].message)
    assert len(loaded) == 0
    assert load_table(loaded, tuners=[grown]) is loaded and grown.known.lookup(PROBLEM_A.key()) is None


def test_an_entry_whose_checksum_differs_from_its_device_is_skipped(store, tmp_path):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    data["devices"][CPU.fingerprint]["entries"][1]["checksum"] = "tampered"
    loaded, caught = load_quietly(write_json(tmp_path / "t.json", data), [])
    assert len(caught) == 1 and "skipped 1" in str(caught[0].message)
    assert len(loaded) == 1


def test_entries_of_other_devices_are_kept_but_not_installed(store, tmp_path):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    data["devices"][OTHER_GPU] = dict(copy.deepcopy(data["devices"][CPU.fingerprint]),
                                      checksum="gpu-set",
                                      candidates=["xla_dot", "fast", "triton_128x128"])
    for entry in data["devices"][OTHER_GPU]["entries"]:
        entry.update(checksum="gpu-set", winner="triton_128x128")
    path = write_json(tmp_path / "t.json", data)
    fresh = fresh_tuner(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_table(path, tuners=[fresh])
    assert len(loaded.devices[OTHER_GPU].entries) == 2
    assert {d.winner for _, d in loaded.entries(OTHER_GPU)} == {"triton_128x128"}
    assert fresh.store.entries(decision_namespace(OTHER_GPU)) == []
    assert len(fresh.store.entries(fresh.namespace)) == 2


# ---------------------------------------------------------------- installing

def test_load_table_installs_into_the_memory_table_and_the_store(store, tmp_path):
    path = table(tuners=[tuned_tuner(store)]).save(tmp_path / "t.json")
    counters.reset_stats()
    fresh = fresh_tuner(tmp_path)
    load_table(path, tuners=[fresh])
    decision = fresh.select(PROBLEM_A, policy=Policy(mode="require"))
    assert decision.winner == "fast" and decision.source == "memory"
    assert counters.stats()["tuned"] == 0 and counters.stats()["candidate_runs"] == 0
    another_process = make_tuner(store_at(tmp_path / "fresh.db"))
    assert another_process.select(PROBLEM_B, policy=Policy(mode="require")).source == "store"


def test_load_table_without_install_changes_nothing(store, tmp_path):
    path = table(tuners=[tuned_tuner(store)]).save(tmp_path / "t.json")
    fresh = fresh_tuner(tmp_path)
    loaded = load_table(path, install=False, tuners=[fresh])
    assert len(loaded) == 2 and fresh.known.decisions() == []


def test_load_table_defaults_to_the_tuner_of_the_default_backend(store, tmp_path, monkeypatch):
    path = table(tuners=[tuned_tuner(store)]).save(tmp_path / "t.json")
    fresh = fresh_tuner(tmp_path)
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), fresh)
    load_table(str(path))
    assert fresh.known.lookup(PROBLEM_A.key()).winner == "fast"


def test_load_table_names_a_bad_argument():
    with pytest.raises(TypeError, match="path_or_table"):
        load_table(42, tuners=[])


# ---------------------------------------------------------------- merging and summaries

def _table_with(decisions, checksum="c1", device=CPU.fingerprint):
    return TuneTable({device: DeviceTable(checksum, ("xla_dot", "fast", "slow"), tuple(decisions))})


def test_merge_keeps_the_newer_entry_per_device_and_key_and_every_device(store):
    tuner = tuned_tuner(store)
    a, b = (tuner.known.lookup(p.key()) for p in (PROBLEM_A, PROBLEM_B))
    old_a, new_a = dataclasses.replace(a, timestamp=1.0), dataclasses.replace(a, winner="slow", timestamp=2.0)
    mine = _table_with([old_a, dataclasses.replace(b, timestamp=5.0)])
    theirs = TuneTable({**_table_with([new_a, dataclasses.replace(b, winner="slow", timestamp=3.0)]).devices,
                        **_table_with([old_a], device=OTHER_GPU).devices})
    merged = mine.merge(theirs)
    section = merged.devices[CPU.fingerprint]
    assert section.entry(a.key).winner == "slow"  # theirs is newer
    assert section.entry(b.key).winner == "fast"  # mine is newer
    assert set(merged.devices) == {CPU.fingerprint, OTHER_GPU}
    tie = _table_with([dataclasses.replace(old_a, winner="slow")])
    assert mine.merge(tie).devices[CPU.fingerprint].entry(a.key).winner == "fast"  # a tie keeps self


def test_merge_takes_a_device_of_another_candidate_set_whole_from_the_newer_table(store):
    tuner = tuned_tuner(store)
    a, b = (tuner.known.lookup(p.key()) for p in (PROBLEM_A, PROBLEM_B))
    old = _table_with([dataclasses.replace(a, timestamp=1.0), dataclasses.replace(b, timestamp=1.0)])
    new = _table_with([dataclasses.replace(a, timestamp=2.0, winner="slow")], checksum="c2")
    assert old.merge(new).devices[CPU.fingerprint] == new.devices[CPU.fingerprint]
    assert new.merge(old).devices[CPU.fingerprint] == new.devices[CPU.fingerprint]


def test_summary_rows_compare_the_winner_with_xla_and_the_roofline(store):
    tuner = tuned_tuner(store)
    rows = table(tuners=[tuner]).summary_rows()
    assert [row.winner for row in rows] == ["fast", "fast"]
    row = rows[0]
    decision = tuner.known.lookup(PROBLEM_A.key())
    assert row.winner_seconds == 1.0 and row.xla_seconds == 3.0 and row.speedup == 3.0
    assert row.roofline_fraction == pytest.approx(decision.limit / 1.0)
    assert row.samples == len(decision.result("fast").samples) > 0
    assert row.outcomes == {"ok": 3}
    only_b = table(tuners=[tuner]).summary_rows(key=f"m={PROBLEM_B.key().m} ")
    assert [r.key for r in only_b] == [PROBLEM_B.key().canonical()]


# ---------------------------------------------------------------- hostile tables

def exported_json() -> dict:
    return table(tuners=[tuned_tuner(store_at(None))]).to_json()


def test_a_table_nested_100000_deep_is_a_tune_table_error():
    with pytest.raises(TuneTableError, match="not a JSON tune table"):
        TuneTable.loads("[" * 100_000 + "]" * 100_000)
    deep = inner = {}
    for _ in range(100_000):
        inner["x"] = {}
        inner = inner["x"]
    data = exported_json()
    data["devices"][CPU.fingerprint]["entries"][0]["bounds"] = deep
    with pytest.raises(TuneTableError, match=r"entries\[0\]\.bounds\.x: expected a number"):
        TuneTable.from_json(data)
    data["devices"][CPU.fingerprint]["entries"][0]["bounds"] = {}
    data["devices"][CPU.fingerprint]["entries"][0]["key"]["m"] = deep
    with pytest.raises(TuneTableError, match="tune table"):  # never a RecursionError
        TuneTable.from_json(data)


def test_a_table_that_is_not_utf8_is_a_tune_table_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(exported_json()).replace("xla_dot", "xla_d\u00f6t").encode("latin-1"))
    with pytest.raises(TuneTableError, match="UnicodeDecodeError"):
        TuneTable.load(path)


@pytest.mark.parametrize("where", ["reason", "results.error", "winner", "key.lhs_dtype", "fingerprint"])
def test_a_string_over_the_cap_is_refused_naming_the_field_and_the_cap(where):
    data = exported_json()
    huge = "x" * (LIMITS["characters per string"] + 1)
    entry = data["devices"][CPU.fingerprint]["entries"][0]
    if where == "reason":
        entry["reason"] = huge
    elif where == "results.error":
        entry["results"][0]["error"] = huge
    elif where == "winner":
        entry["winner"] = huge
    elif where == "key.lhs_dtype":
        entry["key"]["lhs_dtype"] = huge
    else:
        data["devices"][huge] = data["devices"].pop(CPU.fingerprint)
    cap = f"over the cap of {LIMITS['characters per string']:,} characters per string"
    with pytest.raises(TuneTableError, match=cap) as info:
        TuneTable.from_json(data, origin="t.json")
    assert len(str(info.value)) < 500  # the error never copies the string


@pytest.mark.parametrize("limit, path", [("entries per device", ("entries",)),
                                         ("results per entry", ("entries", 0, "results")),
                                         ("candidates per device", ("candidates",))])
def test_counts_over_their_caps_are_refused_naming_the_cap(monkeypatch, limit, path):
    data = exported_json()
    target = data["devices"][CPU.fingerprint]
    for part in path:
        target = target[part]
    monkeypatch.setitem(LIMITS, limit, len(target) - 1)
    with pytest.raises(TuneTableError, match=f"over the cap of {len(target) - 1:,} {limit}"):
        TuneTable.from_json(data)


class Unread:
    """A file whose text may not be read (only its descriptor, to stat it)."""

    def __init__(self, f):
        self.file = f

    def fileno(self):
        return self.file.fileno()

    def read(self, *_):
        raise AssertionError("the text was read")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_a_file_over_the_text_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(LIMITS["bytes of text"] + 1)  # sparse: costs no disk
    opened = table_file.open_regular
    monkeypatch.setattr(table_file, "open_regular", lambda p: Unread(opened(p)))
    with pytest.raises(TuneTableError, match=f"over the cap of {LIMITS['bytes of text']:,} bytes"):
        TuneTable.load(path)


@pytest.mark.parametrize("text", ['{"schema": [' + "0.0," * 999 + "0.0]}",
                                  '{"schema": [' + "[]," * 999 + "[]]}",
                                  '{"schema": {' + ", ".join(f'"k{i}": {{}}' for i in range(999)) + "}}"])
def test_too_many_values_are_refused_before_parsing(tmp_path, monkeypatch, text):
    path = tmp_path / "values.json"
    path.write_text(text)
    monkeypatch.setitem(LIMITS, "JSON values", 900)
    monkeypatch.setattr(json, "loads", None)  # parsing would fail
    for load in (lambda: TuneTable.load(path), lambda: TuneTable.loads(text),
                 lambda: TuneTable.loads(text.encode())):
        with pytest.raises(TuneTableError, match="over the cap of 900 JSON values"):
            load()


def test_a_real_table_as_large_as_the_text_cap_stays_under_the_value_cap():
    text = TuneTable.from_json(exported_json()).dumps()
    values = sum(text.count(mark) for mark in ",[{")
    assert values * LIMITS["bytes of text"] / len(text) < LIMITS["JSON values"]


def test_the_error_for_a_huge_value_quotes_only_its_start():
    data = exported_json()
    for where in ("schema", "candidates", "samples"):
        bad = copy.deepcopy(data)
        huge = [list(range(10))] * 100_000
        if where == "schema":
            bad["schema"] = huge
        elif where == "candidates":
            bad["devices"][CPU.fingerprint]["candidates"] = [huge]
        else:
            bad["devices"][CPU.fingerprint]["entries"][0]["results"][0]["samples"] = [huge]
        with pytest.raises(TuneTableError, match=r"got \[\[0, 1, 2, 3, \.\.\.\]") as info:
            TuneTable.from_json(bad, origin="t.json")
        assert len(str(info.value)) < 300


def test_only_a_regular_file_is_read_as_a_table_and_a_fifo_is_never_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    code = ("import sys, jax_autotune as jat\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n"
            "        jat.load_table(path)\n"
            "    except OSError as err:\n"
            "        print(type(err).__name__, err)\n")
    paths = [str(tmp_path / "fifo.json"), "/dev/zero", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=str(tmp_path / "c")))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        f"NotARegularFileError {paths[0]}: not a regular file (a FIFO)",
        "NotARegularFileError /dev/zero: not a regular file (a character device)",
        f"NotARegularFileError {paths[2]}: not a regular file (a folder)"]


def test_a_table_entry_whose_winner_cannot_run_its_key_is_not_installed_and_named(tmp_path):
    tiny = fake_candidate("tiny_only")
    tiny = dataclasses.replace(tiny, supports=lambda device, key: key.m <= 8)
    tuner = make_tuner(store_at(tmp_path / "t.db"), extra=[(tiny, [("g", 1)])])
    hostile = dataclasses.replace(tuned_decisions()[0], winner="tiny_only")
    t = TuneTable({CPU.fingerprint: DeviceTable(tuner.checksum, tuner.candidate_set.names(), (hostile,))})
    with pytest.warns(TuneTableWarning, match="1 whose kernel cannot run here") as record:
        load_table(t, tuners=[tuner])
    message = str(record[0].message)
    assert "'tiny_only'" in message and PROBLEM_A.key().canonical() in message
    assert tuner.known.lookup(PROBLEM_A.key()) is None and tuner.store.entries() == []
    assert tuner.select(PROBLEM_A).winner == "fast"  # tuned again


def test_a_grouped_matmuls_decisions_ship_in_their_own_section_and_install_elsewhere(fresh_tuning, tmp_path):
    """A table holds one candidate set per section: a device's grouped decisions are the
    section <fingerprint>/grouped, shown, saved, and installed into the grouped tuner of
    another process, which then compiles under require with nothing to tune."""
    import jax.numpy as jnp

    import jax_autotune as jat
    from jax_autotune import config
    from jax_autotune.cli.table import show_lines
    from jax_autotune.registry import RUNTIME, ragged_tuner_for
    from jax_autotune.tables.install import section_name

    x, w, sizes = jnp.ones((64, 32)), jnp.ones((4, 32, 16)), jnp.array([20, 0, 30, 10], jnp.int32)
    want = jax.jit(jax.lax.ragged_dot)(x, w, sizes)
    jax.jit(jat.ragged_dot)(x, w, sizes).block_until_ready()
    jax.jit(jat.matmul)(x, w[0]).block_until_ready()
    fingerprint = current_tuners()[0].device.fingerprint
    harvested = jat.table()
    assert set(harvested.devices) == {fingerprint, section_name(fingerprint, grouped=True)}
    grouped = harvested.devices[section_name(fingerprint, grouped=True)]
    assert [d.key.groups for d in grouped.entries] == [4] and grouped.checksum == ragged_tuner_for("cpu").checksum
    assert any(line.startswith(f"device {fingerprint}/grouped: 1 decisions")
               for line in show_lines(harvested.summary_rows()))
    path = harvested.save(tmp_path / "t.json")

    RUNTIME.reset()  # another process, with a store of its own
    config.update("cache_dir", str(tmp_path / "elsewhere"))
    assert len(jat.load_table(path)) == 2
    config.update("mode", "require")
    tuned = counters.stats()["tuned"]
    got = jax.jit(jat.ragged_dot)(x, w, sizes)
    assert counters.stats()["tuned"] == tuned and ragged_tuner_for("cpu").known.lookup(grouped.entries[0].key) is not None
    assert float(jnp.max(jnp.abs(got - want))) == 0.0


# ---------------------------------------------------------------- attentions and program checks

ATTENTION_KEY = AttentionKey(batch=2, heads=4, t=33, s=33, head_dim=16, dtype="bfloat16", causal=True)
FUSED = AttentionDecision(ATTENTION_KEY, "cudnn", {"as_written": 2e-3, "cudnn": 5e-4})


def with_attention_and_program(tuner) -> ProgramRecord:
    """``tuner``'s store holds an attention decision (fused) and a program check that left
    PROBLEM_A's key plain, as a warmup of a ``jat.autotune`` program keeps them."""
    attention_decisions.remember(tuner, FUSED, "impls-1")
    record = ProgramRecord(0.04, 0.05, 0.039, (PROBLEM_A.key().canonical(),))
    programs.remember(tuner, "program-1", record)
    return record


def forget_memory():
    attention_decisions.forget()
    programs.forget()


def test_a_table_ships_the_attention_decisions_and_program_checks(store, tmp_path):
    record = with_attention_and_program(tuned_tuner(store))
    path = table(tuners=[tuned_tuner(store)]).save(tmp_path / "t.json")
    forget_memory()  # another machine: an empty store, nothing in memory
    fresh = fresh_tuner(tmp_path)
    assert attention_decisions.known(fresh, ATTENTION_KEY, "impls-1") is None
    loaded, caught = load_quietly(path, [fresh])
    assert caught == [] and len(loaded.attention[CPU.fingerprint]) == len(loaded.programs[CPU.fingerprint]) == 1
    load_table(loaded, tuners=[fresh])
    got = attention_decisions.known(fresh, ATTENTION_KEY, "impls-1")
    assert (got.winner, got.seconds, got.source) == ("cudnn", FUSED.seconds, "memory")
    assert programs.left_plain(fresh, "program-1") == frozenset({PROBLEM_A.key()})
    forget_memory()  # the next process reads them from the store the table was installed into
    assert attention_decisions.known(fresh, ATTENTION_KEY, "impls-1").source == "store"
    assert programs.record(fresh, "program-1") == record


def test_a_program_check_of_another_candidate_set_is_not_installed(store, tmp_path):
    with_attention_and_program(tuned_tuner(store))
    shipped = table(tuners=[tuned_tuner(store)])
    forget_memory()
    other = make_tuner(store_at(tmp_path / "other.db"), extra=[(fake_candidate("new"), [("g", 1)])])
    assert other.checksum != tuned_tuner(store).checksum
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuneTableWarning)  # the matmul entries: another candidate set
        load_table(shipped, tuners=[other])
    assert programs.record(other, "program-1") is None  # its keys were checked with other kernels
    assert attention_decisions.known(other, ATTENTION_KEY, "impls-1").winner == "cudnn"  # its own checksum


def test_a_table_without_attentions_or_programs_writes_neither(store):
    data = table(tuners=[tuned_tuner(store)]).to_json()
    assert "attention" not in data and "programs" not in data


def test_rows_that_are_no_decision_or_check_are_skipped_with_the_one_warning(store, tmp_path):
    with_attention_and_program(tuned_tuner(store))
    data = table(tuners=[tuned_tuner(store)]).to_json()
    data["attention"][CPU.fingerprint].append({"key": "attention:nonsense", "checksum": "x", "value": {"winner": 1}})
    wrong_key = dict(data["attention"][CPU.fingerprint][0], key=dataclasses.replace(ATTENTION_KEY, t=7).canonical())
    data["attention"][CPU.fingerprint].append(wrong_key)  # a decision filed under another key
    data["programs"][CPU.fingerprint].append({"key": "p2", "checksum": "x", "value": {"left_plain": "all"}})
    loaded, caught = load_quietly(write_json(tmp_path / "t.json", data), [fresh_tuner(tmp_path)])
    assert len(caught) == 1 and "skipped 3" in str(caught[0].message)
    assert [r.key for r in loaded.attention[CPU.fingerprint]] == [ATTENTION_KEY.canonical()]
    assert [r.key for r in loaded.programs[CPU.fingerprint]] == ["program-1"]


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.update(programs=[1]), "programs: expected"),
    (lambda d: d["attention"].update({CPU.fingerprint: {"key": 1}}), "attention[\"" + CPU.fingerprint + "\"]: expected a list"),
    (lambda d: d["attention"][CPU.fingerprint][0].update(checksum=3), ".checksum: expected a string"),
    (lambda d: d["programs"][CPU.fingerprint][0].update(value="record"), ".value: expected"),
])
def test_an_attention_or_program_field_of_the_wrong_type_is_an_error_naming_it(store, tmp_path, mutate, where):
    with_attention_and_program(tuned_tuner(store))
    data = table(tuners=[tuned_tuner(store)]).to_json()
    mutate(data)
    with pytest.raises(TuneTableError, match=re.escape(where)):
        TuneTable.loads(json.dumps(data))


def test_merge_takes_the_others_attention_and_program_rows_per_key():
    fast = KeptRow(ATTENTION_KEY.canonical(), "impls-1", FUSED.to_json())
    written = KeptRow(ATTENTION_KEY.canonical(), "impls-1",
                      dataclasses.replace(FUSED, winner="as_written").to_json())
    check = KeptRow("program-1", "c1", ProgramRecord(1.0, 1.1, 1.0, ()).to_json())
    mine = TuneTable(attention={CPU.fingerprint: (fast,)}, programs={CPU.fingerprint: (check,)})
    theirs = TuneTable(attention={CPU.fingerprint: (written,), OTHER_GPU: (fast,)})
    merged = mine.merge(theirs)
    assert merged.attention == {CPU.fingerprint: (written,), OTHER_GPU: (fast,)}
    assert merged.programs == {CPU.fingerprint: (check,)}
    assert TuneTable.loads(merged.dumps()).attention == merged.attention  # and they round-trip
