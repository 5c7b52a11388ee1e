"""Deciding each attention ``jat.autotune`` finds: as written, or fused, by measurement.

For an attention's key (``AttentionKey``) the candidates are the attention as written
(its equations, which XLA runs) and the fused implementations of
``jax.nn.dot_product_attention`` this device has (``implementations``: cuDNN's on a CUDA
GPU, for f16/bf16 and head dims up to 128 in multiples of 8). Each is compiled as a
training step sees it, forward and backward (``jax.vjp`` with a random cotangent; all of
them at once, on threads), run on fresh random q, k and v, checked against a float64
reference on sampled (batch, kv head) slices, each with the query heads that read it
(output and the three gradients, norm-wise, the dtype's tolerance; twice it for
gradients), and timed (the device timer's clock: CUPTI on a GPU). The as-written program
is checked too: where it disagrees with the reference, the pattern was misread and
nothing is fused. The fastest right one wins; the decision is kept by key
(``tuning.attention_decisions``) and the next process reads it, unchecked: another
attention of the same key takes it, so ``attention.find`` must read each one right.

    >>> choose = choice(config.compile_policy())   # at a trace of an autotuned function
    >>> choose(match)                               # 'cudnn', or None: as written
    'cudnn'

Nothing is fused where no implementation serves the key (a CPU), under mode ``off``, with
``context`` off, in a job of several processes (each would decide alone), under forward-mode
autodiff or vmap (``jat.autotune`` runs the program as written there), or where the
program check left the key as written; modes ``cached`` and ``require`` use kept
decisions only (a miss runs as written: never an error).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_autotune.api import left_plain_keys
from jax_autotune.attention import LEFT_PLAIN, Match, fused
from jax_autotune.attention_key import AttentionKey
from jax_autotune.registry import tuner_for
from jax_autotune.tuning.attention_decisions import (AS_WRITTEN, AttentionDecision, checksum, known,
                                                     remember)
from jax_autotune.tuning.compile_options import compile_lowered
from jax_autotune.tuning.correctness import input_tolerance, relative_error
from jax_autotune.tuning.device_lock import DEVICE_LOCK
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.threads import carrying_x64
from jax_autotune.tuning.timing import program_seconds

# platform -> the fused implementations of jax.nn.dot_product_attention tried there
FUSED = {"gpu": ("cudnn",), "cuda": ("cudnn",)}
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128
REFERENCE_SLICES = 2  # (batch, kv head) slices the float64 reference computes
GRADIENT_TOLERANCE_FACTOR = 2.0  # a gradient's tolerance: this times the output's

_seen: list[list] = []


def implementations(platform: str, key: AttentionKey) -> tuple[str, ...]:
    """The fused implementations that may serve ``key`` on ``platform``.

        >>> implementations("gpu", key)     # bf16, head_dim 64
        ('cudnn',)
    """
    found = []
    for name in FUSED.get(platform, ()):
        if name == "cudnn" and (key.dtype not in CUDNN_DTYPES or key.head_dim > CUDNN_MAX_HEAD_DIM
                                or key.head_dim % 8):
            continue
        found.append(name)
    return tuple(found)


def choice(policy: Policy) -> Callable[[Match], str | None] | None:
    """``choose(match)``: the implementation that computes the attention ``match``, fused,
    None (as written, its dots tuned), or ``LEFT_PLAIN`` where the program check left its key
    plain (as written, its dots lax's); decides its key where no decision is kept and
    ``policy`` tunes.
    None where nothing can be fused here (no attention need be looked for)."""
    platform = jax.default_backend()
    if (policy.mode == "off" or policy.context == "off" or jax.process_count() > 1
            or not FUSED.get(platform)):
        return None
    left = left_plain_keys()

    def choose(match: Match) -> str | None:
        if match.key in left:  # the program check found it costs the program: as the user wrote it
            return LEFT_PLAIN
        if not implementations(platform, match.key):
            return None
        try:
            decision = decide(tuner_for(platform), match, policy)
        except Exception:  # noqa: BLE001 - a bad store or setting: the attention as written
            return None
        for seen in _seen:
            seen.append(decision)
        return decision.winner if decision.fused else None

    return choose


@contextlib.contextmanager
def decisions_seen():
    """The attention decisions the traces meanwhile used (one per attention, in order).

        >>> with decisions_seen() as seen:
        ...     jax.make_jaxpr(jat.autotune(loss))(params, batch)
    """
    seen: list[AttentionDecision] = []
    _seen.append(seen)
    try:
        yield seen
    finally:
        _seen.remove(seen)


def decide(tuner, match: Match, policy: Policy) -> AttentionDecision:
    """The decision for ``match``'s key on ``tuner``'s device: kept, or tuned now."""
    names = implementations(tuner.device.platform, match.key)
    check = checksum((AS_WRITTEN, *names))
    found = known(tuner, match.key, check)
    if found is not None:
        return found
    if not policy.tunes:
        return AttentionDecision(match.key, AS_WRITTEN, rejected={name: f"not tuned under mode {policy.mode}"
                                                                  for name in names}, source="fallback")
    decision = tune(tuner, match, names)
    remember(tuner, decision, check)
    return decision


def tune(tuner, match: Match, names) -> AttentionDecision:
    """Every candidate of ``match`` run forward and backward, checked and timed (see the
    module docstring)."""
    with jax.ensure_compile_time_eval(), jax.transfer_guard("allow"):
        args = _random_inputs(match)
        want = _reference(match, *(np.asarray(a, np.float64) for a in args))
        tol = input_tolerance(match.key.dtype, tuner.device.platform)
        seconds, rejected = {}, {}
        compiling = _compiling_at_once(match, args, names)
        for name, program in compiling.items():
            try:
                compiled = program.result()
                got = [np.asarray(x, np.float64) for x in compiled(*args)]
                errors = [relative_error(g[where], w)
                          for g, where, w in zip(_sliced(match, got), want.slices, want.values)]
                limits = [tol] + [tol * GRADIENT_TOLERANCE_FACTOR] * 3
                wrong = [f"{what} {e:.3g} > {lim:.3g}" for what, e, lim in
                         zip(("out", "dq", "dk", "dv"), errors, limits) if not e <= lim]
                if wrong:
                    rejected[name] = "wrong result: " + ", ".join(wrong)
                    continue
                seconds[name] = program_seconds(tuner.timer, compiled, args)
            except Exception as err:  # noqa: BLE001 - a candidate's failure is its own
                rejected[name] = f"{type(err).__name__}: {str(err)[:200]}"
        tuner.timer.release()
    if AS_WRITTEN not in seconds:  # the attention as read is not the program's: never fused
        return AttentionDecision(match.key, AS_WRITTEN, {}, rejected)
    winner = min(seconds, key=lambda n: (seconds[n], n != AS_WRITTEN))
    return AttentionDecision(match.key, winner, seconds, rejected)


def _compiling_at_once(match: Match, args, names) -> dict[str, concurrent.futures.Future]:
    """The attention as written and each fused implementation of ``names``, compiled
    (``_compiled``) on threads at once: XLA compiles without the GIL, and only the
    as-written program's compile (XLA's GEMM autotuner) holds the device."""
    programs = {AS_WRITTEN: match.written}
    programs.update({name: (lambda q, k, v, name=name: fused(match, q, k, v, name)) for name in names})
    device = jax.config.jax_default_device  # a thread's setting (jax.default_device): carried over

    def compiled(fn, exclusive):
        with jax.default_device(device):
            return _compiled(fn, args, exclusive)

    with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
        return {name: pool.submit(carrying_x64(compiled), fn, name == AS_WRITTEN) for name, fn in programs.items()}


def _compiled(fn, args, exclusive: bool):
    """``fn``'s forward and backward in one executable: (q, k, v, cotangent) -> (out,
    dq, dk, dv). XLA's GEMM autotuner runs kernels while compiling XLA's dots: alone."""
    def step(q, k, v, cotangent):
        out, pullback = jax.vjp(fn, q, k, v)
        return (out, *pullback(cotangent))

    lowered = jax.jit(step).lower(*args)
    with DEVICE_LOCK.exclusive() if exclusive else contextlib.nullcontext():
        return compile_lowered(lowered)


def _random_inputs(match: Match) -> tuple:
    """Fresh standard-normal q, k, v and cotangent in their dtypes, on the default device."""
    rng = np.random.default_rng(0)
    avals = [a.aval for a in (match.q, match.k, match.v)] + [match.output.aval]
    return tuple(jax.device_put(jnp.asarray(rng.standard_normal(a.shape, np.float32), a.dtype)) for a in avals)


class _Reference:
    """Float64 out, dq, dk, dv (``values``) at the (batch, head) slices ``slices`` of each:
    query heads for out and dq, kv heads for dk and dv."""

    def __init__(self, slices, values):
        self.slices, self.values = slices, values


def _sliced(match: Match, arrays):
    """out, dq, dk, dv in (batch, sequence, heads, head_dim), as the reference holds them."""
    out, dq, dk, dv = arrays
    inverse = np.argsort(match.out_perm)
    return [np.transpose(out, inverse)] + [np.transpose(x, p) for x, p in zip((dq, dk, dv), match.perms)]


def _reference(match: Match, q, k, v, cotangent) -> _Reference:
    """Float64 out, dq, dk, dv of the attention on ``REFERENCE_SLICES`` (batch, kv head)
    pairs: each kv head with every query head of its group (dk and dv summed over them)."""
    key = match.key
    group = key.heads // key.kv_heads
    qs, ks, vs = (np.transpose(x, p) for x, p in zip((q, k, v), match.perms))  # (B, T|S, N|K, D)
    ct = np.transpose(cotangent, np.argsort(match.out_perm))
    pairs = [(b, j) for b in range(key.batch) for j in range(key.kv_heads)]
    rng = np.random.default_rng(1)
    picked = sorted(rng.choice(len(pairs), min(REFERENCE_SLICES, len(pairs)), replace=False))
    bs, js = np.array([pairs[i][0] for i in picked]), np.array([pairs[i][1] for i in picked])
    outs, dks, dvs = [[], []], [], []
    for b, j in zip(bs, js):
        dk = dv = 0.0
        for h in range(j * group, (j + 1) * group):
            out, dq, dk_h, dv_h = _attention_grads(qs[b, :, h], ks[b, :, j], vs[b, :, j], ct[b, :, h],
                                                   match.scale, key.causal)
            outs[0].append(out)
            outs[1].append(dq)
            dk, dv = dk + dk_h, dv + dv_h
        dks.append(dk)
        dvs.append(dv)
    # each (B, T, N, D) array sliced at the picked pairs' query heads, (B, S, K, D) at their kv heads
    heads = (js[:, None] * group + np.arange(group)).ravel()
    on_queries = (np.repeat(bs, group), slice(None), heads, slice(None))
    on_kv = (bs, slice(None), js, slice(None))
    return _Reference([on_queries, on_queries, on_kv, on_kv], [np.stack(o) for o in (*outs, dks, dvs)])


def _attention_grads(q, k, v, dout, scale: float, causal: bool):
    """out, dq, dk, dv of ``softmax(scale * q k^T + mask) v`` for one (t, d) slice."""
    scores = scale * q @ k.T
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape, bool)), scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs @ v
    dv = probs.T @ dout
    dprobs = dout @ v.T
    dscores = probs * (dprobs - np.sum(dprobs * probs, axis=-1, keepdims=True))
    return out, scale * dscores @ k, scale * dscores.T @ q, dv


__all__ = ["FUSED", "implementations", "choice", "decisions_seen", "decide", "tune"]
