"""The device lock: every timing on the device runs alone there.

    >>> with DEVICE_LOCK.exclusive():      # a CUPTI measurement, a compile of an XLA dot
    ...     times = measure(compiled)(lhs, rhs)
    >>> with DEVICE_LOCK.shared():         # a reference, a check, a warm-up run
    ...     out = compiled(lhs, rhs)
"""

from __future__ import annotations

import contextlib
import threading
import time


class DeviceLock:
    """Keeps every timing on the device alone there.

    Two things time kernels while tuning: a CUPTI measurement (which also records every
    kernel the process runs meanwhile) and XLA's GEMM autotuner, which runs and times
    candidate kernels while it compiles a dot. Each holds the lock ``exclusive()``, so
    neither sees the other's kernels or shares the device with them. Anything else that
    runs kernels (a reference, a correctness check, a warm-up run) holds it ``shared()``
    and may overlap the rest. A waiting exclusive holder goes before new shared ones.
    ``waited_seconds()`` is how long the calling thread has waited for the lock so far.

        >>> with DEVICE_LOCK.exclusive():
        ...     times = measure(compiled)(lhs, rhs)
    """

    def __init__(self, clock=time.perf_counter):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive holders waiting
        self._clock = clock
        self._waited = threading.local()

    def waited_seconds(self) -> float:
        """Seconds the calling thread has spent waiting to acquire this lock, in all."""
        return getattr(self._waited, "seconds", 0.0)

    def _wait_for(self, ready) -> None:  # with self._cond held
        if ready():  # no wait: nothing counted, so a thread that never waited reads exactly 0
            return
        start = self._clock()
        self._cond.wait_for(ready)
        self._waited.seconds = self.waited_seconds() + self._clock() - start

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            self._wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cond:
            self._waiting += 1
            self._wait_for(lambda: not self._exclusive and not self._shared)
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


DEVICE_LOCK = DeviceLock()
