"""numpy's OpenBLAS held to one thread while a host clock times candidates (``host_blas``)."""

import threading

import jax
import numpy as np
import pytest

from fakes import CPU, FakeClock, FakeTimer, candidate_set, fake_candidate
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuning import host_blas
from jax_autotune.tuning.roofline import Peaks
from jax_autotune.tuning.tuner import Tuner

PROBLEM = MatmulProblem(1, 16, 8, 12, "float32", "float32", "float32")


class FakeOpenBLAS:
    """An OpenBLAS thread count: ``set`` calls are recorded."""

    def __init__(self, threads: int):
        self.threads, self.calls = threads, []

    def get(self) -> int:
        return self.threads

    def set(self, threads: int) -> None:
        self.calls.append(threads)
        self.threads = threads


@pytest.fixture
def blas(monkeypatch):
    fake = FakeOpenBLAS(threads=8)
    monkeypatch.setattr(host_blas, "_numpy_openblas", lambda: fake)
    return fake


def test_inside_the_block_one_thread_and_the_count_before_it_after(blas):
    with host_blas.single_threaded():
        assert blas.threads == 1
    assert blas.threads == 8 and blas.calls == [1, 8]


def test_nested_and_concurrent_blocks_restore_only_when_the_last_ends(blas):
    inner_open, outer_may_end = threading.Event(), threading.Event()

    def other_thread():
        with host_blas.single_threaded():
            inner_open.set()
            assert outer_may_end.wait(10)

    with host_blas.single_threaded():
        with host_blas.single_threaded():
            assert blas.threads == 1
        assert blas.threads == 1  # the outer block is still open
        worker = threading.Thread(target=other_thread)
        worker.start()
        assert inner_open.wait(10)
    assert blas.threads == 1  # the other thread's block is still open
    outer_may_end.set()
    worker.join(10)
    assert blas.threads == 8 and blas.calls == [1, 8]


def test_a_library_already_on_one_thread_is_left_alone(monkeypatch):
    fake = FakeOpenBLAS(threads=1)
    monkeypatch.setattr(host_blas, "_numpy_openblas", lambda: fake)
    with host_blas.single_threaded():
        pass
    assert fake.calls == []


def test_an_error_inside_the_block_still_restores_the_count(blas):
    with pytest.raises(ValueError, match="inside"):
        with host_blas.single_threaded():
            raise ValueError("inside")
    assert blas.threads == 8


def test_without_an_openblas_the_block_changes_nothing(monkeypatch):
    monkeypatch.setattr(host_blas, "_numpy_openblas", lambda: None)
    with host_blas.single_threaded():
        assert np.matmul(np.eye(3), np.ones((3, 2))).sum() == 6.0


def test_only_libraries_named_openblas_are_taken_from_the_process_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /venv/numpy.libs/libscipy_openblas64_-32a4.so\n"
        "7f01-7f02 r--p 00001000 08:01 1 /venv/numpy.libs/libscipy_openblas64_-32a4.so\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /opt/openblas-tools/lib/libother.so\n"
        "7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/libopenblas.so.0\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n")
    assert host_blas._mapped_openblas(str(maps)) == [
        "/venv/numpy.libs/libscipy_openblas64_-32a4.so", "/usr/lib/libopenblas.so.0"]
    assert host_blas._mapped_openblas(str(tmp_path / "absent")) == []


def test_numpy_s_own_openblas_is_held_and_given_back_where_numpy_has_one():
    found = host_blas._numpy_openblas()
    if found is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS mapped into the process")
    before = found.get()
    with host_blas.single_threaded():
        assert found.get() == 1
        assert np.allclose(np.ones((64, 64)) @ np.ones((64, 64)), 64.0)
    assert found.get() == before


class _Probes:
    def peaks_for(self, problem):
        return Peaks(compute=1e12, bandwidth=1e11, launch_overhead=1e-6)


@pytest.mark.parametrize("device_time", [False, True])
def test_a_host_clock_samples_and_computes_the_reference_with_one_blas_thread(blas, store, monkeypatch,
                                                                              device_time):
    import jax_autotune.tuning.bench as bench

    during_reference = []
    real_reference = bench.reference
    monkeypatch.setattr(bench, "reference", lambda *a, **k: during_reference.append(blas.threads)
                        or real_reference(*a, **k))
    during_samples = []

    def sampled(name, problem):
        during_samples.append(blas.threads)
        return [{"xla_dot": 3.0, "fast": 1.0}[name]]

    timer = FakeTimer(sampled, real_outputs=True, device_time=device_time)
    cset = candidate_set([("g", 1)], [(fake_candidate("fast"), [("g", 1)])])
    tuner = Tuner(CPU, cset, jax_device=jax.devices("cpu")[0], timer=timer, store=store,
                  clock=FakeClock(), probes=_Probes())
    assert tuner.select(PROBLEM).winner == "fast"
    held = 8 if device_time else 1  # a device timer's samples are not the host's
    assert during_reference == [held] and set(during_samples) == {held}
    assert blas.threads == 8
