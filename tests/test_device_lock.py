"""The device lock: shared holders overlap, a measurement (exclusive) runs alone."""

import threading

from jax_autotune.tuning.device_lock import DeviceLock


def hold(lock_context, entered: threading.Event, release: threading.Event):
    def run():
        with lock_context():
            entered.set()
            release.wait(timeout=5.0)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_shared_holders_overlap_and_an_exclusive_one_waits_for_them():
    lock = DeviceLock()
    a_in, a_out, b_in, b_out, x_in, x_out = (threading.Event() for _ in range(6))
    a = hold(lock.shared, a_in, a_out)
    b = hold(lock.shared, b_in, b_out)
    assert a_in.wait(5.0) and b_in.wait(5.0)  # both inside at once
    x = hold(lock.exclusive, x_in, x_out)
    assert not x_in.wait(0.05)
    a_out.set()
    a.join()
    assert not x_in.wait(0.05)  # b still holds it
    b_out.set()
    assert x_in.wait(5.0)
    x_out.set()
    b.join()
    x.join()


def test_a_waiting_exclusive_holder_goes_before_new_shared_ones():
    lock = DeviceLock()
    s_in, s_out, x_in, x_out, t_in, t_out = (threading.Event() for _ in range(6))
    first = hold(lock.shared, s_in, s_out)
    assert s_in.wait(5.0)
    x = hold(lock.exclusive, x_in, x_out)
    while not lock._waiting:  # the exclusive holder is queued
        threading.Event().wait(0.001)
    late = hold(lock.shared, t_in, t_out)
    s_out.set()
    first.join()
    assert x_in.wait(5.0) and not t_in.is_set()
    x_out.set()
    assert t_in.wait(5.0)
    t_out.set()
    x.join()
    late.join()


def test_each_thread_counts_only_the_time_it_was_kept_waiting():
    ticks = iter(range(0, 1000, 5))
    lock = DeviceLock(clock=lambda: next(ticks))  # a wait lasts 5 ticks
    with lock.shared():  # nothing holds it: no wait, nothing counted
        pass
    with lock.exclusive():
        pass
    other = []

    def in_another_thread():
        other.append(lock.waited_seconds())
        with lock.exclusive():  # kept waiting by the shared hold below
            other.append(lock.waited_seconds())

    with lock.shared():
        thread = threading.Thread(target=in_another_thread)
        thread.start()
        while not lock._waiting:  # the exclusive holder is queued
            threading.Event().wait(0.001)
    thread.join()
    assert lock.waited_seconds() == 0.0 and other == [0.0, 5]


def test_a_compile_records_the_time_it_waited_for_the_device():
    # the compile of an XLA dot holds the device alone: it waits while a kernel run holds
    # it shared; a compile that takes no part of the lock records no wait at all
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.tuning import device_lock
    from jax_autotune.tuning.bench import CompileQueue
    from fakes import FakeTimer, fake_candidate

    class ExclusiveTimer(FakeTimer):
        def prepare(self, candidate, problem, args):
            with device_lock.DEVICE_LOCK.exclusive():
                return super().prepare(candidate, problem, args)

    problem = MatmulProblem(1, 8, 8, 8, "float32", "float32", "float32")
    xla, pallas = fake_candidate("xla_like"), fake_candidate("pallas_like")
    locking, free = (CompileQueue(timer, problem, (None, None), threads=1)
                     for timer in (ExclusiveTimer({}), FakeTimer({})))
    lock = device_lock.DEVICE_LOCK
    with lock.shared():
        locking.start(xla)
        with lock._cond:  # the compile is now queued behind this shared hold
            lock._cond.wait_for(lambda: lock._waiting == 1, timeout=5.0)
        free.result(pallas)
    locking.result(xla)
    assert 0 < locking.waits["xla_like"] <= locking.seconds["xla_like"]
    assert free.waits["pallas_like"] == 0.0
    locking.close()
    free.close()
