"""The directory store's own rules: its layout, rows written whole, torn and foreign files
skipped with one warning, claim files, a read-only folder. What it shares with SQLite
runs in tests/test_store.py and tests/test_consensus.py against both."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from jax_autotune import config
from jax_autotune.tuning import directory_store
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.store import DirectoryStore, JaxAutotuneStoreWarning, open_store
from test_consensus import run_in_threads
from test_store import deny_writes, served_read_only_by_nobody, snapshot, store_warnings

NS = "autotune/0.1.0/0.10.2/cpu-test/matmul"
TP = "throughput/0.1.0/cpu-test"
HASH = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def store(tmp_path):
    return DirectoryStore(tmp_path / "default.d")


def row_file(store: DirectoryStore, namespace: str, key: str, checksum: str) -> Path:
    return store._paths(namespace, key, checksum)[1]


# ---------------------------------------------------------------- layout

def test_each_row_is_one_json_file_named_by_hashes_in_a_folder_per_namespace(store):
    hostile = "../../etc/passwd m=1 n=2"
    store.put(NS, hostile, "c1", {"winner": "xla_dot"})
    store.put(NS, "k2", "c1", {"winner": "fast"})
    store.put(TP, "peaks", "probe-v1", {"flops": 1.0})
    folders = sorted(store.path.iterdir())
    assert len(folders) == 2 and all(HASH.fullmatch(f.name) and f.is_dir() for f in folders)
    files = sorted(p for p in store.path.rglob("*") if p.is_file())
    assert len(files) == 3
    assert all(HASH.fullmatch(p.stem) and p.suffix == ".json" for p in files)  # no user text in a name
    record = json.loads(row_file(store, NS, hostile, "c1").read_text())
    assert record["namespace"] == NS and record["key"] == hostile and record["checksum"] == "c1"
    assert record["value"] == {"winner": "xla_dot"} and isinstance(record["updated"], float)
    assert [e.key for e in store.entries(NS)] == sorted([hostile, "k2"])


def test_the_directory_store_keeps_no_sqlite_file_and_the_tuner_reads_it_back(fresh_tuning, monkeypatch):
    from test_table import PROBLEM_A, make_tuner
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", "directory")
    tuner = make_tuner(open_store(config.store_choice()))
    assert tuner.select(PROBLEM_A).source == "tuned"
    assert sorted(p.name for p in fresh_tuning.iterdir()) == ["default.d"]
    assert not any(p.suffix == ".db" or p.name.endswith(("-wal", "-shm")) for p in fresh_tuning.rglob("*"))
    again = make_tuner(open_store(config.store_choice()))  # a new process
    decision = again.select(PROBLEM_A)
    assert decision.source == "store" and decision.winner == "fast"


def test_a_changed_store_setting_switches_the_tuner_to_that_store(fresh_tuning, monkeypatch):
    from jax_autotune.registry import tuner_for
    tuner = tuner_for("cpu")
    assert tuner.store.path == fresh_tuning / "default.db"
    config.update("store", "directory")
    assert tuner_for("cpu") is tuner and tuner.store.path == fresh_tuning / "default.d"
    config.update("store", "memory")
    assert tuner_for("cpu").store.path is None


# ---------------------------------------------------------------- torn and foreign files

def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _another_key_inside(path: Path) -> None:  # a row copied under another row's name
    data = json.loads(path.read_text())
    data["key"] = "another key"
    path.write_text(json.dumps(data))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _huge(path: Path) -> None:
    path.write_bytes(b'{"pad": "' + b"x" * 5000 + b'"}')


DAMAGE = {
    "truncated": _truncated,
    "empty": lambda path: path.write_bytes(b""),
    "not json": lambda path: path.write_bytes(b"\x00\xff not json"),
    "a json list": lambda path: path.write_text("[1, 2]"),
    "no value": lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "value": 3})),
    "another key inside": _another_key_inside,
    "a fifo": _fifo,
    "a folder": _folder,
    "over the cap": _huge,
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_torn_or_foreign_row_file_is_skipped_with_one_warning(store, monkeypatch, damage):
    monkeypatch.setitem(directory_store.LIMITS, "bytes of text", 4096)
    store.put(NS, "k", "c", {"winner": "xla_dot"})
    store.put(NS, "good", "c", {"winner": "fast"})
    DAMAGE[damage](row_file(store, NS, "k", "c"))
    with pytest.warns(JaxAutotuneStoreWarning, match="skipping") as seen:
        assert store.get(NS, "k", "c") is None
        assert [(e.key, e.value) for e in store.entries(NS)] == [("good", {"winner": "fast"})]
        assert store.namespaces() == [NS]
        assert store.claim(NS, "k", "c", "me:1:x", 5) == ("claimed", None)
    assert len(store_warnings(seen)) == 1 and store.available
    if damage not in ("a fifo", "a folder"):  # a regular file: replaced by the next decision
        assert store.put_if_absent(NS, "k", "c", {"winner": "new"}) == ({"winner": "new"}, True)
        assert store.get(NS, "k", "c") == {"winner": "new"}


def test_a_row_moved_into_another_namespace_folder_is_not_read_there(store):
    store.put(NS, "k", "c", {"winner": "xla_dot"})
    store.put(TP, "peaks", "c", {"flops": 1.0})
    moved = row_file(store, NS, "k", "c")
    target = row_file(store, TP, "k", "c")
    moved.rename(target)
    with pytest.warns(JaxAutotuneStoreWarning, match="not the one its name stands for"):
        assert store.get(TP, "k", "c") is None
        assert [e.key for e in store.entries(TP)] == ["peaks"]


def test_foreign_names_are_skipped_with_one_warning_and_never_deleted(store):
    store.put(NS, "k", "c", {"winner": "xla_dot"})
    folder = row_file(store, NS, "k", "c").parent
    (folder / "notes.txt").write_text("mine")
    (store.path / "README").write_text("mine too")
    with pytest.warns(JaxAutotuneStoreWarning, match="a name this store does not write") as seen:
        assert [e.key for e in store.entries()] == ["k"]
        assert store.delete() == 1
    assert len(store_warnings(seen)) == 1
    assert (folder / "notes.txt").read_text() == "mine" and (store.path / "README").read_text() == "mine too"


def test_a_namespace_folder_this_process_may_not_list_is_skipped_with_one_warning(store, monkeypatch):
    store.put(NS, "k", "c", {"winner": "xla_dot"})
    store.put(TP, "peaks", "c", {"flops": 1.0})
    hidden = row_file(store, TP, "peaks", "c").parent
    real_listdir = os.listdir

    def listdir(path):
        if Path(path) == hidden:
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(directory_store.os, "listdir", listdir)
    with pytest.warns(JaxAutotuneStoreWarning, match="Permission denied") as seen:
        assert [e.namespace for e in store.entries()] == [NS] and store.namespaces() == [NS]
    assert len(store_warnings(seen)) == 1 and store.available
    assert store.get(TP, "peaks", "c") == {"flops": 1.0}  # a row named directly is still read


def test_a_decision_file_that_breaks_a_table_entrys_rules_is_skipped_and_retuned(fresh_tuning, monkeypatch):
    from test_table import PROBLEM_A, PROBLEM_B, make_tuner, tuned_tuner
    monkeypatch.setenv("JAX_AUTOTUNE_STORE", "directory")
    tuned = tuned_tuner(open_store(config.store_choice()))
    path = row_file(tuned.store, tuned.namespace, PROBLEM_A.key().canonical(), tuned.checksum)
    record = json.loads(path.read_text())
    record["value"]["results"][0]["score"] = "abc"
    path.write_text(json.dumps(record))
    tuner = make_tuner(open_store(config.store_choice()))
    with pytest.warns(JaxAutotuneStoreWarning, match="skipping a bad row in the tune store folder") as seen:
        assert [d.key for d in tuner.known.decisions()] == [PROBLEM_B.key()]
        assert tuner.select(PROBLEM_A, policy=Policy(mode="cached")).source == "fallback"
    assert len(store_warnings(seen)) == 1
    assert tuner.select(PROBLEM_A).source == "tuned"  # and the file replaced
    assert make_tuner(open_store(config.store_choice())).select(PROBLEM_A).source == "store"


def test_temporary_and_set_aside_files_are_skipped_quietly(store):
    store.put(NS, "k", "c", {"winner": "xla_dot"})
    folder = row_file(store, NS, "k", "c").parent
    (folder / f".{'1' * 32}.abc.tmp").write_bytes(b'{"half a wri')  # a writer killed midway
    (folder / f".{'2' * 32}.json.abc.aside").write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("error", JaxAutotuneStoreWarning)
        assert [e.key for e in store.entries()] == ["k"] and store.namespaces() == [NS]


# ---------------------------------------------------------------- claims and decisions

def test_a_claim_file_holds_its_owner_and_is_busy_for_others_until_released(store):
    assert store.claim(NS, "k", "c", "me:1:a", 30) == ("claimed", None)
    claim = store._paths(NS, "k", "c")[2]
    assert json.loads(claim.read_text())["owner"] == "me:1:a"
    assert store.claim(NS, "k", "c", "you:2:b", 30) == ("busy", "me:1:a")
    assert store.renew(NS, "k", "c", "you:2:b", 30) is False and store.renew(NS, "k", "c", "me:1:a", 30)
    store.release(NS, "k", "c", "you:2:b")  # not its claim: stays
    assert store.claim(NS, "k", "c", "you:2:b", 30) == ("busy", "me:1:a")
    store.release(NS, "k", "c", "me:1:a")
    assert not claim.exists() and store.claim(NS, "k", "c", "you:2:b", 30) == ("claimed", None)


def test_a_claim_file_that_cannot_be_read_is_taken_over(store):
    store.put(NS, "other", "c", {})
    claim = store._paths(NS, "k", "c")[2]
    claim.write_bytes(b"\x00 torn")
    assert store.claim(NS, "k", "c", "me:1:a", 30) == ("claimed", None)
    assert json.loads(claim.read_text())["owner"] == "me:1:a"


def test_a_lapsed_claim_is_taken_over_only_by_the_holder_of_its_takeover_file(store):
    assert store.claim(NS, "k", "c", "gone:1:a", lease_seconds=-1) == ("claimed", None)  # lapsed
    claim = store._paths(NS, "k", "c")[2]
    takeover = claim.with_suffix(".takeover")
    takeover.write_text(json.dumps({"owner": "taker:2:b", "expires": time.time() + 600}))
    assert store.claim(NS, "k", "c", "me:3:c", 30)[0] == "busy"  # another process is at it
    assert json.loads(claim.read_text())["owner"] == "gone:1:a"
    takeover.write_text(json.dumps({"owner": "taker:2:b", "expires": time.time() - 1}))  # it died
    assert store.claim(NS, "k", "c", "me:3:c", 30) == ("claimed", None)
    assert json.loads(claim.read_text())["owner"] == "me:3:c" and not takeover.exists()


def test_a_decision_stored_meanwhile_ends_a_claim(store):
    assert store.claim(NS, "k", "c", "me:1:a", 30) == ("claimed", None)
    assert store.put_if_absent(NS, "k", "c", {"winner": "a"}) == ({"winner": "a"}, True)
    assert not store._paths(NS, "k", "c")[2].exists()  # the claim goes with the decision
    assert store.claim(NS, "k", "c", "you:2:b", 30) == ("decided", {"winner": "a"})
    assert store.put_if_absent(NS, "k", "c", {"winner": "b"}) == ({"winner": "a"}, False)
    refused = store.put_if_absent(NS, "k", "c", {"winner": "b"}, keep=lambda v: v["winner"] != "a")
    assert refused == ({"winner": "b"}, True) and store.get(NS, "k", "c") == {"winner": "b"}


ROUNDS = [f"key-{i}" for i in range(5)]  # a race is run again on a new key: more chances to lose


def claims_at_once(folder: Path, key: str) -> list:
    return run_in_threads(16, lambda i: DirectoryStore(folder).claim(NS, key, "c", f"host:{i}:x",
                                                                     lease_seconds=60))


def test_of_many_stores_claiming_one_key_at_once_exactly_one_holds_it(tmp_path):
    for key in ROUNDS:
        results = claims_at_once(tmp_path / "default.d", key)
        assert sorted(state for state, _ in results) == ["busy"] * 15 + ["claimed"]
        holder = next(f"host:{i}:x" for i, (state, _) in enumerate(results) if state == "claimed")
        assert {value for state, value in results if state == "busy"} == {holder}


def test_of_many_stores_taking_over_one_lapsed_claim_at_once_exactly_one_holds_it(tmp_path):
    store = DirectoryStore(tmp_path / "default.d")
    for key in ROUNDS:
        assert store.claim(NS, key, "c", "gone:1:x", lease_seconds=-1) == ("claimed", None)  # lapsed
        results = claims_at_once(tmp_path / "default.d", key)
        assert sorted(state for state, _ in results) == ["busy"] * 15 + ["claimed"]


@pytest.mark.parametrize("before", ["nothing", "a damaged row"])
def test_of_many_stores_inserting_one_key_at_once_all_end_with_the_one_inserted(tmp_path, before):
    for key in ROUNDS:
        if before == "a damaged row":
            DirectoryStore(tmp_path / "default.d").put(NS, key, "c", {"winner": "unusable"})
        results = run_in_threads(16, lambda i: DirectoryStore(tmp_path / "default.d").put_if_absent(
            NS, key, "c", {"winner": f"kernel_{i}"}, keep=lambda value: value["winner"] != "unusable"))
        assert sum(inserted for _, inserted in results) == 1
        assert len({value["winner"] for value, _ in results}) == 1
        assert DirectoryStore(tmp_path / "default.d").get(NS, key, "c") == results[0][0]


# ---------------------------------------------------------------- a killed writer

_KILLED_WRITER = textwrap.dedent("""
    import sys
    from jax_autotune.tuning.directory_store import DirectoryStore
    store = DirectoryStore(sys.argv[1])
    for i in range(100_000):
        store.put("autotune/test/matmul", f"key-{i}", "c", {"i": i, "pad": str(i) * 20_000})
        print(i, flush=True)   # written whole: the parent may kill from here on
""")


@pytest.mark.slow
def test_a_writer_killed_midway_loses_no_row_it_had_written_and_leaves_no_torn_row(tmp_path):
    folder = tmp_path / "default.d"
    writer = subprocess.Popen([sys.executable, "-P", "-c", _KILLED_WRITER, str(folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        written = [int(writer.stdout.readline()) for _ in range(200)]
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=60)
        written += [int(line) for line in writer.stdout.read().split()]
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("error", JaxAutotuneStoreWarning)  # no torn file read, none warned of
        store = DirectoryStore(folder)
        entries = store.entries("autotune/test/matmul")
        for i in written:
            assert store.get("autotune/test/matmul", f"key-{i}", "c") == {"i": i, "pad": str(i) * 20_000}
    assert all(e.value == {"i": e.value["i"], "pad": str(e.value["i"]) * 20_000} and
               e.key == f"key-{e.value['i']}" for e in entries)
    assert {e.value["i"] for e in entries} >= set(written) and len(entries) <= len(written) + 1


class Killed(BaseException):
    """What the process sees of a kill: nothing after it runs."""


def test_a_write_that_dies_midway_leaves_the_row_as_it_was(store, monkeypatch):
    store.put(NS, "k", "c", {"winner": "old", "pad": "x" * 10_000})
    real_write = os.write

    def dies_after_half(fd, data):
        real_write(fd, bytes(data[:len(data) // 2]))
        raise Killed

    monkeypatch.setattr(directory_store.os, "write", dies_after_half)
    for write in (lambda: store.put(NS, "k", "c", {"winner": "new", "pad": "y" * 10_000}),
                  lambda: store.put_if_absent(NS, "k2", "c", {"winner": "new"}),
                  lambda: store.claim(NS, "k3", "c", "me:1:a", 5)):
        with pytest.raises(Killed):
            write()
    monkeypatch.setattr(directory_store.os, "write", real_write)
    with warnings.catch_warnings():
        warnings.simplefilter("error", JaxAutotuneStoreWarning)
        fresh = DirectoryStore(store.path)
        assert fresh.get(NS, "k", "c") == {"winner": "old", "pad": "x" * 10_000}
        assert fresh.get(NS, "k2", "c") is None and [e.key for e in fresh.entries()] == ["k"]
        assert fresh.claim(NS, "k3", "c", "you:2:b", 5) == ("claimed", None)


# ---------------------------------------------------------------- a read-only folder

def test_a_read_only_folder_is_read_writes_stay_in_memory_and_one_warning_says_so(tmp_path, monkeypatch):
    with DirectoryStore(tmp_path / "default.d") as writer:
        writer.put(NS, "k", "c", {"winner": "xla_dot"})
    folder = tmp_path / "default.d"
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = snapshot(folder)
    try:
        if os.access(folder, os.W_OK):
            deny_writes(monkeypatch)  # root passes chmod: what another user would see
        s = DirectoryStore(folder)
        with pytest.warns(JaxAutotuneStoreWarning, match="read-only for this process") as seen:
            assert s.get(NS, "k", "c") == {"winner": "xla_dot"}
            assert s.put(NS, "new", "c", {"winner": "new"}) is False
            assert s.claim(NS, "new", "c", "me:1:a", 5) == ("claimed", None)
            assert s.put_if_absent(NS, "new", "c", {"winner": "new"}) == ({"winner": "new"}, True)
            assert s.delete() == 0 and [e.key for e in s.entries()] == ["k"]
        assert len(store_warnings(seen)) == 1 and s.read_only and s.available
        assert "read-only" in s.check(write=True) and snapshot(folder) == before
    finally:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_a_write_the_filesystem_refuses_makes_the_folder_read_only_not_memory_only(tmp_path, monkeypatch):
    with DirectoryStore(tmp_path / "default.d") as writer:
        writer.put(NS, "k", "c", {"winner": "xla_dot"})
    real_open = os.open

    def read_only_mount(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(directory_store.os, "open", read_only_mount)
    s = DirectoryStore(tmp_path / "default.d")
    with pytest.warns(JaxAutotuneStoreWarning, match="read-only") as seen:
        assert s.put(NS, "new", "c", {}) is False
        assert s.get(NS, "k", "c") == {"winner": "xla_dot"}
    assert len(store_warnings(seen)) == 1 and s.read_only and s.available


@pytest.mark.slow
def test_a_read_only_directory_store_serves_a_process_of_an_unprivileged_user():
    def make_read_only(cache: Path):
        folder = cache / "default.d"
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        before = snapshot(folder)

        def unchanged():
            assert snapshot(folder) == before and sorted(p.name for p in cache.iterdir()) == ["default.d"]
        return unchanged

    served_read_only_by_nobody("directory", make_read_only)
