"""Pre-tuning: tune every key a list of shapes or a traced function will need.

    >>> jat.warmup([(1024, 1024, 1024), (8, 512, 512, 64)], dtype="bfloat16")
    >>> report = jat.warmup(train_step, params, batch, grad=True)
    >>> print(report)            # per key: winner, its time, XLA dot's time, source

``warmup(fn, *args)`` traces ``fn`` (with ``grad=True``, instead, the training step:
``jax.value_and_grad`` of its first output with respect to its first argument, whose
forward matmuls have other contexts than ``fn``'s alone: values the backward keeps end
them; warm up an evaluation step with its own call), walks every nested jaxpr (pjit, scan, while,
cond, custom_vjp/jvp, remat, shard_map) and tunes each matmul key it finds, so that
compiling ``fn`` afterwards tunes nothing. When an argument is sharded over several
devices, the keys a compile asks for are per-shard keys that only XLA's partitioner
knows: then warmup compiles ``jax.jit(fn)`` (and its grad) for the arguments, and the
report lists the keys that compile asked for.

``warmup(fn)`` tunes the matmuls that compiling ``fn`` itself asks for; it never rewrites
``fn``. A plain function's ``jnp``/``lax`` matmuls are not tuned when it is compiled, so
tuning them would only help a ``jat.autotune(fn)`` the caller may never run: warmup of such
a function tunes nothing and warns (``NoTunedMatmulWarning``) with the fix, to pass the
same ``jat.autotune(fn)`` to warmup and to ``jax.jit``:

    >>> step = jat.autotune(train_step)
    >>> jat.warmup(step, params, batch, grad=True)
    >>> jax.jit(step)(params, batch)                 # tunes nothing now

For a ``jat.autotune`` function, its trace also decides each softmax attention it finds
(fused or as written, ``jax_autotune.attention_tuning``; ``report.attention``), and warmup
ends by timing the whole program tuned against plain and leaving the keys that make it
slower to lax (or as written) in it (``program_check``; ``report.program``; ``compare=False``
skips it).

In a jax.distributed job, every process walks the same key list from its own offset, so
the processes tune different keys first and each ends with every decision. On a GPU two
keys tune at once (``KEY_THREADS``); on a CPU, whose timings are host clocks, one. First
(``Tuner.prime``), on a GPU, XLA's GEMM autotuner tunes the XLA dots of every key to be
tuned, many in one compile, which keeps all cores busy (each key's own compiles of them
then take XLA's kept choices), and the device's probes those keys need are measured, before
the plain program's compile takes the device.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp

from jax_autotune.columns import aligned
from jax_autotune.errors import NoTunedMatmulWarning
from jax_autotune.tuning.decision import Decision, Source
import jax_autotune.config as config
from jax_autotune.key import MatmulKey
from jax_autotune import program_check
from jax_autotune.attention_tuning import decisions_seen
from jax_autotune.autotune import _tuner_serves, programs_traced
from jax_autotune.tuning.attention_decisions import AttentionDecision
from jax_autotune.jaxprs import equations
from jax_autotune.program_check import ProgramCheck
from jax_autotune.problem import MatmulProblem, dtype_named, problem_for
from jax_autotune.primitive import fused_p, matmul_p
from jax_autotune.ragged_primitive import ragged_fused_p, ragged_p

TUNED_PRIMITIVES = (matmul_p, fused_p, ragged_p, ragged_fused_p)  # the ops a tuned key is bound as
from jax_autotune.registry import ragged_tuner_for, tuner_for
from jax_autotune.tuning.consensus import current_job
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.progress import over_keys
from jax_autotune.tuning.threads import carrying_x64
from jax_autotune.tuning.tuner import record_decisions
from jax_autotune.tuning import programs
from jax_autotune.kernels.ragged import XLA_RAGGED_NAME
from jax_autotune.kernels.xla import XLA_DOT_NAME


try:  # jax internals (0.10 and 0.11): the dead-code pass jit runs on a traced program
    from jax._src.interpreters.partial_eval import dce_jaxpr as _dce_jaxpr
except ImportError:  # pragma: no cover - a jax that moved it: keys of dead code are tuned too
    _dce_jaxpr = None

KEY_THREADS = 2  # keys tuned at once where the tuner times on the device (GPUs)
# a warmup's phases, in order (``WarmupReport.seconds``): tracing fn (deciding its attentions
# too), readying the device (XLA's GEMM autotuning of the keys' dots in one compile on GPUs,
# the probes), the keys' tunings, the program check
PHASES = ("trace", "prime", "tune", "check")


@dataclasses.dataclass(frozen=True)
class WarmupEntry:
    key: MatmulKey
    problem: MatmulProblem
    winner: str
    winner_seconds: float | None
    xla_seconds: float | None
    source: Source
    reason: str = ""  # why the winner is XLA's dot without a benchmark, when it is

    @classmethod
    def of(cls, decision: Decision) -> "WarmupEntry":
        xla = decision.result(XLA_RAGGED_NAME if decision.key.groups else XLA_DOT_NAME)  # XLA's own op
        return cls(decision.key, decision.problem, decision.winner, decision.winner_seconds,
                   xla.score if xla else None, decision.source, decision.reason)


@dataclasses.dataclass(frozen=True)
class WarmupReport:
    entries: tuple[WarmupEntry, ...]
    program: ProgramCheck | None = None  # warmup(jat.autotune(fn), ...): the program tuned vs plain
    attention: tuple[AttentionDecision, ...] = ()  # jat.autotune(fn)'s attentions, one per key
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # wall seconds by phase (PHASES)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[WarmupEntry]:
        return iter(self.entries)

    def count(self, source: str) -> int:
        return sum(1 for e in self.entries if e.source == source)

    def __str__(self) -> str:
        """One line per key tuned: ``problem``, the warmed shape (real sizes; its key, as
        ``jax-autotune show`` prints it, buckets them), its epilogue after ``|``;
        ``winner``; ``us`` the winner's time and ``xla us`` XLA's own op's, in
        microseconds; ``source`` where the decision came from (tuned, memory, store,
        fallback); ``why`` the reason a key runs XLA's op without a benchmark. Then the
        program check, where there was one, and the seconds of each phase."""
        def us(seconds):
            return f"{seconds * 1e6:.1f}" if seconds else "-"

        cells = [("problem", "winner", "us", "xla us", "source", "why")] + [
            (e.problem.describe(), e.winner, us(e.winner_seconds), us(e.xla_seconds), e.source, e.reason)
            for e in self.entries]
        lines = aligned(cells, right={2, 3})
        if not self.entries:
            lines.append("(no tuned matmul: nothing to tune)")
        for decision in self.attention:
            times = ", ".join(f"{name} {seconds * 1e6:.1f} us" for name, seconds in decision.seconds.items())
            lines.append(f"{decision.key.describe()}: {decision.winner} ({times or 'not timed'}) [{decision.source}]")
        if self.program is not None:
            lines.append(str(self.program))
        if self.seconds:
            lines.append("warmup: " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.seconds.items()))
        return "\n".join(lines)


def matmul_problems(closed_jaxpr) -> list[tuple[MatmulProblem, MatmulKey]]:
    """Every (problem, key) bound in a jaxpr and the jaxprs nested in it, in order, unique;
    without the equations whose results nothing reads (jit drops them before it lowers)."""
    jaxpr = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    if _dce_jaxpr is not None:
        jaxpr, _ = _dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    found = {(eqn.params["problem"], eqn.params["key"]): None
             for eqn in equations(jaxpr) if eqn.primitive in TUNED_PRIMITIVES}
    return list(found)


def _problems_of_shapes(shapes, dtype, precision, transpose_a, transpose_b) -> list[MatmulProblem]:
    problems = []
    for index, shape in enumerate(shapes):
        if isinstance(shape, MatmulProblem):  # exactly this matmul and epilogue (KeyNotTunedError names one)
            problems.append(shape)
            continue
        if isinstance(shape, (tuple, list)) and len(shape) == 2 and all(hasattr(s, "shape") for s in shape):
            lhs, rhs = shape
        elif isinstance(shape, (tuple, list)) and len(shape) in (3, 4) and all(
                isinstance(d, int) and d >= 1 for d in shape):
            batch, m, n, k = shape if len(shape) == 4 else (1, *shape)
            lead = (batch,) if len(shape) == 4 else ()
            lhs = jax.ShapeDtypeStruct((*lead, k, m) if transpose_a else (*lead, m, k), dtype)
            rhs = jax.ShapeDtypeStruct((*lead, n, k) if transpose_b else (*lead, k, n), dtype)
        else:
            raise ValueError(f"warmup: shapes[{index}] = {shape!r}; expected (m, n, k), "
                             f"(batch, m, n, k) of positive ints, a (lhs, rhs) pair of "
                             f"jax.ShapeDtypeStruct, or a jax_autotune.MatmulProblem")
        problems.append(problem_for(lhs, rhs, transpose_a=transpose_a, transpose_b=transpose_b,
                                    precision=precision))
    return problems


def _first_output(fn: Callable) -> Callable:
    def scalar(*args):
        out = fn(*args)
        first = jax.tree_util.tree_leaves(out)[0]
        return jnp.sum(first.astype(jnp.float32)) if first.ndim else first.astype(jnp.float32)
    return scalar


def warmup(shapes_or_fn, *example_args, dtype: Any = "float32", precision=None,
           transpose_a: bool = False, transpose_b: bool = False, grad: bool = False,
           platform: str | None = None, progress: bool | None = None,
           compare: bool = True, donate_argnums: int | Sequence[int] = ()) -> WarmupReport:
    """Tune every key of ``shapes`` or of ``fn(*example_args)``; returns a ``WarmupReport``.

        >>> jat.warmup([(1024, 1024, 1024)], dtype="bfloat16")
        >>> jat.warmup([jat.MatmulProblem(1, 64, 32, 48, "bfloat16", "bfloat16", "float32")])
        >>> jat.warmup(jat.autotune(loss_fn), params, batch, grad=True)
        >>> jat.warmup(jat.autotune(decode), params, cache, tokens, pos, donate_argnums=1)
        >>> jat.warmup(train_step, params, opt_state, batch)  # jits jat.autotune(loss), optimizer and all

    ``grad=True``: the keys of the training step (value and gradient) only, not those of
    ``fn`` run alone. A ``fn`` whose matmuls a compile would not tune (plain ``jnp``/``lax`` ones) gives a
    ``NoTunedMatmulWarning`` naming the fix, ``jat.warmup(jat.autotune(fn), ...)``.
    ``progress``: a bar over the keys on stderr (default: the ``progress`` setting, which
    shows it on a terminal); meanwhile no key shows a line of its own.
    ``compare``: for a ``jat.autotune`` function, time the whole program (``fn``, or with
    ``grad=True`` its value and gradient) tuned against plain, and leave the dots of the keys
    that make it slower to lax in that program (``program_check``; ``report.program``); so
    pass the function your step jits, whole (a decode step with its sampling in it; for
    training the whole step, its optimizer in it, since ``grad=True`` checks the value and
    gradient alone and does not see what the step costs around the update): a ``fn`` that
    returns logits the step reduces is another program.
    ``donate_argnums``: the positions of ``example_args`` your jitted step donates (as
    ``jax.jit``'s): the check times the program donating them, as the step runs it (a
    decode step's KV cache updated in place); it donates copies, never your arrays.
    Warmup's traces are its own (``program_check.fresh_traces``): a jitted ``fn``, or one it
    calls, traces again for it and for each of the check's trials, and a later ``jax.jit`` of
    ``fn`` never gets a trace made before the check. A check that changes what a program
    leaves plain also clears JAX's caches (``jax.clear_caches()``), so a step jitted before
    warmup traces again on its next call, with the check's result; other jitted functions
    compile again on theirs.
    The settings (mode, level, budget, ...) are read once, here (a bad one: ``ConfigError``).
    """
    policy = config.policy()
    seconds: dict[str, float] = {}
    donate = _positions(donate_argnums, len(example_args))
    if callable(shapes_or_fn):
        fns = [shapes_or_fn]
        if grad:  # a training step's keys: its forward under autodiff is not fn's alone
            if not example_args:
                raise ValueError("warmup(fn, *example_args, grad=True) needs example arguments")
            fns = [jax.value_and_grad(_first_output(shapes_or_fn))]
        if _spans_devices(example_args):
            report = _warmup_by_compiling(fns, example_args)
            if not report.entries:
                _warn_untuned([jax.make_jaxpr(fn)(*example_args) for fn in fns])
            return report
        # fresh: a jitted fn traced before would hide its programs; and its next jit after the
        # check must not get this trace, made before the check
        with _phase(seconds, "trace"), programs_traced() as program_ids, decisions_seen() as attentions, \
                program_check.fresh_traces():
            jaxprs = [jax.make_jaxpr(fn)(*example_args) for fn in fns]
        work = list(dict.fromkeys(pair for jaxpr in jaxprs for pair in matmul_problems(jaxpr)))
    else:
        if example_args:
            raise TypeError("warmup(shapes, ...): extra positional arguments are only for warmup(fn, *args)")
        dtype = dtype_named(dtype, "warmup: dtype")
        work = [(p, p.key(policy.level)) for p in _problems_of_shapes(shapes_or_fn, dtype, precision,
                                                          transpose_a, transpose_b)]
    tuner = tuner_for(platform or jax.default_backend())
    # a jat.autotune fn whose every dot an earlier program check left plain traces none tuned
    if callable(shapes_or_fn) and not work and program_check.stored(program_ids, tuner, 0) is None:
        _warn_untuned(jaxprs)
    checks = (callable(shapes_or_fn) and compare and policy.tunes and bool(program_ids)
              and platform in (None, jax.default_backend()))
    uses = _uses(jaxprs, attentions) if checks else {}
    clock = None
    if uses and tuner.timer.measures_device_time and program_check.stored(program_ids, tuner, len(uses)) is None:
        # the plain program needs no decision: it compiles while the keys tune
        clock = program_check.WallClock(fns[0], example_args, program_ids, tuner, frozenset(uses), donate)
    entries = _tuned(work, tuner, progress, policy, seconds, then=clock.start_plain if clock else None)
    attention = tuple({d.key: d for d in attentions}.values()) if callable(shapes_or_fn) else ()
    program = None
    if checks:
        before = programs.generation()
        with _phase(seconds, "check"):
            program = _compared(fns[0], example_args, uses, entries, attentions, program_ids, tuner, clock,
                                donate)
        if programs.generation() != before:
            # a step jitted before this warmup keeps its trace (JAX's caches, keyed on the
            # function): cleared, its next call traces again and reads what the check kept
            jax.clear_caches()
    return WarmupReport(tuple(entries), program, attention, seconds)


def _positions(donate_argnums, count: int) -> tuple[int, ...]:
    """``donate_argnums`` (an int or ints, as ``jax.jit``'s) as positions in ``range(count)``."""
    given = (donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums
    try:
        given = tuple(given)
    except TypeError:
        given = None
    if given is None or not all(isinstance(p, int) and not isinstance(p, bool) for p in given):
        raise TypeError(f"warmup: donate_argnums must be an int or a sequence of ints, got {donate_argnums!r}")
    if any(not -count <= p < count for p in given):
        raise ValueError(f"warmup: donate_argnums {donate_argnums!r} names a position outside the "
                         f"{count} example arguments")
    return tuple(sorted({p % count for p in given}))


@contextlib.contextmanager
def _phase(seconds: dict[str, float], name: str):
    """Adds the wall seconds of the block to ``seconds[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


def _tuned(work: list[tuple[MatmulProblem, MatmulKey]], tuner, progress, policy: Policy,
           seconds: dict[str, float], then: Callable[[], None] | None = None) -> list[WarmupEntry]:
    """Each key of ``work`` decided (tuned where it must be), in the report's order; the
    phases' wall seconds (prime, tune) added to ``seconds``. ``then()`` is called between
    the phases: after XLA's autotuning of every key's dots and the probes, which hold the
    device alone."""
    job = current_job()
    if job is not None and work:  # each process starts on its own share of the list
        offset = len(work) * job.process_index // job.process_count
        work = work[offset:] + work[:offset]
    first_problem: dict[MatmulKey, MatmulProblem] = {}
    # bare keys first: a context key then skips what lost on its bare product (tuning.reuse)
    for problem, key in sorted(work, key=lambda pair: not pair[1].epilogue.is_bare):
        first_problem.setdefault(key, problem)
    # with a device timer, keys tune side by side: one key's compiles overlap another's
    # timing (every timing holds the device alone); a host clock needs the host quiet
    threads = KEY_THREADS if tuner.timer.measures_device_time else 1
    # each key's tuner readies the device for it: XLA autotunes the dense keys' dots in one
    # compile (GPUs; the grouped tuner has no XLA-autotuned candidate), the probes are measured
    by_tuner: dict = {}
    for key, problem in first_problem.items():
        by_tuner.setdefault(_tuner_of(key, tuner), []).append((key, problem))
    with _phase(seconds, "prime"):
        for each, pairs in by_tuner.items():
            each.prime(pairs, policy)
    if then is not None:
        then()
    with _phase(seconds, "tune"), over_keys(len(first_problem), progress, policy.progress) as track, \
            concurrent.futures.ThreadPoolExecutor(threads) as pool:
        decisions = pool.map(carrying_x64(lambda item: _tuner_of(item[0], tuner).select(item[1], item[0], policy)),
                             first_problem.items())
        return [WarmupEntry.of(decision) for decision in track(decisions)]


def _tuner_of(key: MatmulKey, tuner):
    """``tuner``, or for a grouped matmul's key its platform's grouped tuner."""
    return ragged_tuner_for(tuner.device.platform) if key.groups else tuner


def _uses(jaxprs, attentions) -> dict:
    """The program check's keys and how many times the program uses each: the tuned
    matmuls' and the fused attentions' (``attentions``: the decisions the trace used, one
    per attention; left plain, an attention runs as written)."""
    uses: dict = {}
    for eqn in (e for jaxpr in jaxprs for e in equations(jaxpr)):
        if eqn.primitive in TUNED_PRIMITIVES:
            uses[eqn.params["key"]] = uses.get(eqn.params["key"], 0) + 1
    for decision in attentions:
        if decision.fused:
            uses[decision.key] = uses.get(decision.key, 0) + 1
    return uses


def _compared(target, args, uses, entries, attentions, program_ids, tuner,
              clock, donate: tuple[int, ...] = ()) -> ProgramCheck | None:
    """The program tuned against plain (``program_check``), its keys ``uses``; an earlier
    check's result when nothing was tuned now. ``clock``: the check's measure, its plain
    program compiling since the keys started tuning (``WallClock.start_plain``), or None."""
    try:
        fused = [d for d in attentions if d.fused]
        if not any(e.source == Source.TUNED for e in entries) and not any(d.source == "tuned" for d in fused):
            earlier = program_check.stored(program_ids, tuner, len(uses))
            if earlier is not None:
                return earlier
        gains = {e.key: e.xla_seconds - e.winner_seconds for e in entries
                 if e.xla_seconds is not None and e.winner_seconds is not None}
        gains.update({d.key: d.gain_seconds for d in fused})
        xla_won = frozenset(e.key for e in entries if e.winner in (XLA_DOT_NAME, XLA_RAGGED_NAME))
        return program_check.check(target, args, program_ids, uses, gains, tuner, measure=clock,
                                   xla_won=xla_won, donate=donate)
    finally:
        if clock is not None:  # a check that compiled nothing: its plain compile ends here
            clock.close()


def _warn_untuned(jaxprs) -> None:
    """Warn that a compile of the traced function tunes none of its matmuls, and why."""
    eqns = [eqn for jaxpr in jaxprs for eqn in equations(jaxpr)]
    dots = [eqn for eqn in eqns if eqn.primitive.name == "dot_general"]
    plain = sum(1 for eqn in dots if _tuner_serves(eqn))
    if any(eqn.primitive in TUNED_PRIMITIVES for eqn in eqns):
        message = "its tuned matmuls feed no output, so a compile drops them"
    elif plain:
        message = (f"its matmuls ({plain} traced) are plain jnp/lax ones, which compiling fn does not "
                   f"tune. Use jat.warmup(jat.autotune(fn), ...) and run that same "
                   f"jat.autotune(fn) (e.g. under jax.jit), or call jat.matmul / jat.dot_general "
                   f"inside fn")
    elif dots:
        message = f"its matmuls ({len(dots)} traced) are of dtypes or precisions only XLA's dot serves"
    else:
        message = "fn has no matmul"
    warnings.warn(f"jax_autotune: warmup(fn) found no tuned matmul: {message}.", NoTunedMatmulWarning,
                  stacklevel=3)


def _spans_devices(args) -> bool:
    """Whether an argument is (or is to be) sharded over more than one device."""
    for leaf in jax.tree_util.tree_leaves(args):
        sharding = getattr(leaf, "sharding", None)
        devices = getattr(sharding, "device_set", None)
        if devices is not None and len(devices) > 1:
            return True
    return False


def _warmup_by_compiling(fns: list[Callable], example_args: tuple) -> WarmupReport:
    """Compile ``jax.jit(fn)`` of each fn for sharded arguments: XLA's partitioner asks for
    every per-shard key while it compiles, and the tuner of the arguments' devices decides
    each (so ``platform`` does not apply, and there is no progress bar)."""
    with record_decisions() as asked:
        for fn in fns:
            jax.jit(fn).lower(*example_args).compile()
    by_key: dict[MatmulKey, Decision] = {}
    for decision in asked:
        by_key.setdefault(decision.key, decision)
    return WarmupReport(tuple(WarmupEntry.of(d) for d in by_key.values()))
