"""The device lock: shared holders overlap, a measurement (exclusive) runs alone."""

import threading

from jax_autotune.tuning.timing import DeviceLock


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
