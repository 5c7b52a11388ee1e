"""One decision per key: across the processes of a jax.distributed job, and across the
processes of one host that share a tune store.

Different processes running different kernels for one key can mean different programs
and a hang in the next collective; tuning a key in every process wastes their time. So
a key missing from the store is decided by exactly one process and adopted by the rest:

* **in a job** (``jax.distributed`` with more than one process), through the job's
  key-value store (the client JAX's own multi-host compilation uses): the first process
  whose atomic ``key_value_increment`` of the key's claim returns 1 tunes it and inserts
  the decision (``allow_overwrite=False``); the others ``blocking_key_value_get`` it, for
  at most ``TuningRules.peer_wait_seconds``, then insert XLA's dot themselves with a
  warning (never a hang). An insert that finds a decision adopts that one, so a claimer
  that finishes late adopts the waiters' XLA's dot: every process ends with the same;
* **on one host** (a shared store, no job): the tuner claims the key in the store
  (owner and a lease, renewed while it tunes, taken over once it lapses or its process
  is gone), the others poll for the decision and adopt it, and a stored decision is never
  replaced by a concurrent tuning (``TuneStore.put_if_absent``). The SQLite store claims
  in a table, the directory store in a claim file, so this works across the hosts of a
  shared filesystem too (a claim's process is known dead only on its own host; elsewhere
  its lease lapses).

    >>> decision, how = decide_on_host(store, namespace, key.canonical(), checksum, tune,
    ...                                fallback, lease_seconds=15, wait_seconds=60)
    >>> decision, how = decide_in_job(current_job(), job_key("gpu", checksum, key.canonical()),
    ...                               propose, fallback, wait_seconds=60)
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import random
import secrets
import socket
import threading
import time
import warnings
from typing import Callable

from jax_autotune.errors import ConsensusWarning, JaxAutotuneConsensusWarning  # noqa: F401 - its earlier home
from jax_autotune._version import __version__
from jax_autotune.tuning.decision import Decision, Source
from jax_autotune.tuning.store import TuneStore
from jax_autotune.tuning.store_protocol import Claim

_MAX_TIMEOUT_MS = 2**31 - 1


class Settled(enum.StrEnum):
    """How a key's decision was reached across processes: found in the store, tuned by
    this process, adopted from another, proposed by this one in a job (the others adopt
    it), or XLA's dot because no decision came in time."""

    STORED = "stored"
    TUNED = "tuned"
    ADOPTED = "adopted"
    PROPOSED = "proposed"
    FALLBACK = "fallback"


def _status(err: BaseException) -> str:
    """The status code a key-value call failed with ('NOT_FOUND', 'ALREADY_EXISTS', ...)."""
    head = str(err).split(":", 1)[0].strip()
    return head if head.isupper() and head.replace("_", "").isalpha() else ""


# ---------------------------------------------------------------- the job

@dataclasses.dataclass(frozen=True)
class Job:
    """This process's place in a jax.distributed job, and the job's key-value client."""

    client: object
    process_index: int
    process_count: int


def current_job() -> Job | None:
    """The job when jax.distributed runs more than one process, else None (no backend is
    initialized by asking)."""
    try:
        from jax._src.distributed import global_state  # private: what JAX's own multi-host compilation uses
    except ImportError:  # pragma: no cover - depends on the jax version
        return None
    client, count = getattr(global_state, "client", None), getattr(global_state, "num_processes", 1)
    if client is None or not count or count < 2:
        return None
    return Job(client, int(global_state.process_id), int(count))


def job_key(platform: str, checksum: str, key_string: str) -> str:
    """The key-value path of a decision: the same in every process of a job (no host facts
    such as the CPU model, which differ between otherwise identical hosts)."""
    digest = hashlib.sha256(key_string.encode()).hexdigest()[:32]
    return f"jax_autotune/{__version__}/{platform}/{checksum}/{digest}"


def decide_in_job(job: Job, path: str, propose: Callable[[], Decision],
                  fallback: Callable[[str], Decision], wait_seconds: float) -> tuple[Decision, Settled]:
    """The job's decision for the key at ``path``: (decision, how), how ``PROPOSED`` when this
    process claimed the key and its ``propose()`` (a stored decision, or a tuning) was
    published, ``ADOPTED`` when a peer's was, ``FALLBACK`` when no peer published in time.
    Errors of the key-value store propagate (the caller falls back locally)."""
    client = job.client

    def lookup():
        try:
            return Decision.from_json(json.loads(client.key_value_try_get(path)))
        except Exception as err:  # noqa: BLE001 - the client raises JaxRuntimeError
            if _status(err) == "NOT_FOUND":
                return None
            raise

    def insert(decision: Decision) -> Decision:
        try:
            client.key_value_set(path, json.dumps(decision.to_json(), sort_keys=True),
                                 allow_overwrite=False)
            return decision
        except Exception as err:  # noqa: BLE001
            if _status(err) != "ALREADY_EXISTS":
                raise
        return lookup() or decision

    found = lookup()
    if found is not None:
        return found, Settled.ADOPTED
    if client.key_value_increment(path + "/claim", 1) == 1:
        mine = propose()
        published = insert(mine)
        return published, Settled.PROPOSED if published is mine else Settled.ADOPTED
    try:
        text = client.blocking_key_value_get(path, max(0, min(_MAX_TIMEOUT_MS, int(wait_seconds * 1000))))
        return Decision.from_json(json.loads(text)), Settled.ADOPTED
    except Exception as err:  # noqa: BLE001
        if _status(err) != "DEADLINE_EXCEEDED":
            raise
    warnings.warn(f"jax_autotune: no decision from the process tuning {path} within "
                  f"{wait_seconds:.0f} s; every process uses XLA's dot for it",
                  ConsensusWarning, stacklevel=4)
    mine = fallback(f"no peer decided within {wait_seconds:.0f} s")
    published = insert(mine)
    return published, Settled.FALLBACK if published is mine else Settled.ADOPTED


# ---------------------------------------------------------------- one host

def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _owner_gone(owner: str, expires: float) -> bool:
    """A claim whose process is dead on this host (killed while tuning) can be taken over
    at once, without waiting for its lease."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def decide_on_host(store: TuneStore, namespace: str, key_string: str, checksum: str,
                   tune: Callable[[], Decision], fallback: Callable[[str], Decision],
                   lease_seconds: float, wait_seconds: float,
                   usable: Callable[[dict], bool] = lambda value: True,
                   clock=time.monotonic, sleep=time.sleep) -> tuple[Decision, Settled]:
    """The store's decision for a key: (decision, how), how ``STORED`` when it was there,
    ``TUNED`` when this process claimed and tuned it, ``ADOPTED`` when another process did
    meanwhile, ``FALLBACK`` when one kept its claim past ``wait_seconds``. A stored value
    that is not ``usable`` (an unknown winner, a damaged row) is tuned again and replaced."""
    owner = _owner()
    deadline, pause, waited = clock() + wait_seconds, 0.02, False
    while True:
        state, value = store.claim(namespace, key_string, checksum, owner, lease_seconds, _owner_gone,
                                   keep=usable)
        if state == Claim.DECIDED:
            return Decision.from_json(value), Settled.ADOPTED if waited else Settled.STORED
        if state == Claim.CLAIMED:
            break
        if clock() > deadline:
            warnings.warn(f"jax_autotune: process {value} holds the tuning of a key for over "
                          f"{wait_seconds:.0f} s; using XLA's dot for it in this process",
                          ConsensusWarning, stacklevel=4)
            return fallback(f"another process kept tuning this key over {wait_seconds:.0f} s"), Settled.FALLBACK
        waited = True
        sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 1.0)
    stop = threading.Event()

    def renew():
        while not stop.wait(lease_seconds / 3):
            store.renew(namespace, key_string, checksum, owner, lease_seconds)

    renewer = threading.Thread(target=renew, name="jax_autotune-lease", daemon=True)
    renewer.start()
    try:
        mine = tune()
    except BaseException:
        store.release(namespace, key_string, checksum, owner)
        raise
    finally:
        stop.set()
        renewer.join()
    if mine.source != Source.TUNED:  # a failed tuning is not stored: the next process tries again
        store.release(namespace, key_string, checksum, owner)
        return mine, Settled.TUNED
    stored, inserted = store.put_if_absent(namespace, key_string, checksum, mine.to_json(), keep=usable)
    return (mine, Settled.TUNED) if inserted else (Decision.from_json(stored), Settled.ADOPTED)
