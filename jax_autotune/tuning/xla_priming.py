"""XLA's GEMM autotuner over many dots at once, in one compile ahead of their own.

Compiling an XLA dot on a GPU runs XLA's GEMM autotuner: it compiles a few dozen kernel
configs for the dot's fusion on a thread pool, times them on the device, and keeps the
fastest for the rest of the process. Nearly all of that is compiling on the host (the
timing is a small part), and one fusion's configs do not keep every core busy. A module
that holds many dots autotunes all their fusions in one pass, their configs compiled
side by side; a later compile of one of those dots alone takes the choice XLA kept
(the same kernel, in a fraction of the time). So the tuner primes: before a key's
round, the round's XLA-based candidates (``Candidate.xla_autotuned``) in one compile,
and ``warmup`` does it once for every key it will tune.

The priming compile holds the device alone (``DEVICE_LOCK``), as any compile of an XLA
dot does, so that XLA's timings are undisturbed; its executable is dropped. A primed
candidate's own compile then runs no kernel and needs no hold of the device
(``compile_primed``: XLA is told to fail rather than autotune, and a failure compiles it
the usual way). A failed priming costs only its time: each candidate then autotunes in
its own compile.

    >>> primed = prime([(problem, XLA_DOT), (problem, padded_barrier)], jax_device)
    >>> primed      # how many pairs this compile autotuned (0: nothing to do, or failed)
    2
"""

from __future__ import annotations

import threading
from typing import Iterable, Sequence

import jax

from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import counters, operand_copies
from jax_autotune.tuning.candidates import Candidate
from jax_autotune.tuning.compile_options import compile_lowered
from jax_autotune.tuning.device_lock import DEVICE_LOCK

Pair = tuple[MatmulProblem, Candidate]
KEPT_CHOICES_ONLY = {"xla_gpu_require_complete_aot_autotune_results": True}
# a long warmup is split into compiles of this many, so that what one compile holds in
# memory, and what a candidate that XLA rejects makes lose, stay bounded
PAIRS_PER_COMPILE = 32

_lock = threading.Lock()
_primed: set[tuple] = set()  # (device id, problem, candidate name): XLA keeps their choices


def _mark(device, problem: MatmulProblem, candidate: Candidate) -> tuple:
    return (device.id, problem, candidate.name)


def is_primed(problem: MatmulProblem, candidate: Candidate, device) -> bool:
    with _lock:
        return _mark(device, problem, candidate) in _primed


def to_prime(pairs: Iterable[Pair], device) -> list[Pair]:
    """The XLA-autotuned pairs, without repeats and those primed already in this process."""
    seen, todo = set(), []
    for problem, candidate in pairs:
        mark = _mark(device, problem, candidate)
        if candidate.xla_autotuned and mark not in seen and not is_primed(problem, candidate, device):
            seen.add(mark)
            todo.append((problem, candidate))
    return todo


def prime(pairs: Iterable[Pair], device) -> int:
    """Autotune the XLA dots of ``pairs`` (problem, candidate) on ``device``, up to
    ``PAIRS_PER_COMPILE`` in one compile; the number of pairs autotuned. Fewer than two to
    do is 0: one dot alone gains nothing."""
    todo = to_prime(pairs, device)
    if len(todo) < 2:
        return 0
    primed = 0
    for start in range(0, len(todo), PAIRS_PER_COMPILE):
        chunk = todo[start:start + PAIRS_PER_COMPILE]
        try:
            _compile_together(chunk, device)
        except Exception:  # noqa: BLE001 - priming only saves time; each compile autotunes itself
            continue
        with _lock:
            _primed.update(_mark(device, p, c) for p, c in chunk)
        primed += len(chunk)
    counters.bump("xla_primed", primed)
    return primed


def _compile_together(pairs: Sequence[Pair], device) -> None:
    sharding = jax.sharding.SingleDeviceSharding(device)
    # each dot as its timing compiles it (copied operands held as the program holds them)
    specs = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
             for problem, _ in pairs for shape, dtype in operand_copies.held_specs(problem)]
    starts = [0]
    for problem, _ in pairs:
        starts.append(starts[-1] + len(problem.input_specs()))

    def every_dot(*inputs):
        return tuple(operand_copies.timed(candidate.bound(problem), problem)(*inputs[starts[i]:starts[i + 1]])
                     for i, (problem, candidate) in enumerate(pairs))

    lowered = jax.jit(every_dot).lower(*specs)
    with DEVICE_LOCK.exclusive():
        compile_lowered(lowered)


def compile_primed(lowered, problem: MatmulProblem, candidate: Candidate, device):
    """``lowered`` compiled with XLA told to take only the choices it keeps (a miss is an
    error, not a run of its autotuner), so that the compile needs no hold of the device;
    None when the pair was not primed on ``device`` or XLA missed a choice."""
    if device is None or not is_primed(problem, candidate, device):
        return None
    try:
        return compile_lowered(lowered, KEPT_CHOICES_ONLY)
    except Exception:  # noqa: BLE001 - a miss: the caller compiles it with the autotuner
        return None


def forget() -> None:
    """Forget what was primed (tests; XLA itself keeps its choices for the process)."""
    with _lock:
        _primed.clear()


__all__ = ["prime", "to_prime", "is_primed", "compile_primed", "forget", "KEPT_CHOICES_ONLY",
           "PAIRS_PER_COMPILE"]
