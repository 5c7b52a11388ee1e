"""One decision per key: in a jax.distributed job (the job's key-value store) and among
processes sharing one store (claims with leases), with fakes for the rules and real
processes for the whole path. Every subprocess is bounded by a timeout."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from jax_autotune.key import MatmulKey
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning.consensus import (HostAgreement, Job, JaxAutotuneConsensusWarning, JobAgreement,
                                           Settled)
from jax_autotune.tuning.decision import Decision
from jax_autotune.tuning.store import DirectoryStore, SqliteStore

HERE = Path(__file__).resolve().parent
PROBLEM = MatmulProblem(1, 16, 16, 16, "float32", "float32", "float32")
KEY: MatmulKey = PROBLEM.key()


def decision(winner, source="tuned"):
    return Decision(key=KEY, problem=PROBLEM, winner=winner, source=source)


def fallback(reason):
    return Decision(key=KEY, problem=PROBLEM, winner="xla_dot", source="fallback", reason=reason)


def agreed(agreement, propose, wait_seconds, key="k"):
    """The decision ``agreement`` ends with, as the tuner reaches it: another process's, or
    this one's (``propose()`` on its turn, XLA's dot after the wait), published."""
    with agreement.turn(key, wait_seconds) as turn:
        if turn.settled in (Settled.STORED, Settled.ADOPTED):
            return Decision.from_json(turn.value), turn.settled
        mine = propose() if turn.settled is None else fallback(turn.why)
        value, settled = agreement.publish(turn, mine.to_json(), lasting=mine.source == "tuned")
    return Decision.from_json(value), settled


def in_job(kv, index, count, propose, wait_seconds):
    return agreed(JobAgreement(Job(kv, index, count), "cpu", "c"), propose, wait_seconds)


def on_host(store, propose, lease_seconds, wait_seconds):
    return agreed(HostAgreement(store, "ns", "c", lease_seconds), propose, wait_seconds)


class FakeKV:
    """The job's key-value store as JAX's client behaves: NOT_FOUND, ALREADY_EXISTS and
    DEADLINE_EXCEEDED are errors whose message starts with the code."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def key_value_try_get(self, key):
        with self.changed:
            if key not in self.values:
                raise RuntimeError(f"NOT_FOUND: {key}")
            return self.values[key]

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.changed:
            if key in self.values and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: {key}")
            self.values[key] = value
            self.changed.notify_all()

    def key_value_increment(self, key, amount):
        with self.changed:
            self.values[key] = str(int(self.values.get(key, "0")) + amount)
            self.changed.notify_all()
            return int(self.values[key])

    def blocking_key_value_get(self, key, timeout_ms):
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, timeout_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self.values[key]


def run_in_threads(count, target):
    """``target(i)`` in ``count`` threads started together; their results."""
    results, barrier = [None] * count, threading.Barrier(count)

    def run(i):
        barrier.wait()
        results[i] = target(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a thread did not finish within 60 s"
    return results


# ---------------------------------------------------------------- the job's rules

def test_in_a_job_one_process_tunes_and_every_process_adopts_its_winner():
    kv, tunings = FakeKV(), []

    def process(i):
        def tune():
            tunings.append(i)
            time.sleep(0.05)  # the others are waiting meanwhile
            return decision(f"kernel_of_{i}")
        return in_job(kv, i, 4, tune, wait_seconds=30)

    results = run_in_threads(4, process)
    assert len(tunings) == 1
    assert {d.winner for d, _ in results} == {f"kernel_of_{tunings[0]}"}
    assert sorted(how for _, how in results) == ["adopted"] * 3 + ["proposed"]


def test_in_a_job_a_stored_decision_is_what_the_claimer_proposes():
    kv = FakeKV()
    first, how = in_job(kv, 0, 2, lambda: decision("stored_kernel", "store"), wait_seconds=5)
    second, how_second = in_job(kv, 1, 2, lambda: decision("other"), 5)
    assert (first.winner, how) == ("stored_kernel", "proposed")
    assert (second.winner, how_second) == ("stored_kernel", "adopted")


def test_in_a_job_a_claimer_too_slow_adopts_the_waiters_xla_dot():
    kv, release = FakeKV(), threading.Event()

    def slow_tune():
        release.wait(30)
        return decision("late_kernel")

    claimer = threading.Thread(target=lambda: results.append(
        in_job(kv, 0, 2, slow_tune, wait_seconds=30)))
    results = []
    claimer.start()
    with kv.changed:  # the claimer holds the key's claim
        assert kv.changed.wait_for(lambda: any(k.endswith("/claim") for k in kv.values), 30)
    with pytest.warns(JaxAutotuneConsensusWarning, match="no decision"):
        waiter, how = in_job(kv, 1, 2, slow_tune, wait_seconds=0.1)
    assert (waiter.winner, how) == ("xla_dot", "fallback")
    release.set()
    claimer.join(30)
    late, late_how = results[0]
    assert (late.winner, late_how) == ("xla_dot", "adopted")  # same program in every process


# ---------------------------------------------------------------- one host, one store

@pytest.fixture(params=["sqlite", "directory"])
def open_shared(request, tmp_path):
    """Opens the one store the test's processes share, of each disk backend: a new handle
    per call, as another process would have."""
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "shared.db")
    return lambda: DirectoryStore(tmp_path / "shared.d")


def test_on_one_host_one_thread_tunes_and_the_others_adopt(open_shared):
    tunings = []

    def process(i):
        store = open_shared()

        def tune():
            tunings.append(i)
            time.sleep(0.1)
            return decision(f"kernel_of_{i}")
        try:
            return on_host(store, tune, lease_seconds=5, wait_seconds=30)
        finally:
            store.close()

    results = run_in_threads(4, process)
    assert len(tunings) == 1
    assert {d.winner for d, _ in results} == {f"kernel_of_{tunings[0]}"}
    assert sorted(how for _, how in results) == ["adopted"] * 3 + ["tuned"]


def test_a_stored_decision_is_never_replaced_by_a_concurrent_tuning(open_shared):
    store = open_shared()

    def tune():  # another process stores its decision while this one tunes
        store.put("ns", "k", "c", decision("first_kernel").to_json())
        return decision("second_kernel")

    result, how = on_host(store, tune, lease_seconds=5, wait_seconds=5)
    assert (result.winner, how) == ("first_kernel", "adopted")
    assert store.get("ns", "k", "c")["winner"] == "first_kernel"


def test_a_claim_of_a_dead_process_is_taken_over_at_once(open_shared):
    store = open_shared()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    assert store.claim("ns", "k", "c", f"{socket.gethostname()}:{dead.pid}:x", lease_seconds=600)[0] == "claimed"
    # waiting for the 600 s lease would end at wait_seconds with XLA's dot and a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", JaxAutotuneConsensusWarning)
        result, how = on_host(store, lambda: decision("mine"),
                                     lease_seconds=600, wait_seconds=1)
    assert (result.winner, how) == ("mine", "tuned")


def test_a_lapsed_lease_of_another_host_is_taken_over(open_shared):
    store = open_shared()
    assert store.claim("ns", "k", "c", "elsewhere:1:x", lease_seconds=0.3)[0] == "claimed"
    result, how = on_host(store, lambda: decision("mine"),
                                 lease_seconds=5, wait_seconds=30)
    assert (result.winner, how) == ("mine", "tuned")


def test_a_claim_held_past_the_wait_gives_xla_dot_without_storing_it(open_shared):
    store = open_shared()
    assert store.claim("ns", "k", "c", "elsewhere:1:x", lease_seconds=600)[0] == "claimed"
    with pytest.warns(JaxAutotuneConsensusWarning, match="holds the tuning"):
        result, how = on_host(store, lambda: decision("mine"),
                                     lease_seconds=5, wait_seconds=0.2)
    assert (result.winner, how) == ("xla_dot", "fallback")
    assert store.get("ns", "k", "c") is None


def test_a_failed_tuning_is_not_stored_and_its_claim_is_released(open_shared):
    store = open_shared()
    result, how = on_host(store, lambda: fallback("tuning failed"), lease_seconds=600, wait_seconds=1)
    assert (result.winner, how) == ("xla_dot", "tuned")
    assert store.get("ns", "k", "c") is None
    assert store.claim("ns", "k", "c", "another:1:x", lease_seconds=5)[0] == "claimed"  # free at once


def test_a_turn_that_raises_releases_its_claim(open_shared):
    store, agreement = open_shared(), HostAgreement(open_shared(), "ns", "c", lease_seconds=600)
    with pytest.raises(KeyboardInterrupt):
        with agreement.turn("k", wait_seconds=1) as turn:
            assert turn.settled is None and store.claim("ns", "k", "c", "another:1:x", 5)[0] == "busy"
            raise KeyboardInterrupt
    assert store.claim("ns", "k", "c", "another:1:x", lease_seconds=5)[0] == "claimed"


def test_a_value_the_store_may_not_keep_is_decided_again(open_shared):
    store = open_shared()
    store.put("ns", "k", "c", {"winner": "gone_kernel"})
    agreement = HostAgreement(store, "ns", "c", lease_seconds=5, usable=lambda value: value["winner"] != "gone_kernel")
    result, how = agreed(agreement, lambda: decision("mine"), wait_seconds=5)
    assert (result.winner, how) == ("mine", "tuned")
    assert store.get("ns", "k", "c")["winner"] == "mine"


# ---------------------------------------------------------------- real processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(tmp_path, scenario, count, kill=None, **env):
    """Start ``count`` workers; ``kill``: the index to SIGKILL once it holds a claim."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_AUTOTUNE_", "XLA_FLAGS"))}
    environment.update(JAX_AUTOTUNE_CACHE_DIR=str(tmp_path / "store"), JAX_PLATFORMS="cpu",
                       JAX_AUTOTUNE_COMPILATION_CACHE="0", **env)
    procs = [subprocess.Popen([sys.executable, "-P", str(HERE / "consensus_worker.py"), scenario,
                               str(i), str(count), str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
             for i in range(count)]
    try:
        if kill is not None:
            deadline = time.time() + 120
            while not (tmp_path / "claimed").exists() and time.time() < deadline:
                time.sleep(0.05)
            procs[kill].kill()
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = {}
    for i, (out, err) in enumerate(outputs):
        if i == kill:
            continue
        assert procs[i].returncode == 0, err[-3000:]
        results[i] = json.loads(out.strip().splitlines()[-1])
    return results


def assert_one_decision_per_key(results, keys):
    winners = {key: {r["keys"][key]["winner"] for r in results.values()} for key in keys}
    assert all(len(w) == 1 for w in winners.values()), winners
    assert sum(r["stats"]["tuned"] for r in results.values()) <= len(keys)  # each key tuned once


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 4])
def test_a_jax_distributed_job_agrees_on_every_key_and_tunes_each_once(tmp_path, count):
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    results = run_processes(tmp_path, "job", count)
    keys = set(results[0]["keys"])
    assert len(keys) == 3 and all(set(r["keys"]) == keys for r in results.values())
    assert_one_decision_per_key(results, keys)
    for key in keys:  # one process tuned it, every other adopted that decision
        sources = sorted(r["keys"][key]["source"] for r in results.values())
        assert sources == ["adopted"] * (count - 1) + ["tuned"], (key, sources)
    assert sum(r["stats"]["tuned"] for r in results.values()) == len(keys)


@pytest.mark.slow
def test_a_slow_claimer_is_waited_for_and_adopted(tmp_path):
    results = run_processes(tmp_path, "slow", 2)
    (key,) = results[0]["keys"]
    assert results[0]["keys"][key]["source"] == "adopted"
    assert results[0]["keys"][key]["winner"] == results[1]["keys"][key]["winner"]
    assert results[0]["stats"]["tuned"] == 0


@pytest.mark.slow
def test_a_claimer_killed_while_tuning_does_not_hang_its_peer(tmp_path):
    # run_processes bounds each process (240 s); the peer gives up after PEER_WAIT_S
    results = run_processes(tmp_path, "killed", 2, kill=1, PEER_WAIT_S="3")
    (key,) = results[0]["keys"]
    assert results[0]["keys"][key] == {"winner": "xla_dot", "source": "fallback"}


@pytest.mark.slow
@pytest.mark.parametrize("backend, count, database", [("sqlite", 4, "default.db"),
                                                      ("directory", 8, "default.d")])
def test_processes_on_one_store_tune_each_key_once_and_agree(tmp_path, backend, count, database):
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    results = run_processes(tmp_path, "host", count, JAX_AUTOTUNE_STORE=backend)
    keys = set(results[0]["keys"])
    assert len(keys) == 3 and len(results) == count
    assert_one_decision_per_key(results, keys)
    assert sum(r["stats"]["tuned"] for r in results.values()) == 3
    for key in keys:  # one process tuned it, every other adopted that decision or read it stored
        sources = sorted(r["keys"][key]["source"] for r in results.values())
        assert sources.count("tuned") == 1 and set(sources) <= {"tuned", "adopted", "store"}, sources
    assert sorted(p.name for p in (tmp_path / "store").iterdir() if not p.name.endswith(("-wal", "-shm"))) == [database]
    store = (SqliteStore if backend == "sqlite" else DirectoryStore)(tmp_path / "store" / database)
    stored = {e.key: e.value["winner"] for e in store.entries() if e.namespace.startswith("autotune/")}
    assert stored == {key: results[0]["keys"][key]["winner"] for key in keys}
