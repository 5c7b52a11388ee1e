"""Fakes for tuner tests: a scripted timer and a clock that only moves when told."""

from __future__ import annotations

import numpy as np

from jax_autotune.tuning.candidates import Candidate, CandidateSetBuilder
from jax_autotune.tuning.device import DeviceInfo
from jax_autotune.tuning.timing import checked_problem

REFERENCE = np.arange(1.0, 7.0).reshape(1, 2, 3)
WRONG = REFERENCE + 1.0

CPU = DeviceInfo("cpu", "fake-cpu", 0, None, frozenset())


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeMeasurement:
    def __init__(self, timer: "FakeTimer", candidate, problem, args):
        self.timer, self.name = timer, candidate.name
        self.candidate, self.problem, self.args = candidate, problem, args
        self.samples_taken = 0

    def output(self):
        error = self.timer.run_errors.get(self.name)
        if error is not None:
            raise error
        if self.timer.real_outputs:
            checked = checked_problem(self.problem)  # what the gate compares, as the real timers
            out = np.asarray(self.candidate.bound(checked)(*self.args[:len(checked.input_specs())]))
            return out + 1.0 if self.name in self.timer.wrong else out
        return WRONG if self.name in self.timer.wrong else REFERENCE

    def sample(self) -> float:
        scripts = self.timer.scripts
        script = scripts(self.name, self.problem) if callable(scripts) else scripts[self.name]
        value = script[min(self.samples_taken, len(script) - 1)]
        self.samples_taken += 1
        self.timer.sampled.append(self.name)
        self.timer.events.append(("sample", self.name))
        if isinstance(value, BaseException):
            raise value
        if self.timer.clock is not None and value is not None:
            self.timer.clock.advance(value)
        return value


class FakeTimer:
    """Scripted samples per candidate name: ``FakeTimer({"a": [2, 1, 1, 1]})``, or
    ``FakeTimer(lambda name, problem: [...])`` for samples that depend on the problem.

    The last value repeats; an exception in the script is raised by ``sample``.
    """

    name = "fake"

    def __init__(self, scripts, *, compile_errors=None, run_errors=None, wrong=(), clock=None,
                 real_outputs=False, device_time=True):
        self.scripts = scripts
        self.measures_device_time = device_time  # True: compile a few ahead, like on GPUs
        self.events: list[tuple[str, str]] = []  # ("prepare" | "sample" | "release", name), in order
        self.real_outputs = real_outputs
        self.compile_errors = compile_errors or {}
        self.run_errors = run_errors or {}
        self.wrong = set(wrong)
        self.clock = clock
        self.prepared: list[str] = []
        self.sampled: list[str] = []

    def release(self):
        self.events.append(("release", ""))

    def prepare(self, candidate, problem, args):
        self.prepared.append(candidate.name)
        self.events.append(("prepare", candidate.name))
        error = self.compile_errors.get(candidate.name)
        if error is not None:
            raise error
        return FakeMeasurement(self, candidate, problem, args)

    def samples_of(self, name: str) -> int:
        return self.sampled.count(name)


def fake_candidate(name: str, cost: float | None = None, supported: bool = True,
                   quick_compile: bool = False, **params) -> Candidate:
    from jax_autotune.kernels.xla import xla_dot

    return Candidate(name, xla_dot, params=params,
                     supports=lambda device, key: supported,
                     cost=(lambda problem: cost) if cost is not None else None,
                     quick_compile=quick_compile)


def candidate_set(groups, members, *, baseline: str = "xla_dot"):
    """``groups``: [(name, priority)], ``members``: [(candidate, [(group, priority), ...])]."""
    builder = CandidateSetBuilder("cpu", "fake-cpu")
    builder.add(fake_candidate(baseline))
    made = {name: builder.group(name, (lambda p: lambda key: p)(prio)) for name, prio in groups}
    for candidate, memberships in members:
        builder.add(candidate, *[(made[g], (lambda p: lambda key: p)(prio)) for g, prio in memberships])
    return builder.build()
