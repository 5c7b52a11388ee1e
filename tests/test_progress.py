"""What tuning says while it runs: one record per tuned key on the ``jax_autotune`` logger,
a line on a terminal while a long tuning runs, one bar over warmup's keys, and the
``progress`` setting that silences them."""

import io
import logging
import sys
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune import config
from jax_autotune.config import ConfigError
from jax_autotune.problem import problem_for
from jax_autotune.tuning import progress
from jax_autotune.tuning.decision import CandidateResult, Decision
from jax_autotune.tuning.policy import Policy

pytestmark = pytest.mark.usefixtures("fresh_tuning")  # tmp cache dir, no tuners, fresh counters


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self):
        return True


def operands(m, n, k):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((m, k)), jnp.float32),
            jnp.asarray(rng.standard_normal((k, n)), jnp.float32))


def records(caplog):
    return [r for r in caplog.records if r.name == "jax_autotune"]


def test_each_tuned_key_is_one_info_record_with_shape_seconds_winner_and_candidates(caplog):
    config.update("budget_seconds", 0.3)
    caplog.set_level(logging.INFO, logger="jax_autotune")
    a, b = operands(48, 24, 40)
    jax.jit(lambda a, b: jat.matmul(a, b))(a, b)  # a new function: compiled (and tuned) here
    [record] = records(caplog)
    decision = record.decision
    assert record.levelno == logging.INFO and decision.source == "tuned"
    message = record.getMessage()
    for part in (decision.problem.describe(), f"{decision.tuning_seconds:.2f} s", decision.winner,
                 f"of {len(decision.results)} candidates measured"):
        assert part in message, (part, message)
    jax.jit(lambda a, b: jat.matmul(a, b) * 2)(a, b)  # the same key again: a memory hit
    assert len(records(caplog)) == 1


def test_the_package_logger_has_only_a_null_handler():
    handlers = logging.getLogger("jax_autotune").handlers
    assert handlers and all(isinstance(h, logging.NullHandler) for h in handlers)


def test_progress_off_drops_the_records_to_debug(caplog):
    config.update("budget_seconds", 0.3)
    config.update("progress", "off")
    caplog.set_level(logging.DEBUG, logger="jax_autotune")
    jax.jit(lambda a, b: jat.matmul(a, b))(*operands(40, 24, 48))
    [record] = records(caplog)
    assert record.levelno == logging.DEBUG and "candidates measured" in record.getMessage()


def test_a_key_decided_without_a_benchmark_is_a_debug_record_saying_why(caplog):
    caplog.set_level(logging.INFO, logger="jax_autotune")
    jat.warmup([(8, 16, 32)], precision="F32_F32_F32", progress=False)  # XLA's dot alone
    assert records(caplog) == []
    caplog.set_level(logging.DEBUG, logger="jax_autotune")
    jat.warmup([(8, 16, 64)], precision="F32_F32_F32", progress=False)
    [record] = records(caplog)
    assert record.levelno == logging.DEBUG
    assert "no benchmark" in record.getMessage() and "algorithm preset" in record.getMessage()


@pytest.mark.parametrize("setting, terminal, requested, shown", [
    ("auto", True, None, True), ("auto", False, None, False),
    ("off", True, None, False), ("on", False, None, True),
    ("off", False, True, True), ("on", True, False, False)])
def test_progress_shows_on_a_terminal_unless_the_setting_or_the_argument_says(setting, terminal,
                                                                              requested, shown):
    stream = Terminal() if terminal else io.StringIO()
    assert progress.shows_progress(requested, setting, stream) is shown


def test_the_setting_takes_auto_on_off_and_booleans(monkeypatch):
    for text, value in (("auto", "auto"), ("ON", "on"), ("0", "off"), ("true", "on"), ("no", "off")):
        monkeypatch.setenv("JAX_AUTOTUNE_PROGRESS", text)
        assert config.get("progress") == value
    monkeypatch.setenv("JAX_AUTOTUNE_PROGRESS", "sometimes")
    with pytest.raises(ConfigError, match="JAX_AUTOTUNE_PROGRESS: expected one of auto, on, off"):
        config.get("progress")


def _decision(problem, winner="fast"):
    results = (CandidateResult("xla_dot", "ok", samples=(2e-6,) * 3, score=2e-6),
               CandidateResult(winner, "ok", samples=(1e-6,) * 3, score=1e-6))
    return Decision(problem.key(), problem, winner, results=results, tuning_seconds=3.25)


FAKE_TUNER = types.SimpleNamespace(candidate_set=types.SimpleNamespace(
    baseline=types.SimpleNamespace(name="xla_dot")))


def test_a_long_tuning_shows_one_line_on_a_terminal_that_ends_as_the_winner(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress, "SHOW_AFTER_SECONDS", 0.0)
    opened = threading.Event()
    real_open = progress.open_line

    def open_line(text, started):
        line = real_open(text, started)
        opened.set()
        return line

    monkeypatch.setattr(progress, "open_line", open_line)
    problem = problem_for(*operands(24, 16, 8))

    def tune(tuner, key, problem, policy):  # a tuning still running when its line opens
        assert opened.wait(timeout=60), "the line never opened"
        return _decision(problem)

    decision = progress.reported(tune)(FAKE_TUNER, problem.key(), problem, Policy())
    out = terminal.getvalue()
    assert f"jax_autotune: tuning {problem.describe()}" in out
    final = out.split("\r")[-1]
    assert final.startswith(f"jax_autotune: tuned {problem.describe()} in 3.2 s: fast 1.0 us (xla_dot 2.0 us)")
    assert out.count("\n") == 1 and decision.winner == "fast"


def test_no_line_opens_off_a_terminal_or_while_a_warmup_runs(monkeypatch):
    opened = []

    class Line:
        def __init__(self, text):
            opened.append(text)

        def finish(self, decision, baseline):
            pass

    monkeypatch.setattr(progress, "_Line", Line)
    problem = problem_for(*operands(24, 16, 8))
    tune = progress.reported(lambda tuner, key, problem, policy: _decision(problem))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    tune(FAKE_TUNER, problem.key(), problem, Policy())
    assert opened == []
    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress.over_keys(1, requested=False):
        tune(FAKE_TUNER, problem.key(), problem, Policy())
    assert opened == []
    tune(FAKE_TUNER, problem.key(), problem, Policy(progress="off"))
    assert opened == []  # the policy's setting: no line
    tune(FAKE_TUNER, problem.key(), problem, Policy())
    assert opened == [problem.describe()]


def test_warmup_shows_its_bar_as_the_setting_and_its_argument_say(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    shapes = [(8, 16, 32)]
    config.update("progress", "on")
    jat.warmup(shapes, precision="F32_F32_F32")
    assert "jax_autotune warmup" in stream.getvalue() and "1/1" in stream.getvalue()
    stream.truncate(0)
    config.update("progress", "off")
    jat.warmup(shapes, precision="F32_F32_F32")
    assert stream.getvalue() == ""
    jat.warmup(shapes, precision="F32_F32_F32", progress=True)
    assert "jax_autotune warmup" in stream.getvalue()
