"""Tests for the persistent tune store (tuning/store.py and its backends): what every disk
backend must do runs against SQLite and the directory store alike (``disk_store``); the
rest is SQLite's own. The directory store's own tests: tests/test_directory_store.py."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from jax_autotune import config
from jax_autotune.tuning.namespaces import decision_namespace, throughput_namespace
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.store import (DirectoryStore, JaxAutotuneStoreWarning, MemoryStore,
                                       SqliteStore, Store, StoreEntry, open_store, store_at)

NS = "autotune/0.1.0/0.10.2/cpu-test/matmul"
NS2 = "autotune/0.1.0/0.10.2/gpu-test/matmul"
TP = "throughput/0.1.0/cpu-test"


@pytest.fixture
def clean_config():
    config.reset()
    yield config
    config.reset()


@pytest.fixture
def store(tmp_path):
    s = store_at(tmp_path / "cache" / "default.db")
    yield s
    s.close()


BACKENDS = ("sqlite", "directory")


def disk_store_at(backend: str, folder: Path):
    """The ``backend``'s store of environment ``default`` in ``folder``, as open_store makes it."""
    return SqliteStore(folder / "default.db") if backend == "sqlite" else DirectoryStore(folder / "default.d")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def disk_store(backend, tmp_path):
    s = disk_store_at(backend, tmp_path / "cache")
    yield s
    s.close()


def snapshot(path: Path) -> dict:
    """Every file under ``path`` (or ``path`` itself) and its bytes."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): p.read_bytes() for p in files}


def store_warnings(record) -> list:
    return [w for w in record if issubclass(w.category, JaxAutotuneStoreWarning)]


# -- basic behaviour ------------------------------------------------------------------


def test_a_put_value_round_trips_through_a_fresh_store(tmp_path, backend):
    value = {"winner": "xla_dot", "results": [{"name": "xla_dot", "us": [1.5, 1.25]}],
             "limit": float("inf")}
    s = disk_store_at(backend, tmp_path / "cache")
    assert not s.path.exists()  # nothing on disk before the first write
    assert s.put(NS, "key-1", "sum-1", value) is True
    s.close()
    assert s.path.exists()
    reopened = disk_store_at(backend, tmp_path / "cache")
    assert reopened.get(NS, "key-1", "sum-1") == value
    reopened.close()


def test_store_at_opens_sqlite_for_a_path_and_memory_for_none_and_every_backend_is_a_store(tmp_path):
    assert type(store_at(tmp_path / "default.db")) is SqliteStore
    assert type(store_at(None)) is MemoryStore
    for store in (store_at(None), SqliteStore(tmp_path / "a.db"), DirectoryStore(tmp_path / "a.d")):
        assert isinstance(store, Store)
    assert not isinstance(object(), Store)


def test_the_database_is_in_wal_mode(store):
    store.put(NS, "k", "c", {"x": 1})
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"


def test_a_different_checksum_misses(disk_store):
    disk_store.put(NS, "k", "c1", {"x": 1})
    assert disk_store.get(NS, "k", "c2") is None
    assert disk_store.get(NS, "k", "c1") == {"x": 1}


def test_put_replaces_the_earlier_value_and_its_time(disk_store):
    disk_store.put(NS, "k", "c", {"x": 1})
    first = disk_store.entries(NS)[0].updated
    time.sleep(0.01)
    disk_store.put(NS, "k", "c", {"x": 2})
    assert disk_store.get(NS, "k", "c") == {"x": 2}
    [entry] = disk_store.entries(NS)
    assert entry.value == {"x": 2} and entry.updated > first


def test_namespaces_are_isolated(disk_store):
    disk_store.put(NS, "k", "c", {"device": "cpu"})
    disk_store.put(NS2, "k", "c", {"device": "gpu"})
    assert disk_store.get(NS, "k", "c") == {"device": "cpu"}
    assert disk_store.get(NS2, "k", "c") == {"device": "gpu"}
    assert disk_store.get(TP, "k", "c") is None
    assert disk_store.namespaces() == sorted([NS, NS2])
    assert [e.value for e in disk_store.entries(NS2)] == [{"device": "gpu"}]


def test_entries_are_store_entries_in_key_order(disk_store):
    disk_store.put(NS, "b", "c", {"i": 2})
    disk_store.put(NS, "a", "c", {"i": 1})
    entries = disk_store.entries(NS)
    assert all(isinstance(e, StoreEntry) for e in entries)
    assert [(e.namespace, e.key, e.checksum, e.value) for e in entries] == [
        (NS, "a", "c", {"i": 1}), (NS, "b", "c", {"i": 2})]


def test_delete_by_namespace_removes_only_that_namespace(disk_store):
    disk_store.put(NS, "k1", "c", {})
    disk_store.put(NS, "k2", "c", {})
    disk_store.put(NS2, "k1", "c", {})
    assert disk_store.delete(NS) == 2
    assert disk_store.get(NS, "k1", "c") is None
    assert disk_store.get(NS2, "k1", "c") == {}
    assert disk_store.namespaces() == [NS2]


def test_delete_by_prefix_removes_every_matching_namespace(disk_store):
    disk_store.put(NS, "k", "c", {})
    disk_store.put(NS2, "k", "c", {})
    disk_store.put(TP, "peaks", "c", {})
    disk_store.put("autotuneX/other", "k", "c", {})
    assert disk_store.delete(namespace_prefix="autotune/") == 2
    assert disk_store.namespaces() == ["autotuneX/other", TP]
    assert len(disk_store.entries(namespace_prefix="throughput/")) == 1


def test_prefix_treats_sql_wildcards_literally(disk_store):
    disk_store.put("a_b/x", "k", "c", {})
    disk_store.put("aXb/x", "k", "c", {})
    assert [e.namespace for e in disk_store.entries(namespace_prefix="a_b")] == ["a_b/x"]
    assert disk_store.delete(namespace_prefix="a%") == 0
    assert len(disk_store.entries()) == 2


@pytest.mark.parametrize("backend", [*BACKENDS, "memory"])
def test_delete_with_namespace_and_prefix_is_an_error(backend, tmp_path):
    store = MemoryStore() if backend == "memory" else disk_store_at(backend, tmp_path)
    with pytest.raises(ValueError):
        store.delete(NS, namespace_prefix="autotune/")
    with pytest.raises(ValueError):
        store.entries(NS, namespace_prefix="autotune/")


def test_reads_and_deletes_on_a_missing_file_do_not_create_it(tmp_path, backend):
    s = disk_store_at(backend, tmp_path / "nothing")
    assert s.get(NS, "k", "c") is None
    assert s.entries() == [] and s.namespaces() == [] and s.delete() == 0
    assert s.delete_namespaces([]) == 0 and s.check() == ""
    assert not (tmp_path / "nothing").exists()
    assert s.available


@pytest.mark.parametrize("backend", [*BACKENDS, "memory"])
def test_a_value_that_is_not_a_json_dict_is_rejected(backend, tmp_path):
    store = MemoryStore() if backend == "memory" else disk_store_at(backend, tmp_path)
    for value in (["not", "a", "dict"], {"x": object()}):
        with pytest.raises(TypeError):
            store.put(NS, "k", "c", value)
        with pytest.raises(TypeError):
            store.put_if_absent(NS, "k", "c", value)
    assert store.get(NS, "k", "c") is None and store.entries() == []


def test_a_memory_only_store_drops_writes(recwarn):
    s = store_at(None)
    s.put(NS, "k", "c", {"x": 1})
    assert s.get(NS, "k", "c") is None
    assert s.entries() == [] and s.namespaces() == [] and s.delete() == 0
    assert s.path is None and s.available is False
    assert store_warnings(recwarn) == []


def test_namespace_helpers_carry_versions_and_fingerprint():
    import jax

    import jax_autotune
    assert decision_namespace("cuda-H200") == (
        f"autotune/{jax_autotune.__version__}/{jax.__version__}/cuda-H200/matmul")
    assert throughput_namespace("cuda-H200") == f"throughput/{jax_autotune.__version__}/cuda-H200"
    with pytest.raises(ValueError):
        decision_namespace("a/b")


# -- configuration ----------------------------------------------------------------------


def test_open_store_is_memory_only_when_the_cache_is_off(clean_config, tmp_path):
    config.update("cache_dir", tmp_path)
    config.update("cache", False)
    s = open_store(config.store_choice())
    s.put(NS, "k", "c", {"x": 1})
    assert s.path is None and not s.available
    assert list(tmp_path.iterdir()) == []


def test_open_store_uses_cache_dir_and_environment(clean_config, tmp_path):
    config.update("cache_dir", tmp_path / "dir")
    config.update("environment", "bench-1")
    s = open_store(config.store_choice())
    assert s.path == tmp_path / "dir" / "bench-1.db"
    s.put(NS, "k", "c", {"x": 1})
    s.close()
    assert (tmp_path / "dir" / "bench-1.db").is_file()
    assert store_at(tmp_path / "dir" / "bench-1.db").get(NS, "k", "c") == {"x": 1}


@pytest.mark.parametrize("value, kind, path", [("sqlite", SqliteStore, "bench-1.db"),
                                               ("directory", DirectoryStore, "bench-1.d"),
                                               ("memory", MemoryStore, None)])
def test_open_store_opens_the_backend_the_store_setting_names(clean_config, tmp_path, monkeypatch,
                                                              value, kind, path):
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", value)
    config.update("cache_dir", tmp_path / "dir")
    config.update("environment", "bench-1")
    s = open_store(config.store_choice())
    assert type(s) is kind and s.path == (path and tmp_path / "dir" / path)
    s.put(NS, "k", "c", {"x": 1})
    assert s.get(NS, "k", "c") == (None if path is None else {"x": 1})
    made = {p.name.removesuffix("-wal").removesuffix("-shm") for p in (tmp_path / "dir").glob("*")}
    assert made == ({path} if path else set())
    config.update("cache", False)  # cache = 0 is memory only, whatever the backend
    assert type(open_store(config.store_choice())) is MemoryStore and "cache = 0" in open_store(config.store_choice()).check()


def test_a_store_setting_that_is_no_backend_is_a_config_error(clean_config, monkeypatch):
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", "nfs")
    with pytest.raises(config.ConfigError, match="JAX_AUTOTUNE_STORE: expected one of sqlite, directory, memory"):
        open_store(config.store_choice())


def test_open_store_defaults_to_the_default_environment(clean_config, tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_AUTOTUNE_ENVIRONMENT", raising=False)
    monkeypatch.delenv("JAX_AUTOTUNE_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)  # no config file above
    config.update("cache_dir", tmp_path)
    assert open_store(config.store_choice()).path == tmp_path / "default.db"


# -- concurrency ------------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys, time, os
    from jax_autotune.tuning.store import DirectoryStore, SqliteStore
    path, worker, go = sys.argv[1], sys.argv[2], sys.argv[3]
    deadline = time.time() + 10
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.005)
    s = DirectoryStore(path) if path.endswith(".d") else SqliteStore(path)
    for i in range(50):
        s.put("autotune/test/matmul", f"{worker}-{i}", "c", {"worker": worker, "i": i})
    assert s.available, "store fell back to memory"
""")


def test_two_processes_writing_at_once_keep_every_row(tmp_path, backend):
    path = disk_store_at(backend, tmp_path / "shared").path
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    procs = [subprocess.Popen([sys.executable, "-P", "-c", _WRITER, str(path), w, str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in ("p0", "p1")]
    time.sleep(0.3)
    go.touch()  # both start writing together (the first also races to create the file)
    for p in procs:
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    s = disk_store_at(backend, tmp_path / "shared")
    entries = s.entries("autotune/test/matmul")
    assert len(entries) == 100
    assert {(e.value["worker"], e.value["i"]) for e in entries} == {
        (w, i) for w in ("p0", "p1") for i in range(50)}
    assert all(e.key == f"{e.value['worker']}-{e.value['i']}" for e in entries)


def test_many_threads_writing_at_once_keep_every_row(tmp_path, backend):
    s = disk_store_at(backend, tmp_path)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(25):
                s.put(NS, f"{t}-{i}", "c", {"t": t, "i": i})
                assert s.get(NS, f"{t}-{i}", "c") == {"t": t, "i": i}
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    with warnings.catch_warnings():
        warnings.simplefilter("error", JaxAutotuneStoreWarning)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert s.available
    assert len(s.entries(NS)) == 200
    # A second store on the same file (another connection) sees them all too.
    assert len(disk_store_at(backend, tmp_path).entries(NS)) == 200


# -- failures: warn once, then memory-only ----------------------------------------------


def test_an_unwritable_directory_means_memory_only_with_one_warning(tmp_path, recwarn, backend):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: chmod does not make the directory unwritable")
        s = disk_store_at(backend, locked / "sub")
        s.put(NS, "k", "c", {"x": 1})
        s.put(NS, "k2", "c", {"x": 2})
        assert s.get(NS, "k", "c") is None
        assert s.entries() == []
        assert not s.available
        [w] = store_warnings(recwarn)
        assert str(locked) in str(w.message) and "memory" in str(w.message)
    finally:
        locked.chmod(0o700)


def test_a_directory_that_cannot_be_created_means_memory_only_with_one_warning(tmp_path, backend):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    s = disk_store_at(backend, blocker)  # works as root too: mkdir under a file fails
    with pytest.warns(JaxAutotuneStoreWarning) as record:
        s.put(NS, "k", "c", {"x": 1})
        s.put(NS, "k2", "c", {"x": 2})
        assert s.get(NS, "k", "c") is None
        assert s.namespaces() == [] and s.delete() == 0
    assert len(store_warnings(record)) == 1
    assert str(blocker) in str(record[0].message)
    assert not s.available and s.path.parent == blocker
    assert s.put(NS, "k", "c", {"x": 1}) is False and s.claim(NS, "k", "c", "o", 5) == ("claimed", None)


def test_a_corrupt_file_means_memory_only_with_one_warning(tmp_path):
    path = tmp_path / "default.db"
    garbage = b"this is not an sqlite database\x00\xff" * 200
    path.write_bytes(garbage)
    s = store_at(path)
    with pytest.warns(JaxAutotuneStoreWarning) as record:
        assert s.get(NS, "k", "c") is None
        s.put(NS, "k", "c", {"x": 1})
        assert s.get(NS, "k", "c") is None
        assert s.entries() == []
    assert len(store_warnings(record)) == 1
    message = str(record[0].message)
    assert str(path) in message and "not a database" in message and "memory" in message
    assert not s.available
    assert path.read_bytes() == garbage  # the user's file is left alone


@pytest.mark.parametrize("fifo", ["default.db", "default.db-wal"])
def test_a_database_that_is_a_fifo_means_memory_only_and_never_waits(tmp_path, fifo):
    if fifo != "default.db":  # beside a real database
        with store_at(tmp_path / "default.db") as real:
            real.put(NS, "k", "c", {"x": 1})
    os.mkfifo(tmp_path / fifo)
    code = textwrap.dedent("""
        import sys, warnings
        from jax_autotune.tuning.store import store_at
        s = store_at(sys.argv[1])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            s.put("ns", "k", "c", {"x": 1})
            print(s.get("ns", "k", "c"), s.available, len(seen))
        print(s.check())
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "default.db")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.splitlines()
    assert first == "None False 1"
    assert second.endswith(f"{tmp_path / fifo}: not a regular file (a FIFO)")


def test_a_row_with_bad_json_is_skipped_with_one_warning(store):
    store.put(NS, "good", "c", {"x": 1})
    with sqlite3.connect(store.path) as raw:
        raw.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", (NS, "bad", "c", "{not json", 0.0))
        raw.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", (NS, "list", "c", "[1, 2]", 0.0))
    with pytest.warns(JaxAutotuneStoreWarning) as record:
        assert store.get(NS, "bad", "c") is None
        assert store.get(NS, "list", "c") is None
        assert [e.key for e in store.entries(NS)] == ["good"]
    assert len(store_warnings(record)) == 1
    assert "bad" in str(record[0].message)
    # A bad row does not turn the disk off.
    assert store.available
    store.put(NS, "bad", "c", {"fixed": True})
    assert store.get(NS, "bad", "c") == {"fixed": True}


@pytest.mark.parametrize("where, value", [(("results", 0, "score"), "abc"), (("problem", "m"), -3),
                                          (("key",), "m=1"), (("results", 0, "name"), 1)])
def test_a_decision_row_is_read_with_the_rules_of_a_table_entry(fresh_tuning, tmp_path, where, value):
    from test_cli_table import edit_row
    from test_table import PROBLEM_A, PROBLEM_B, make_tuner, tuned_tuner
    from jax_autotune.tables.install import table

    tuned = tuned_tuner(store_at(tmp_path / "default.db"))
    edit_row(tuned.store, tuned.namespace, PROBLEM_A.key().canonical(), where, value)
    tuner = make_tuner(store_at(tmp_path / "default.db"))  # a new process
    with pytest.warns(JaxAutotuneStoreWarning, match="skipping a bad row") as seen:
        assert [d.key for d in tuner.known.decisions()] == [PROBLEM_B.key()]
        assert [d.key for _, d in table(tuners=[tuner]).entries()] == [PROBLEM_B.key()]
        assert tuner.select(PROBLEM_A, policy=Policy(mode="cached")).source == "fallback"  # never the bad row
    assert len(store_warnings(seen)) == 1
    decision = tuner.select(PROBLEM_A)  # mode tune: tuned again, and the row replaced
    assert decision.source == "tuned" and decision.winner == "fast"
    assert make_tuner(store_at(tmp_path / "default.db")).select(PROBLEM_A).source == "store"


def test_values_are_stored_as_plain_json_text(store):
    store.put(NS, "k", "c", {"b": [1, 2.5], "a": "x"})
    with sqlite3.connect(store.path) as raw:
        [(text, kind)] = raw.execute("SELECT value, typeof(value) FROM entries").fetchall()
    assert kind == "text" and json.loads(text) == {"a": "x", "b": [1, 2.5]}


# -- read-only databases and bulk writes --------------------------------------------------


def deny_writes(monkeypatch):
    """What a process without write permission sees (root passes every permission check)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode & os.W_OK else real(path, mode, **kw))


def test_a_read_only_database_is_read_writes_are_dropped_and_one_warning_says_so(tmp_path, monkeypatch,
                                                                                 backend):
    with disk_store_at(backend, tmp_path) as writer:
        writer.put(NS, "k", "c", {"winner": "xla_dot"})
        path = writer.path
    before = snapshot(path)
    deny_writes(monkeypatch)
    s = disk_store_at(backend, tmp_path)
    with pytest.warns(JaxAutotuneStoreWarning, match="read-only") as record:
        assert s.get(NS, "k", "c") == {"winner": "xla_dot"}
        assert s.put(NS, "k2", "c", {"winner": "new"}) is False
        assert s.put_many([(NS, "k3", "c", {})]) is False and s.delete() == 0
        assert s.delete_namespaces([NS]) == 0
        assert [e.key for e in s.entries(NS)] == ["k"]
    assert len(store_warnings(record)) == 1
    assert s.available and s.read_only and "read-only" in s.check(write=True) and s.check() == ""
    s.close()
    assert snapshot(path) == before


def test_claims_on_a_read_only_database_keep_it_readable(tmp_path, monkeypatch, backend):
    with disk_store_at(backend, tmp_path) as writer:
        writer.put(NS, "k", "c", {"winner": "xla_dot"})
    deny_writes(monkeypatch)
    s = disk_store_at(backend, tmp_path)
    with pytest.warns(JaxAutotuneStoreWarning, match="read-only"):
        assert s.claim(NS, "missing", "c", "host:1:x", lease_seconds=5) == ("claimed", None)
        assert s.put_if_absent(NS, "missing", "c", {"winner": "new"}) == ({"winner": "new"}, True)
        assert s.renew(NS, "missing", "c", "host:1:x", lease_seconds=5) is False
        s.release(NS, "missing", "c", "host:1:x")
        assert s.get(NS, "missing", "c") is None
        assert s.get(NS, "k", "c") == {"winner": "xla_dot"}  # still read: not failed over to memory
    assert s.available and s.read_only
    s.close()


def test_put_many_is_one_transaction_a_failure_midway_leaves_no_row(tmp_path):
    path = tmp_path / "default.db"
    with store_at(path) as s:
        s.put(NS, "existing", "c", {"x": 0})
    with sqlite3.connect(path) as conn:  # the 501st insert fails, as a kill or a full disk would
        conn.execute("CREATE TRIGGER fail BEFORE INSERT ON entries WHEN NEW.key = 'k500' "
                     "BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    s = store_at(path)
    rows = [(NS, f"k{i}", "c", {"i": i}) for i in range(1000)]
    with pytest.warns(JaxAutotuneStoreWarning, match="disk full"):
        assert s.put_many(rows) is False
    s.close()
    with store_at(path) as check:
        assert [e.key for e in check.entries(NS)] == ["existing"]
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER fail")
    with store_at(path) as s:
        assert s.put_many(rows) is True and len(s.entries(NS)) == 1001


def test_check_names_why_a_store_cannot_be_used_without_warning(tmp_path, recwarn):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    assert "not a database" in store_at(garbage).check()
    assert "cache = 0" in store_at(None).check()
    assert store_at(tmp_path / "missing.db").check() == ""  # nothing stored yet: empty
    (tmp_path / "default.d").write_bytes(b"a file where the folder should be")
    assert "not a folder" in DirectoryStore(tmp_path / "default.d").check()
    assert DirectoryStore(tmp_path / "missing.d").check() == ""
    assert DirectoryStore(tmp_path / "made.d").check(write=True) == "" and (tmp_path / "made.d").is_dir()
    assert store_warnings(recwarn) == []


_SERVE_AS_NOBODY = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("always")
    import jax, jax.numpy as jnp, numpy as np
    import jax_autotune as jat
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 16)), jnp.float32)
    stored = jax.jit(jat.matmul)(x, x)                  # tuned by the owner: in the store
    before = jat.stats()
    if sys.argv[1:] == ["owner"]:
        sys.exit(0)
    new = jax.jit(jat.matmul)(x[:, :12], x[:12, :8])   # a new key: tuned, kept in memory
    np.testing.assert_allclose(stored, np.asarray(x) @ np.asarray(x), rtol=1e-4, atol=1e-5)
    print(json.dumps({"before": before, "after": jat.stats()}))
""")


def served_read_only_by_nobody(backend: str, make_read_only) -> None:
    """An owner tunes a key into a new store of ``backend``; ``make_read_only(cache)`` makes
    it read-only and returns a check that it is unchanged; then user nobody's process reads
    the stored key, tunes a new one in memory and warns once that the store is read-only."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the serving process as user nobody")
    # a folder user nobody can traverse (pytest's tmp folders are private to root)
    shared = Path(tempfile.mkdtemp(prefix="jax_autotune_ro_"))
    try:
        cache = shared / "cache"
        env = {**os.environ, "JAX_AUTOTUNE_CACHE_DIR": str(cache), "JAX_AUTOTUNE_STORE": backend,
               "JAX_AUTOTUNE_MODE": "tune", "JAX_AUTOTUNE_BUDGET_SECONDS": "2"}
        owner = subprocess.run([sys.executable, "-P", "-c", _SERVE_AS_NOBODY, "owner"], env=env,
                               capture_output=True, text=True, timeout=300)
        assert owner.returncode == 0, owner.stderr
        unchanged = make_read_only(cache)
        cache.chmod(0o555)
        shared.chmod(0o755)
        nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        served = subprocess.run([*nobody, sys.executable, "-P", "-c", _SERVE_AS_NOBODY],
                                env={**env, "HOME": str(shared)}, capture_output=True, text=True,
                                timeout=300, cwd=shared)
        assert served.returncode == 0, served.stderr
        counts = json.loads(served.stdout.strip().splitlines()[-1])
        assert (counts["before"]["store_hits"], counts["before"]["tuned"]) == (1, 0)
        assert counts["after"]["tuned"] == 1  # the new key, in memory
        assert served.stderr.count("is read-only for this process") == 1
        unchanged()
    finally:
        for path in [shared, *shared.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(shared)


@pytest.mark.slow
def test_a_read_only_store_serves_a_process_of_an_unprivileged_user():
    def make_read_only(cache: Path):
        database = cache / "default.db"
        with store_at(database) as s:  # checkpoint the WAL: one file, as deployed
            s.entries()
        for leftover in cache.glob("default.db-*"):
            leftover.unlink()
        before = database.read_bytes()
        database.chmod(0o444)

        def unchanged():
            assert database.read_bytes() == before
            assert sorted(p.name for p in cache.iterdir()) == ["default.db"]
        return unchanged

    served_read_only_by_nobody("sqlite", make_read_only)


class _FailingSecondDelete:
    """A connection stand-in: the second DELETE fails as a full disk would."""

    def __init__(self, conn):
        self.conn, self.deletes = conn, 0

    def execute(self, sql, *args):
        if sql.startswith("DELETE"):
            self.deletes += 1
            if self.deletes == 2:
                raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)


def test_deleting_several_namespaces_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "tuned.db"
    store = store_at(path)
    for ns in ("autotune/a/matmul", "autotune/b/matmul", "autotune/c/matmul"):
        store.put(ns, "k", "c", {"x": 1})
    real = store._connection
    monkeypatch.setattr(store, "_connection", lambda create: _FailingSecondDelete(real(create)))
    with pytest.warns(JaxAutotuneStoreWarning, match="disk is full"):
        assert store.delete_namespaces(["autotune/a/matmul", "autotune/b/matmul"]) == 0
    again = store_at(path)
    assert sorted(again.namespaces()) == ["autotune/a/matmul", "autotune/b/matmul", "autotune/c/matmul"]
    assert again.delete_namespaces(["autotune/a/matmul", "autotune/b/matmul", "autotune/a/matmul"]) == 2
    assert again.namespaces() == ["autotune/c/matmul"]
