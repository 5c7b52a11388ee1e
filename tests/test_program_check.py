"""The whole program tuned against plain: the keys that cost it are left plain, and kept.

The search is checked with a scripted measure (exact, fast); the rest end to end on the CPU:
a key left plain is lax's dot in the traced program, the next process reads it from the
store, and warmup reports what it compared.
"""

import contextlib
import re
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune import program_check
import jax_autotune.config as config
from jax_autotune.autotune import programs_traced
from jax_autotune.primitive import fused_p, matmul_p
from jax_autotune.registry import RUNTIME, tuner_for
from jax_autotune.tuning import programs
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.jaxprs import equations
from jax_autotune.warmup import PHASES, matmul_problems
from numerics import rand




X, W1, W2, B = rand(0, 24, 40), rand(1, 40, 48), rand(2, 48, 16), rand(3, 48)


def mlp(x, w1, w2, b):
    return jnp.tanh(x @ w1 + b) @ w2


def keys_of(fn, *args):
    return [key for _, key in matmul_problems(jax.make_jaxpr(fn)(*args))]


class Scripted:
    """Seconds by the keys left plain: tuned 1.10, plain 1.0; leaving ``costly`` plain
    saves 0.12, each key of ``saving`` 0.03; keeps each call's sets."""

    def __init__(self, costly=None, saving=()):
        self.costly, self.saving, self.calls = costly, set(saving), []

    def __call__(self, *lefts):
        self.calls.append(lefts)
        return [(1.10 - 0.12 * (self.costly in left) - 0.03 * len(self.saving & left), 1.0) for left in lefts]


def test_a_slower_program_leaves_the_shortest_prefix_of_keys_by_claimed_gain_plain(fresh_tuning):
    tuner = tuner_for("cpu")
    keys = keys_of(jat.autotune(mlp), X, W1, W2, B) + keys_of(jat.autotune(mlp), X[:7], W1, W2, B)
    assert len(keys) == 4
    uses = dict.fromkeys(keys, 1)
    gains = {keys[0]: 0.0, keys[1]: 1e-6, keys[2]: 2e-6, keys[3]: 9e-6}
    measure = Scripted(costly=keys[2])
    found = program_check.check(None, (), {"p1", "p2"}, uses, gains, tuner, measure=measure)
    assert found.left_plain == tuple(keys[:3]) and found.keys == 4
    assert (found.plain_seconds, found.tuned_seconds, found.final_seconds) == (1.0, 1.10, pytest.approx(0.98))
    # tuned, slower than plain; then the minor keys (the 2 claiming 1e-6 of 12e-6) plain,
    # still slower; then a binary search above them: the prefix of 3
    assert measure.calls == [(frozenset(),), (frozenset(keys[:2]),), (frozenset(keys[:3]),)]
    assert "3 of 4 keys left plain" in str(found)
    for program in ("p1", "p2"):
        assert programs.left_plain(tuner, program) == frozenset(keys[:3])


def test_a_program_faster_than_plain_keeps_every_key_tuned(fresh_tuning):
    tuner = tuner_for("cpu")
    keys = keys_of(jat.autotune(mlp), X, W1, W2, B)
    found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 1), {}, tuner,
                                measure=lambda *lefts: [(0.985, 1.0)] * len(lefts))  # 1.5%: above the noise margin
    assert found.left_plain == () and programs.left_plain(tuner, "p") == frozenset()


@pytest.mark.parametrize("tuned", [1.005, 0.995])
def test_a_program_within_the_noise_of_plain_runs_as_written(fresh_tuning, tuned):
    """A gain or loss inside ``MARGIN`` is none: every key is left plain (the search's
    trials, each no faster either, end at the program as written)."""
    tuner = tuner_for("cpu")
    keys = keys_of(jat.autotune(mlp), X, W1, W2, B)
    found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 1), {}, tuner,
                                measure=lambda *lefts: [(tuned, 1.0)] * len(lefts))
    assert set(found.left_plain) == set(keys) and programs.left_plain(tuner, "p") == frozenset(keys)
    assert found.final_seconds == 1.0


def four_keys():
    keys = keys_of(jat.autotune(mlp), X, W1, W2, B) + keys_of(jat.autotune(mlp), X[:7], W1, W2, B)
    assert len(set(keys)) == 4
    return keys


def test_a_program_faster_than_plain_compiles_nothing_more(fresh_tuning):
    """Tuned faster than plain: the first compiles (tuned and plain) are the check's
    only ones, the minor keys not tried (a trial of them gained nothing on real models)."""
    keys = four_keys()
    gains = {keys[0]: 0.0, keys[1]: 0.5e-6, keys[2]: 10e-6, keys[3]: 30e-6}  # minor: keys 0, 1
    measure = Scripted(saving=keys[:2])
    found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 2), gains, tuner_for("cpu"),
                                measure=lambda *lefts: [(s - 0.12, p) for s, p in measure(*lefts)])
    assert measure.calls == [(frozenset(),)]
    assert found.left_plain == () and found.final_seconds == pytest.approx(0.98)


@pytest.mark.parametrize("costly, left", [(1, 2), (2, 3)])
def test_a_slower_program_tries_its_minor_keys_plain_first(fresh_tuning, costly, left):
    """Tuned slower than plain: the minor keys (claiming together at most MINOR_SHARE) are
    tried plain next; where that is faster than plain it is kept, else the search
    goes on above them."""
    tuner = tuner_for("cpu")
    keys = four_keys()
    gains = {keys[0]: 0.0, keys[1]: 0.5e-6, keys[2]: 10e-6, keys[3]: 30e-6}  # minor: keys 0, 1
    measure = Scripted(costly=keys[costly])
    found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 2), gains, tuner, measure=measure)
    assert measure.calls[:2] == [(frozenset(),), (frozenset(keys[:2]),)]
    assert len(measure.calls) == (2 if left == 2 else 3)
    assert found.left_plain == tuple(keys[:left]) and programs.left_plain(tuner, "p") == frozenset(keys[:left])
    assert found.final_seconds == pytest.approx(0.98)


def test_with_no_minor_keys_a_slower_program_searches_from_the_first_key(fresh_tuning):
    keys = four_keys()
    for gains in ({}, dict.fromkeys(keys, 1e-6)):  # none claims (every key minor); all claim alike (none)
        measure = Scripted(costly=keys[0])
        found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 1), gains, tuner_for("cpu"),
                                    measure=measure)
        assert measure.calls[0] == (frozenset(),) and len(measure.calls[1][0]) >= 1
        assert len(found.left_plain) >= 1 and found.final_seconds <= 1.0


def test_a_key_left_plain_is_laxs_dot_in_the_program_and_the_next_process_reads_it(fresh_tuning):
    tuned = jat.autotune(mlp)
    with programs_traced() as seen:
        bound = keys_of(tuned, X, W1, W2, B)
    (program,) = seen
    first = bound[0]
    programs.remember(tuner_for("cpu"), program,
                      programs.ProgramRecord(1.0, 1.1, 0.99, (first.canonical(),)))
    RUNTIME.reset()  # a new process: nothing in memory, the record in the store
    again = jat.autotune(mlp)
    eqns = list(equations(jax.make_jaxpr(again)(X, W1, W2, B)))
    assert [e.params["key"] for e in eqns if e.primitive in (matmul_p, fused_p)] == bound[1:]
    assert sum(e.primitive.name == "dot_general" for e in eqns) == 1
    np.testing.assert_allclose(jax.jit(again)(X, W1, W2, B), mlp(X, W1, W2, B), rtol=2e-5, atol=2e-5)
    # the same wrapper follows a later change of its program's record (in a new jit)
    programs.remember(tuner_for("cpu"), program, programs.ProgramRecord(1.0, 1.0, 1.0, ()))
    assert keys_of(lambda *args: again(*args), X, W1, W2, B) == bound


def attention_block(params, x):
    wq, wk, wv, w1, w2 = params
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = jnp.einsum("btd,bsd->bts", q, k) / 4.0
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    h = x + jnp.einsum("bts,bsd->btd", jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1), v)
    return jnp.mean((jax.nn.gelu(h @ w1) @ w2).astype(jnp.float32) ** 2)


def optimized_hlo(fn, *args) -> list[str]:
    """The compiled training step's HLO without its debug information (op names, source
    lines) and with its parameters' names made alike."""
    text = jax.jit(jax.value_and_grad(fn)).lower(*args).compile().as_text()
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"\b(params|p)_(\d+)_", r"arg\2_", text)
    lines = text.splitlines()  # the computations, after the header and its source table
    return lines[next(i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY"))):]


def test_every_key_left_plain_is_the_plain_program_instruction_for_instruction(fresh_tuning):
    """What the check leaves plain costs nothing: with every key plain, the autotuned
    training step compiles to the plain step's optimized HLO (bf16 parameters, attention)."""
    rng = np.random.default_rng(0)
    params = tuple(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
                   for shape in [(16, 16)] * 3 + [(16, 40), (40, 16)])
    x = jnp.asarray(rng.standard_normal((2, 7, 16)), jnp.bfloat16)
    step = jat.autotune(attention_block)
    with programs_traced() as seen:
        keys = keys_of(jax.value_and_grad(step), params, x)
    assert len(keys) >= 4 and seen
    tuned = optimized_hlo(lambda params, x: step(params, x), params, x)
    for program in seen:
        programs.remember(tuner_for("cpu"), program,
                          programs.ProgramRecord(1.0, 1.1, 1.0, tuple(k.canonical() for k in keys)))
    plain = optimized_hlo(lambda params, x: step(params, x), params, x)
    assert plain == optimized_hlo(attention_block, params, x) and plain != tuned


def test_a_shipped_table_carries_the_keys_a_check_left_plain(fresh_tuning, tmp_path):
    with programs_traced() as seen:
        bound = keys_of(jat.autotune(mlp), X, W1, W2, B)
    (program,) = seen
    programs.remember(tuner_for("cpu"), program, programs.ProgramRecord(1.0, 1.1, 0.99, (bound[0].canonical(),)))
    path = jat.table().save(tmp_path / "tune_table.json")
    config.update("cache_dir", str(tmp_path / "another_machine"))
    RUNTIME.reset()
    assert keys_of(jat.autotune(mlp), X, W1, W2, B) == bound  # no check there: every key tuned
    jat.load_table(path)
    assert keys_of(jat.autotune(mlp), X, W1, W2, B) == bound[1:]  # the shipped check: the first key plain


def test_a_stored_record_that_is_not_one_is_no_record(fresh_tuning):
    assert programs.ProgramRecord.from_json({"left_plain": "all", "plain_seconds": 1}) is None
    assert programs.ProgramRecord.from_json(None) is None
    record = programs.ProgramRecord.from_json({"left_plain": ["not a key"], "plain_seconds": 1,
                                               "tuned_seconds": 1, "final_seconds": 1})
    assert record is not None and record.keys() == frozenset()


def test_warmup_compares_the_training_step_and_a_second_warmup_reads_the_check(fresh_tuning):
    def loss(params, x):
        return jnp.mean(mlp(x, *params) ** 2)

    step, params = jat.autotune(loss), (W1, W2, B)
    start = time.perf_counter()
    report = jat.warmup(step, params, X, grad=True)
    wall = time.perf_counter() - start
    check = report.program
    # each phase's wall seconds, in order, together within the call's
    assert tuple(report.seconds) == PHASES and all(s >= 0 for s in report.seconds.values())
    assert sum(report.seconds.values()) <= wall and report.seconds["check"] >= check.seconds
    assert str(report).splitlines()[-1].startswith("warmup: trace ")
    all_xla = all(e.winner == "xla_dot" for e in report)
    assert check is not None and check.keys == len(report) and str(check) in str(report)
    if all_xla:  # nothing to gain: the program as written, nothing compiled
        assert check.source == "xla" and check.compiles == 0 and len(check.left_plain) == len(report)
    else:
        assert check.source == "checked" and check.compiles >= 2
        assert check.plain_seconds > 0 and check.tuned_seconds > 0
    with warnings.catch_warnings():  # every dot left plain by the check is no plain-jnp mistake
        warnings.simplefilter("error", jat.NoTunedMatmulWarning)
        again = jat.warmup(step, params, X, grad=True)
        assert again.program.source == ("xla" if all_xla else "stored")
        assert set(again.program.left_plain) == set(check.left_plain) and again.program.keys == check.keys
        assert jat.warmup(step, params, X, grad=True, compare=False).program is None
    with pytest.warns(jat.NoTunedMatmulWarning, match="plain jnp/lax ones"):  # loss itself: no autotune
        jat.warmup(loss, params, X, grad=True)
    grads = jax.jit(jax.grad(step))(params, X)
    for got, want in zip(grads, jax.grad(loss)(params, X)):
        np.testing.assert_allclose(got, want, rtol=5e-5, atol=5e-5)


def test_under_a_device_timer_the_plain_program_compiles_while_the_keys_tune(fresh_tuning, monkeypatch):
    def loss(params, x):
        return jnp.mean(mlp(x, *params) ** 2)

    tuner = tuner_for("cpu")
    monkeypatch.setattr(tuner.timer, "measures_device_time", True)  # as a GPU's: host load does not skew it
    plain_lowering = threading.Event()
    lowered, select, exclusive = program_check.WallClock._lowered, tuner.select, DEVICE_LOCK.exclusive
    plain_compiles, holding = [], threading.local()  # per plain compile: whether it held the device alone

    class Plain:
        def __init__(self, lowered):
            self.lowered = lowered

        def compile(self):
            plain_compiles.append(getattr(holding, "device", False))
            return self.lowered.compile()

    @contextlib.contextmanager
    def holding_alone():
        with exclusive():
            holding.device = True
            try:
                yield
            finally:
                holding.device = False

    def lowering(clock, left):
        if left != clock.every_key:
            return lowered(clock, left)
        asked.append("plain")
        plain_lowering.set()
        return Plain(lowered(clock, left))

    asked, peaks_for = [], tuner.probes.peaks_for  # the probes, then the plain program

    def probing(problem):
        asked.append(problem)
        return peaks_for(problem)

    def selecting(*args, **kwargs):  # each key tunes only once the plain program is under way
        assert plain_lowering.wait(timeout=30), "the plain program waited for the keys' tuning"
        return select(*args, **kwargs)

    monkeypatch.setattr(program_check.WallClock, "_lowered", lowering)
    monkeypatch.setattr(tuner, "select", selecting)
    monkeypatch.setattr(tuner.probes, "peaks_for", probing)
    monkeypatch.setattr(DEVICE_LOCK, "exclusive", holding_alone)
    step, params = jat.autotune(loss), (W1, W2, B)
    check = jat.warmup(step, params, X, grad=True).program
    assert check.source in ("checked", "xla")
    if check.source == "checked":  # the plain program compiled once, early, alone on the device
        assert plain_compiles == [True] and check.compiles >= 2
        assert check.plain_seconds > 0 and check.tuned_seconds > 0
        assert 0 <= check.plain_compile_wait_seconds <= check.plain_compile_seconds  # its own record
    # every probe a key read was measured before the plain program took the device (prime)
    before = asked[:asked.index("plain")]
    assert before and all(problem in before for problem in asked[asked.index("plain") + 1:])
    assert programs.left_plain(tuner, next(iter(programs_seen(step, params)))) == frozenset(check.left_plain)


def programs_seen(fn, params):
    with programs_traced() as seen:
        jax.make_jaxpr(jax.value_and_grad(lambda p, x: jnp.sum(fn(p, x))))(params, X)
    return seen


def test_the_wall_clock_compiles_and_times_the_program_tuned_and_plain(fresh_tuning):
    def loss(params, x):
        return jnp.mean(mlp(x, *params) ** 2)

    step, params = jat.autotune(loss), (W1, W2, B)
    with programs_traced() as seen:
        keys = keys_of(step, params, X)
    found = program_check.check(step, (params, X), seen, dict.fromkeys(keys, 1), {}, tuner_for("cpu"))
    assert found.source == "checked" and found.compiles >= 2
    assert found.plain_seconds > 0 and found.tuned_seconds > 0 and found.final_seconds > 0


def test_a_program_whose_every_winner_is_xlas_dot_runs_as_written_without_a_compile(fresh_tuning):
    tuner = tuner_for("cpu")
    keys = keys_of(jat.autotune(mlp), X, W1, W2, B)

    def never(*lefts):
        raise AssertionError("nothing is compiled or timed")

    found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 1), {}, tuner, measure=never,
                                xla_won=frozenset(keys))
    assert found.source == "xla" and set(found.left_plain) == set(keys) and found.compiles == 0
    assert "every key's winner is XLA's dot" in str(found)
    assert programs.left_plain(tuner, "p") == frozenset(keys)
    kept = program_check.stored({"p"}, tuner, 0)  # a trace now binds none of them
    assert kept.source == "xla" and kept.keys == len(keys)


def test_a_grouped_key_left_plain_is_laxs_ragged_dot_in_the_program(fresh_tuning):
    """A grouped matmul, bare or in its context, is left plain like a dot: the program
    check can decide it (it counts its uses, and the plain program has none tuned)."""
    from jax_autotune.ragged_primitive import ragged_fused_p, ragged_p
    from jax_autotune.warmup import TUNED_PRIMITIVES
    assert {ragged_p, ragged_fused_p} <= set(TUNED_PRIMITIVES)
    sizes = jnp.array([10, 0, 14], jnp.int32)
    x, w, b = rand(4, 24, 40), rand(5, 3, 40, 48), rand(6, 48)

    def moe(x, w, b):
        return jnp.tanh(jax.lax.ragged_dot(x, w, sizes) + b), jax.lax.ragged_dot(x, w * 2.0, sizes)

    tuned = jat.autotune(moe)
    with programs_traced() as seen:
        bound = keys_of(tuned, x, w, b)
    (program,) = seen
    assert [k.groups for k in bound] == [3, 3] and not bound[0].epilogue.is_bare and bound[1].epilogue.is_bare
    for left in bound:
        programs.remember(tuner_for("cpu"), program, programs.ProgramRecord(1.0, 1.1, 0.99, (left.canonical(),)))
        again = jat.autotune(moe)
        eqns = list(equations(jax.make_jaxpr(again)(x, w, b)))
        assert [e.params["key"] for e in eqns if e.primitive in (ragged_p, ragged_fused_p)] == \
            [k for k in bound if k != left]
        assert sum(e.primitive.name == "ragged_dot_general" for e in eqns) == 1
        for got, want in zip(jax.jit(again)(x, w, b), moe(x, w, b)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def cached_step(cache, x, w):
    """A decode-like step: the cache updated at one row, and a matmul."""
    y = jnp.tanh(x @ w)
    return cache.at[0].set(y[0]), y


def test_the_wall_clock_times_a_donating_program_on_fresh_copies_never_the_callers_arrays(fresh_tuning):
    step = jat.autotune(cached_step)
    cache, w = rand(4, 24, 48), rand(5, 40, 48)
    with programs_traced() as seen:
        keys = keys_of(step, cache, X, w)
    clock = program_check.WallClock(step, (cache, X, w), seen, tuner_for("cpu"), frozenset(keys), donate=(0,))
    assert "tf.aliasing_output" in clock._lowered(frozenset()).as_text()  # the cache is donated
    # every run donates a copy: the same array twice would be a deleted buffer the second time
    (tuned, plain), = clock(frozenset())
    assert tuned > 0 and plain > 0 and not cache.is_deleted()
    undonated = program_check.WallClock(step, (cache, X, w), seen, tuner_for("cpu"), frozenset(keys))
    assert "tf.aliasing_output" not in undonated._lowered(frozenset()).as_text()


def test_warmup_checks_the_program_with_the_arguments_the_step_donates(fresh_tuning, monkeypatch):
    donated, check = [], program_check.check

    def recording(*args, **kwargs):
        donated.append(kwargs["donate"])
        return check(*args, **kwargs)

    monkeypatch.setattr(program_check, "check", recording)
    cache, w = rand(4, 24, 48), rand(5, 40, 48)
    report = jat.warmup(jat.autotune(cached_step), cache, X, w, donate_argnums=-3)
    assert donated == [(0,)] and report.program is not None and not cache.is_deleted()


@pytest.mark.parametrize("donate, error, words", [
    ("cache", TypeError, "an int or a sequence of ints"), ((0, 1.5), TypeError, "an int or a sequence"),
    (3, ValueError, "outside the 3 example arguments"), ((-4,), ValueError, "outside")])
def test_a_bad_donate_argnums_is_an_error_naming_it(fresh_tuning, donate, error, words):
    with pytest.raises(error, match="donate_argnums") as raised:
        jat.warmup(jat.autotune(cached_step), rand(4, 24, 48), X, rand(5, 40, 48), donate_argnums=donate)
    assert words in str(raised.value)


@pytest.mark.parametrize("tuned, calls", [(0.985, 1), (1.10, 2)])
def test_the_keys_xlas_dot_won_run_as_written_in_every_trial(fresh_tuning, tuned, calls):
    """Bound, a key XLA's dot won is that dot on the canonical layout: it can only add
    copies, so the first trial already has it as written, and so has every later one."""
    tuner = tuner_for("cpu")
    keys = four_keys()
    gains = {keys[0]: 5e-6, keys[1]: 0.0, keys[2]: 10e-6, keys[3]: 30e-6}  # keys 1, 3: XLA's dot won
    seen = []

    def measure(*lefts):
        seen.extend(lefts)
        return [(tuned if len(left) < 3 else 0.95, 1.0) for left in lefts]

    found = program_check.check(None, (), {"p"}, dict.fromkeys(keys, 1), gains, tuner, measure=measure,
                                xla_won=frozenset({keys[1], keys[3]}))
    assert seen[0] == frozenset({keys[1], keys[3]}) and len(seen) == calls
    assert all({keys[1], keys[3]} <= left for left in seen)
    assert found.written == 2 and set(found.left_plain) >= {keys[1], keys[3]}
    assert programs.left_plain(tuner, "p") == frozenset(found.left_plain)
    assert "its 2 keys XLA's dot won as written" in str(found)
    if tuned < 1:  # faster than plain with them as written: nothing else left plain
        assert set(found.left_plain) == {keys[1], keys[3]} and "keys left plain" not in str(found)
    else:  # no minor key beyond them; the search above them: with the least-claiming other, key 0
        assert set(found.left_plain) == {keys[0], keys[1], keys[3]} and "3 of 4 keys left plain" in str(found)


def test_the_report_counts_one_key_as_one_key(fresh_tuning):
    keys = four_keys()[:1]
    one = program_check.ProgramCheck(0.0, 0.0, 0.0, 1, tuple(keys), source="xla")
    assert "its 1 key left plain" in str(one)
    written = program_check.ProgramCheck(1.0, 0.9, 0.9, 2, tuple(keys), written=1)
    assert "its 1 key XLA's dot won as written" in str(written) and "keys left plain" not in str(written)


@pytest.mark.parametrize("form", ["autotune", "step", "jitted step", "jitted step run before"])
def test_a_function_warmup_traced_runs_as_its_check_decided_when_jitted_after(fresh_tuning, monkeypatch, form):
    """JAX keeps the traces warmup made (its cache is keyed on the function, and on a jitted
    one it calls): the step a user warms up whole and then jits must still run what the
    check decided, here every key plain."""
    check = program_check.check
    monkeypatch.setattr(program_check, "check", lambda target, args, ids, uses, *rest, **kwargs:
                        check(target, args, ids, uses, *rest, **{**kwargs, "xla_won": frozenset(uses)}))
    tuned = jat.autotune(mlp)

    def step(x, w1, w2, b):
        return tuned(x, w1, w2, b) * 2.0

    fn = {"autotune": tuned, "step": step}.get(form, jax.jit(step))
    if form == "jitted step run before":  # traced and compiled with its keys bound
        assert any(e.primitive in (matmul_p, fused_p) for e in equations(jax.make_jaxpr(fn)(X, W1, W2, B)))
        fn(X, W1, W2, B).block_until_ready()
    report = jat.warmup(fn, X, W1, W2, B)
    assert report.program.source == "xla" and len(report.program.left_plain) == 2
    for traced in (jax.make_jaxpr(fn)(X, W1, W2, B), jax.jit(fn).trace(X, W1, W2, B).jaxpr):
        eqns = list(equations(traced))
        assert not [e for e in eqns if e.primitive in (matmul_p, fused_p)]
        assert sum(e.primitive.name == "dot_general" for e in eqns) == 2
    want = mlp(X, W1, W2, B) * (1.0 if form == "autotune" else 2.0)
    np.testing.assert_allclose(fn(X, W1, W2, B), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("jitted", [False, True])
def test_each_trial_of_the_check_lowers_its_own_program_for_a_jitted_step_too(fresh_tuning, jitted):
    """A jitted step keeps its first trace in JAX's caches: each trial (here every key plain,
    then none) must still lower the program of its own set, not the first one traced."""
    tuned = jat.autotune(mlp)

    def step(x, w1, w2, b):
        return tuned(x, w1, w2, b) * 2.0

    target = jax.jit(step) if jitted else step
    with programs_traced() as seen:
        keys = frozenset(keys_of(target, X, W1, W2, B))
    clock = program_check.WallClock(target, (X, W1, W2, B), seen, tuner_for("cpu"), keys)
    plain, bound = (clock._lowered(left).as_text() for left in (keys, frozenset()))
    assert plain != bound
    assert plain == clock._lowered(keys).as_text()  # and again, the same set: the same program


def pointers(tree):
    return [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(tree)]


class Recording:
    """A stand-in program: keeps its arguments' buffer addresses and values per run."""

    def __init__(self):
        self.addresses, self.values = [], []

    def __call__(self, *args):
        self.addresses.append(pointers(args))
        self.values.append([np.asarray(leaf) for leaf in jax.tree.leaves(args)])
        return jnp.zeros(())


def test_the_wall_clock_moves_the_arguments_between_runs_as_a_loop_feeding_its_outputs_back(fresh_tuning):
    cache, params = rand(4, 24, 48), {"w": rand(5, 40, 48), "b": rand(6, 48)}
    clock = program_check.WallClock(cached_step, (cache, X, params), set(), tuner_for("cpu"), frozenset(),
                                    donate=(0,))
    first, second = Recording(), Recording()
    for _ in range(3):  # two programs in turns: each alternates on its own
        clock._run(first)
        clock._run(second)
    callers = pointers((X, params))
    for program in (first, second):
        undonated = [run[1:] for run in program.addresses]
        assert undonated[0] == callers and undonated[2] == callers  # the caller's arrays, then a copy
        assert not set(undonated[1]) & set(callers)
        assert all(run[0] not in (cache.unsafe_buffer_pointer(), *callers) for run in program.addresses)
        want = [np.asarray(leaf) for leaf in jax.tree.leaves((cache, X, params))]
        for values in program.values:  # the same values every run
            for got, expected in zip(values, want):
                np.testing.assert_array_equal(got, expected)
    assert first.addresses[1][1:] == second.addresses[1][1:]  # one copy, shared
    assert not cache.is_deleted()
    clock.close()
    assert clock._moved is None


def test_with_no_memory_for_the_copy_the_wall_clock_warns_and_times_on_the_callers_arrays(
        fresh_tuning, monkeypatch):
    clock = program_check.WallClock(mlp, (X, W1, W2, B), set(), tuner_for("cpu"), frozenset())
    monkeypatch.setattr(program_check, "_copy", lambda leaf: (_ for _ in ()).throw(
        RuntimeError("RESOURCE_EXHAUSTED: out of memory")))
    program = Recording()
    with pytest.warns(jat.JaxAutotuneWarning, match="could not run on a copy of the arguments"):
        for _ in range(3):
            clock._run(program)
    assert program.addresses == [pointers((X, W1, W2, B))] * 3


def test_a_run_that_fails_on_the_copy_warns_and_runs_again_on_the_callers_arrays(fresh_tuning):
    clock = program_check.WallClock(mlp, (X, W1, W2, B), set(), tuner_for("cpu"), frozenset())
    callers, seen = pointers((X, W1, W2, B)), []

    def program(*args):  # out of memory beside the copy: only on arguments that are not the caller's
        seen.append(pointers(args))
        if seen[-1] != callers:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
        return jnp.zeros(())

    clock._run(program)
    with pytest.warns(jat.JaxAutotuneWarning, match="could not run on a copy"):
        assert clock._run(program) > 0
    clock._run(program)
    assert seen[0] == seen[2] == seen[3] == callers and seen[1] != callers and clock._moved is clock.args
