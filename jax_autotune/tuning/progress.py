"""What tuning says while it runs: a log record per tuned key, and a line on a terminal.

Every key the tuner decides goes to the ``jax_autotune`` logger as one record: the
problem, the seconds it took, the winner and its time, XLA's dot's time and how many
candidates were measured (INFO; DEBUG for a key decided without a benchmark). As a library
should, the package only adds a ``NullHandler``: nothing prints until the program
configures logging.

    >>> import logging
    >>> logging.basicConfig()                                   # a handler on stderr
    >>> logging.getLogger("jax_autotune").setLevel(logging.INFO)
    >>> jax.jit(jat.matmul)(a, b)
    INFO:jax_autotune:tuned 1024x1024x1024 float32 NN DEFAULT in 0.57 s: native_gemm_... 180.1 us (xla_dot 201.3 us), 9 of 14 candidates measured

On a terminal (stderr a TTY), a key whose tuning has run for ``SHOW_AFTER_SECONDS`` shows
one tqdm line, which ends as the winner; ``warmup`` shows one bar over its keys instead
(``over_keys``). The ``progress`` setting (``JAX_AUTOTUNE_PROGRESS``, handed in as
``Policy.progress``) decides: ``auto`` (the default: on a terminal), ``on`` (on stderr
whatever it is), ``off`` (no line, no bar, and the records drop to DEBUG, as
``jax_log_compiles`` does for JAX's compile records).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
from typing import Callable, Iterable, Iterator

from jax_autotune.tuning.decision import Decision

logger = logging.getLogger("jax_autotune")

SHOW_AFTER_SECONDS = 1.0  # a tuning shorter than this shows no line
REFRESH_SECONDS = 0.5  # how often a shown line's clock is redrawn

_lock = threading.Lock()
_warmups = 0  # warmups running now: their bar (or their silence) stands for every key's line


def shows_progress(requested: bool | None = None, setting: str = "auto", stream=None) -> bool:
    """Whether a line or bar goes to ``stream`` (default: stderr): ``requested`` when given
    (warmup's ``progress=``), else the ``progress`` setting (``auto``: on a terminal).

        >>> shows_progress(None, "auto", io.StringIO())
        False
    """
    if requested is not None:
        return bool(requested)
    if setting == "auto":
        stream = sys.stderr if stream is None else stream
        return bool(getattr(stream, "isatty", lambda: False)())
    return setting == "on"


@contextlib.contextmanager
def over_keys(total: int, requested: bool | None = None,
              setting: str = "auto") -> Iterator[Callable[[Iterable], Iterable]]:
    """Warmup's bar: ``track(decisions)`` yields them with one bar over ``total`` keys when
    progress shows (``requested``, else ``setting``); while the block runs, no key shows a
    line of its own.

        >>> with over_keys(len(work), progress, policy.progress) as track:
        ...     entries = [WarmupEntry.of(d) for d in track(pool.map(select, work))]
    """
    global _warmups
    show = total > 0 and shows_progress(requested, setting)

    def track(decisions: Iterable) -> Iterable:
        if not show:
            return decisions
        from tqdm import tqdm
        return tqdm(decisions, total=total, desc="jax_autotune warmup", unit="key", file=sys.stderr)

    with _lock:
        _warmups += 1
    try:
        yield track
    finally:
        with _lock:
            _warmups -= 1


def reported(tune: Callable) -> Callable:
    """Decorate ``Tuner._tune(self, key, problem, policy) -> Decision``: log each decision,
    and on a terminal (``policy.progress``) show a line while a long tuning runs.

        >>> class Tuner:
        ...     @reported
        ...     def _tune(self, key, problem, policy): ...
    """
    @functools.wraps(tune)
    def reporting(tuner, key, problem, policy):
        line = _Line(problem.describe()) if _warmups == 0 and shows_progress(None, policy.progress) else None
        decision = None
        try:
            decision = tune(tuner, key, problem, policy)
        finally:
            if line is not None:
                line.finish(decision, tuner.candidate_set.baseline.name)
        log(decision, tuner.candidate_set.baseline.name, policy.progress)
        return decision
    return reporting


def log(decision: Decision, baseline: str, setting: str = "auto") -> None:
    """The decision's record on the ``jax_autotune`` logger (``extra``: ``record.decision``);
    ``baseline`` names XLA's dot, whose time the record gives beside the winner's; with the
    ``progress`` setting ``off`` the record is DEBUG."""
    benchmarked = any(r.samples for r in decision.results)
    level = logging.INFO if benchmarked and setting != "off" else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(level, "tuned %s in %.2f s: %s", decision.problem.describe(),
                   decision.tuning_seconds, summary(decision, baseline), extra={"decision": decision})


def summary(decision: Decision, baseline: str) -> str:
    """``'native_gemm_avx2_6x16_t1 180.1 us (xla_dot 201.3 us), 9 of 14 candidates measured'``
    (``baseline``: ``'xla_dot'``), or the winner and why nothing was measured."""
    measured = sum(1 for r in decision.results if r.samples)
    if not measured:
        return f"{decision.winner}, no benchmark ({decision.reason or 'nothing measured'})"
    xla = decision.result(baseline)
    versus = f" ({baseline} {_us(xla.score)})" if xla and decision.winner != baseline else ""
    reason = f"; {decision.reason}" if decision.reason else ""
    return (f"{decision.winner} {_us(decision.winner_seconds)}{versus}, {measured} of "
            f"{len(decision.results)} candidates measured{reason}")


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f} us"


class _Line:
    """One tqdm line on stderr for a tuning that runs past ``SHOW_AFTER_SECONDS``; a watcher
    thread opens it and redraws its clock, ``finish`` turns it into the result."""

    def __init__(self, problem: str):
        self.problem, self.bar, self.started = problem, None, time.time()
        self._done, self._lock = threading.Event(), threading.Lock()
        self._watcher = threading.Thread(target=self._watch, name="jax_autotune-progress", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        if self._done.wait(SHOW_AFTER_SECONDS):
            return
        with self._lock:
            if self._done.is_set():
                return
            self.bar = open_line(f"jax_autotune: tuning {self.problem}", self.started)
        while not self._done.wait(REFRESH_SECONDS):
            with self._lock:
                self.bar.refresh()

    def finish(self, decision: Decision | None, baseline: str) -> None:
        with self._lock:
            self._done.set()
            if self.bar is not None:
                self.bar.bar_format = "{desc}"
                self.bar.set_description_str(
                    f"jax_autotune: tuned {self.problem} in {decision.tuning_seconds:.1f} s: "
                    f"{summary(decision, baseline)}" if decision is not None
                    else f"jax_autotune: tuning {self.problem} stopped", refresh=False)
                self.bar.close()
        self._watcher.join()


def open_line(text: str, started: float):
    """A tqdm line on stderr that shows ``text`` and the time since ``started`` (``time.time()``)."""
    from tqdm import tqdm
    line = tqdm(desc=text, bar_format="{desc} {elapsed}", file=sys.stderr, leave=True)
    line.start_t = line.last_print_t = started
    line.refresh()
    return line
