"""``jax-autotune show | explain | export | import | clear`` through ``cli.main``."""

import dataclasses
import io
import json
import os
import sqlite3
import subprocess
import sys

import jax
import pytest

import jax_autotune as jat
from jax_autotune import cli
from jax_autotune import tuners as tuner_module
from jax_autotune.cli.table import format_seconds
from jax_autotune import config
from jax_autotune.epilogue import Epilogue
from jax_autotune.tables.install import table
from jax_autotune.tuning.namespaces import decision_namespace, throughput_namespace
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.store import DirectoryStore, store_at, open_store
from jax_autotune.tables.summary import key_id
from test_store import snapshot
from test_table import PROBLEM_A, PROBLEM_B, make_tuner, tuned_tuner  # noqa: F401

pytestmark = pytest.mark.usefixtures("fresh_tuning")  # tmp cache dir, no tuners, fresh counters


BOTH = pytest.mark.parametrize("store_backend", ["sqlite", "directory"], indirect=True)


@pytest.fixture
def store_backend(request):
    """The ``store`` setting of the test (sqlite unless it is parametrized with ``BOTH``)."""
    backend = getattr(request, "param", "sqlite")
    jat.config.update("store", backend)
    return backend


@pytest.fixture
def tuner(monkeypatch, store_backend):
    """The default backend's tuner: two tuned keys, in the configured (tmp) store."""
    built = tuned_tuner(open_store(config.store_choice()))
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), built)
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
    for expected in ("fast", "1.00s", "3.00s", "3.00x"):
        assert expected in rows[0]
    assert "ok=3" not in rows[0]  # samples and outcomes: --wide
    _, out, _ = run(capsys, "show", "--wide")
    (row,) = [line for line in out.splitlines() if key_id(PROBLEM_A.key()) in line]
    assert row.split()[-2:] == ["3", "ok=3"] and "fast" in row


def test_show_fits_100_columns_cutting_the_winner_then_the_key_and_wide_cuts_nothing(tuner, capsys,
                                                                                     monkeypatch):
    from jax_autotune.cli import table as cli_table
    long_key = dataclasses.replace(PROBLEM_A, epilogue=Epilogue.parse(
        "row:float32|add(y,$0);tanh(%0);mul(%1,$0);logistic(%2);add(%3,$0)"))
    tuner.select(long_key)
    rows = cli_table._current_table().summary_rows()
    rows = [dataclasses.replace(r, winner="ragged_k_mosaic_gemm_bm128_bn128_bk64_st4_gn8") for r in rows]
    narrow = cli_table.show_lines(rows)
    assert max(len(line) for line in narrow) <= 100
    (cut,) = [line for line in narrow if line.startswith(key_id(long_key.key()))]
    key_cell, winner_cell = cut.split("  ")[1:3]
    assert winner_cell.strip() == "ragged_k_mosaic_gemm_bm12…" and key_cell.rstrip().endswith("…")
    wide = cli_table.show_lines(rows, wide=True)
    (whole,) = [line for line in wide if line.startswith(key_id(long_key.key()))]
    assert long_key.key().describe() in whole and "ragged_k_mosaic_gemm_bm128_bn128_bk64_st4_gn8" in whole
    assert max(len(line) for line in wide) > 100


def test_show_and_explain_print_a_context_keys_epilogue(tuner, capsys):
    in_context = dataclasses.replace(PROBLEM_A, epilogue=Epilogue.parse("row:float32|add(y,$0);tanh(%0)"))
    tuner.select(in_context)
    _, out, _ = run(capsys, "show", "--wide")
    assert "16x8x16 float32 NN DEFAULT | add(y,row) > tanh" in out
    code, out, _ = run(capsys, "explain", key_id(in_context.key()))
    assert code == 0 and "epilogue=row:float32|add(y,$0);tanh(%0)" in out
    assert "epilogue   add(y,row) > tanh" in out


def test_show_filters_by_key_and_device(tuner, capsys):
    _, out, _ = run(capsys, "show", "--key", key_id(PROBLEM_B.key()))
    assert key_id(PROBLEM_B.key()) in out and key_id(PROBLEM_A.key()) not in out
    other = decision_namespace("gpu-other-mem1")
    tuner.store.put(other, "k", "c", {"winner": "xla_dot"})  # a device the store knows
    _, out, _ = run(capsys, "show", "--device", "gpu-other-mem1")
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


def test_explain_says_what_an_export_used(tuner, capsys):
    decision = tuner.known.lookup(PROBLEM_A.key())
    _, out, _ = run(capsys, "explain", key_id(PROBLEM_A.key()))
    assert "exported" not in out
    assert tuner.known.install(dataclasses.replace(decision, export_kernel="slow", export_reason="why"))
    _, out, _ = run(capsys, "explain", key_id(PROBLEM_A.key()))
    assert "exported   slow (why)" in out


def test_explain_says_how_a_host_clock_s_winner_fared_in_turns_with_the_baseline_after_a_reload(tuner, capsys):
    decision = tuner.known.lookup(PROBLEM_A.key())
    _, out, _ = run(capsys, "explain", key_id(PROBLEM_A.key()))
    assert "in turns" not in out
    paired = tuple(dataclasses.replace(r, paired_ratio=0.97) if r.name == "fast" else r for r in decision.results)
    assert tuner.known.install(dataclasses.replace(decision, winner="xla_dot", results=paired))
    _, out, _ = run(capsys, "explain", key_id(PROBLEM_A.key()))
    assert "in turns   fast: the baseline took 0.97x its time, timed in turns (xla_dot kept)" in out


def test_explain_refuses_an_ambiguous_or_unknown_key(tuner, capsys):
    code, _, err = run(capsys, "explain", "k=")
    assert code == 2 and "matches 2 decisions" in err and key_id(PROBLEM_B.key()) in err
    code, _, err = run(capsys, "explain", "m=999999")
    assert code == 2 and "no decision matches" in err


@BOTH
def test_export_clear_import_restores_the_decisions_and_keeps_probes(tuner, capsys, tmp_path, monkeypatch):
    store = tuner.store
    store.put(throughput_namespace(tuner.device.fingerprint), "peaks", "v1", {"flops": 1.0})
    path = tmp_path / "exported.json"
    code, out, _ = run(capsys, "export", str(path))
    assert code == 0 and "exported 2 decisions" in out
    assert json.loads(path.read_text())["schema_version"] == 1

    code, out, _ = run(capsys, "clear", "--yes")
    assert code == 0 and "deleted 2 stored decisions" in out
    assert store.entries(tuner.namespace) == []
    assert store.entries(throughput_namespace(tuner.device.fingerprint)) != []
    assert tuner.known.decisions() == []
    _, out, _ = run(capsys, "show")
    assert "no tuned decisions" in out

    fresh = make_tuner(open_store(config.store_choice()))  # a new process on the same machine
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), fresh)
    code, out, _ = run(capsys, "import", str(path))
    assert code == 0 and f"installed 2 decisions for {tuner.device.fingerprint}" in out
    assert fresh.select(PROBLEM_A, policy=Policy(mode="require")).winner == "fast"
    _, out, _ = run(capsys, "show")
    assert key_id(PROBLEM_A.key()) in out and "fast" in out


HOSTILE_EDITS = [(("results", 0, "score"), "abc"), (("results", 0, "name"), 1),
                 (("winner",), 5), (("results", 0, "samples"), ["x"]), (("bounds",), {"a": [1]}),
                 (("results", 0, "outcome"), "great"), (("results", 0, "score"), 10**400)]


def edit_row(store, namespace, key, where, value):
    """Set one field of a stored row's JSON value, in its database or its file, as a
    hostile hand would."""
    store.close()
    if isinstance(store, DirectoryStore):
        [checksum] = [e.checksum for e in store.entries(namespace) if e.key == key]
        path = store._paths(namespace, key, checksum)[1]
        record = json.loads(path.read_text())
        target = record["value"]
        for part in where[:-1]:
            target = target[part]
        target[where[-1]] = value
        path.write_text(json.dumps(record))
        return
    with sqlite3.connect(store.path) as raw:
        (text,) = raw.execute("SELECT value FROM entries WHERE namespace = ? AND key = ?",
                              (namespace, key)).fetchone()
        data = target = json.loads(text)
        for part in where[:-1]:
            target = target[part]
        target[where[-1]] = value
        raw.execute("UPDATE entries SET value = ? WHERE namespace = ? AND key = ?",
                    (json.dumps(data), namespace, key))


@BOTH
@pytest.mark.parametrize("where, value", HOSTILE_EDITS, ids=lambda x: ".".join(map(str, x))[:20]
                         if isinstance(x, tuple) else str(x)[:12])
def test_a_hostile_store_row_is_skipped_with_a_warning_by_every_command(tuner, capsys, tmp_path,
                                                                         monkeypatch, where, value):
    edit_row(tuner.store, tuner.namespace, PROBLEM_A.key().canonical(), where, value)

    def command(*argv):  # each in a new process: nothing in memory, no warning given yet
        monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), make_tuner(open_store(config.store_choice())))
        return run(capsys, *argv)

    bad, good = key_id(PROBLEM_A.key()), key_id(PROBLEM_B.key())
    skipped = "warning: skipping a bad row in the tune store"
    code, out, err = command("show")
    assert code == 0 and good in out and bad not in out
    assert skipped in err and PROBLEM_A.key().canonical() in err
    code, out, err = command("explain", good)
    assert code == 0 and "winner     fast" in out and skipped in err
    code, out, err = command("explain", bad)
    assert code == 2 and "no decision matches" in err and "Traceback" not in err
    code, out, err = command("export", str(tmp_path / "t.json"))
    assert code == 0 and "exported 1 decisions" in out and skipped in err
    exported = json.loads((tmp_path / "t.json").read_text())
    assert [e["key_string"] for d in exported["devices"].values() for e in d["entries"]] == [
        PROBLEM_B.key().canonical()]
    code, out, err = command("import", str(tmp_path / "t.json"))
    assert code == 0 and "installed 1 decisions" in out


def test_clear_with_a_device_deletes_only_that_device(tuner, capsys):
    other = decision_namespace("gpu-other-mem1")
    tuner.store.put(other, "k", "c", {"winner": "xla_dot"})
    code, out, _ = run(capsys, "clear", "--yes", "--device", "gpu-other-mem1")
    assert code == 0 and "deleted 1" in out
    assert len(tuner.store.entries(tuner.namespace)) == 2 and tuner.store.entries(other) == []


def test_clear_of_an_unknown_device_is_an_error_listing_the_known_ones(tuner, capsys):
    code, out, err = run(capsys, "clear", "--yes", "--device", "bogus")
    assert code == 2 and out == ""
    assert "'bogus'" in err and tuner.device.fingerprint in err
    assert len(tuner.store.entries(tuner.namespace)) == 2


def test_export_refuses_to_replace_a_file_without_force(tuner, capsys, tmp_path):
    path = tmp_path / "tune_table.json"
    path.write_text("mine")
    code, out, err = run(capsys, "export", str(path))
    assert code == 2 and out == "" and "exists; pass --force" in err
    assert path.read_text() == "mine"
    code, out, _ = run(capsys, "export", str(path), "--force")
    assert code == 0 and json.loads(path.read_text())["schema_version"] == 1


def test_export_makes_no_folders_and_takes_no_folder_as_its_file(tuner, capsys, tmp_path):
    code, _, err = run(capsys, "export", str(tmp_path / "missing" / "t.json"))
    assert code == 2 and f"the folder {tmp_path / 'missing'} does not exist" in err
    assert not (tmp_path / "missing").exists()
    code, _, err = run(capsys, "export", str(tmp_path))
    assert code == 2 and "is a folder" in err


def test_export_writes_the_permissions_the_umask_gives(tuner, capsys, tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    old = os.umask(0o027)
    try:
        code, _, _ = run(capsys, "export", str(folder / "t.json"))
    finally:
        os.umask(old)
    assert code == 0 and (folder / "t.json").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in folder.iterdir()] == ["t.json"]  # no temporary file left


def test_export_of_one_device_writes_only_its_decisions(tuner, capsys, tmp_path):
    other = decision_namespace("gpu-other-mem1")
    tuner.store.put(other, PROBLEM_A.key().canonical(), "c", tuner.known.lookup(PROBLEM_A.key()).to_json())
    code, _, _ = run(capsys, "export", str(tmp_path / "t.json"), "--device", tuner.device.fingerprint)
    assert code == 0
    assert list(json.loads((tmp_path / "t.json").read_text())["devices"]) == [tuner.device.fingerprint]


@pytest.mark.parametrize("argv", [["show"], ["explain", "m="], ["export", "t.json"], ["clear", "--yes"]])
def test_an_unknown_device_is_the_same_error_in_every_command(tuner, capsys, tmp_path, monkeypatch, argv):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    code, out, err = run(capsys, *argv, "--device", "bogus")
    assert code == 2 and out == ""
    [line] = [line for line in err.splitlines() if line.startswith("jax-autotune:")]
    assert line == (f"jax-autotune: {argv[0]}: --device 'bogus' is not a device of this store or "
                    f"process; known: {tuner.device.fingerprint}")
    assert list((tmp_path / "work").iterdir()) == [] and len(tuner.store.entries(tuner.namespace)) == 2


class Terminal(io.StringIO):
    """A stdin that says it is a terminal, with the answer already typed."""

    def isatty(self):
        return True


@pytest.mark.parametrize("answer, deleted", [("y\n", True), ("yes\n", True), ("n\n", False),
                                             ("\n", False), ("", False)])
def test_clear_asks_on_a_terminal_and_deletes_only_on_yes(tuner, capsys, monkeypatch, answer, deleted):
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    code, out, err = run(capsys, "clear")
    assert f"Delete the stored decisions of {tuner.device.fingerprint} from {tuner.store.path}" in err
    assert "[y/N]" in err
    assert (code, bool(out)) == ((0, True) if deleted else (1, False))
    assert len(tuner.store.entries(tuner.namespace)) == (0 if deleted else 2)


def test_clear_off_a_terminal_needs_yes_and_deletes_nothing(tuner, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, err = run(capsys, "clear")
    assert code == 2 and out == "" and "pass --yes" in err
    assert len(tuner.store.entries(tuner.namespace)) == 2


def test_version_names_the_package_and_jax(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jax-autotune {jat.__version__} (jax {jax.__version__})"


def test_help_and_version_answer_without_importing_jax():
    code = ("import sys\n"
            "from jax_autotune.cli import main\n"
            "for argv in (['--help'], ['--version'], ['show', '--help'], ['clear', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted(m for m in ('jax', 'jaxlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: jax-autotune" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv", [["keys", "12x"], ["keys", "512", "--dtype", "float8"],
                                  ["shapes", "abc"], ["keys", "0"], ["shapes", "64", "--dtype", "bf16"]])
def test_bad_arguments_are_usage_errors_with_one_line(capsys, argv):  # the bad token is last
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    _, err = capsys.readouterr()
    assert info.value.code == 2
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert repr(argv[-1]) in line
    assert "Traceback" not in err


@pytest.mark.parametrize("backend, why", [("sqlite", "not a database"), ("directory", "not a folder")])
@pytest.mark.parametrize("command", ["show", "export", "import", "clear"])
def test_a_store_that_is_not_a_database_fails_with_one_line_and_exit_1(capsys, tmp_path, command,
                                                                        backend, why):
    table_file = tmp_path / "t.json"
    table(tuners=[tuned_tuner(store_at(None))]).save(table_file)
    jat.config.update("store", backend)
    database = open_store(config.store_choice()).path
    database.parent.mkdir(parents=True, exist_ok=True)
    database.write_bytes(b"not a database" * 100)
    code, out, err = run(capsys, command, *([str(table_file)] if command in ("export", "import") else []))
    assert code == 1 and out == ""
    assert err.splitlines()[0] == f"database: {database}"
    [reason] = [line for line in err.splitlines() if line.startswith("jax-autotune:")]
    assert f"{command}:" in reason and why in reason
    assert database.read_bytes() == b"not a database" * 100


@pytest.mark.parametrize("command", ["import", "clear"])
@pytest.mark.parametrize("setting", ["JAX_AUTOTUNE_STORE=memory", "JAX_AUTOTUNE_CACHE=0"])
def test_a_memory_only_store_cannot_be_written_and_says_so_in_one_line(capsys, tmp_path, monkeypatch,
                                                                       command, setting):
    table_file = tmp_path / "t.json"
    table(tuners=[tuned_tuner(store_at(None))]).save(table_file)
    monkeypatch.setenv(*setting.split("="))
    code, out, err = run(capsys, command, *([str(table_file)] if command == "import" else ["--yes"]))
    assert code == 1 and out == ""
    assert err.splitlines()[0] == f"database: none ({setting}: memory only)"
    [reason] = [line for line in err.splitlines() if line.startswith("jax-autotune:")]
    assert reason == (f"jax-autotune: {command}: there is no store to write ({setting}: decisions "
                      f"are kept in memory only)")


def test_show_on_a_memory_only_store_lists_none_and_says_why(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", "memory")
    for command in (["show"], ["export", str(tmp_path / "t.json")]):
        code, out, err = run(capsys, *command)
        assert code == 0 and err.splitlines()[0] == "database: none (JAX_AUTOTUNE_STORE=memory: memory only)"
    code, out, _ = run(capsys, "show")
    assert out.strip() == ("no stored decisions: JAX_AUTOTUNE_STORE=memory keeps decisions in memory "
                           "only, so none outlive the process that tuned them")
    exported = json.loads((tmp_path / "t.json").read_text())["devices"]
    assert [e for device in exported.values() for e in device["entries"]] == []


@BOTH
def test_import_into_a_read_only_store_fails_and_writes_nothing(tuner, capsys, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    run(capsys, "export", str(path))
    run(capsys, "clear", "--yes")
    tuner.store.close()  # a new process: it opens the database again
    fresh = make_tuner(open_store(config.store_choice()))
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), fresh)
    before = snapshot(fresh.store.path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode & os.W_OK else real(p, mode, **kw))
    code, out, err = run(capsys, "import", str(path))
    assert code == 1 and "installed" not in out
    assert "read-only" in err.splitlines()[-1] and snapshot(fresh.store.path) == before


@BOTH
def test_every_table_command_names_its_database_first(tuner, capsys, tmp_path):
    for argv in (["show"], ["explain", key_id(PROBLEM_A.key())], ["export", str(tmp_path / "t.json")],
                 ["import", str(tmp_path / "t.json")], ["clear", "--yes"]):
        code, _, err = run(capsys, *argv)
        assert code == 0 and err.splitlines()[0] == f"database: {open_store(config.store_choice()).path}", argv


def test_help_texts_have_no_double_backticks():
    parser = cli.build_parser()
    texts = [parser.format_help()]
    texts += [sub.format_help() for action in parser._subparsers._group_actions
              for sub in action.choices.values()]
    assert len(texts) == 8 and all("``" not in text for text in texts)
    assert any("--cache-dir" in text and "nothing else in it is touched" in text for text in texts)


def test_show_into_a_closed_pipe_ends_quietly(tuner, tmp_path):
    env = {**os.environ, "JAX_AUTOTUNE_CACHE_DIR": str(open_store(config.store_choice()).path.parent)}
    with subprocess.Popen([sys.executable, "-P", "-m", "jax_autotune", "show"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # the reader is gone before anything is written (`show | head -0`)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"BrokenPipeError" not in err and b"Traceback" not in err


def test_import_of_a_fifo_fails_at_once_with_one_line(tmp_path):
    os.mkfifo(tmp_path / "table.json")
    done = subprocess.run([sys.executable, "-m", "jax_autotune", "import", str(tmp_path / "table.json")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=str(tmp_path / "cache")))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"jax-autotune: import: {tmp_path / 'table.json'}: not a regular file (a FIFO)")


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


def test_clear_deletes_the_attention_decisions_and_program_checks_with_the_decisions(tuner, capsys):
    from test_table import ATTENTION_KEY, with_attention_and_program
    from jax_autotune.tuning import attention_decisions, programs
    with_attention_and_program(tuner)
    other = throughput_namespace(tuner.device.fingerprint)
    probes = len(tuner.store.entries(other))
    code, out, _ = run(capsys, "clear", "--yes")
    assert code == 0
    assert attention_decisions.known(tuner, ATTENTION_KEY, "impls-1") is None
    assert programs.record(tuner, "program-1") is None
    assert [e.namespace for e in tuner.store.entries() if not e.namespace.startswith("throughput/")] == []
    assert len(tuner.store.entries(other)) == probes  # the probes stay


@pytest.mark.parametrize("command", [["show"], ["clear", "--yes"]])
def test_a_bad_setting_is_one_line_naming_it_not_a_traceback(command, monkeypatch, capsys):
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", "/tmp/somewhere/default.db")
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith("jax-autotune: error: JAX_AUTOTUNE_STORE: expected one of sqlite")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
