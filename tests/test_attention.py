"""Softmax attention under ``jat.autotune``: found in the jaxpr, keyed, decided by measurement,
fused where that wins, with JAX's values and gradients.

On a CPU no fused implementation serves a key (cuDNN's is a GPU's), so these tests give the
CPU ``jax.nn.dot_product_attention``'s XLA implementation as one (``fusing_on_cpu``) and a
fake clock that says which is faster: the finding, the checks, the decision's rules, the
substitution and its gradients are the real ones.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_autotune as jat
from jax_autotune import attention_tuning
from jax_autotune.api import leaving_plain
from jax_autotune.attention import LEFT_PLAIN, find, substituted
from jax_autotune.attention_key import AttentionKey
from jax.extend.core import jaxpr_as_fun
from jax_autotune.tuning import attention_decisions
from jax_autotune.tuning.attention_decisions import AS_WRITTEN, AttentionDecision
import numerics

B, T, H, D = 2, 16, 4, 8
BF16 = jnp.bfloat16
Q, K, V = (numerics.rand(i, B, T, H, D, dtype="bfloat16") for i in range(3))


def causal_attention(q, k, v):
    """As GPT-2 writes it: einsum, scale, a tril mask through jnp.where, softmax in f32."""
    t, head_dim = q.shape[1], q.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim ** 0.5
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def heads_first_attention(q, k, v):
    """(batch, heads, t, head_dim) operands, a multiplied scale, no mask."""
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125), v)


def matches(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    return find(closed.jaxpr, closed.consts)


# ---------------------------------------------------------------- what is found

def test_gpt2s_causal_attention_is_found_with_its_scale_and_mask():
    (match,) = matches(causal_attention, Q, K, V)
    assert match.key == AttentionKey(batch=B, heads=H, t=T, s=T, head_dim=D, dtype="bfloat16", causal=True)
    assert match.scale == pytest.approx(float(jnp.asarray(D ** 0.5, BF16)) ** -1)


def test_flax_multi_head_attention_is_found_causal_and_unmasked():
    x = numerics.rand(5, B, T, 32, dtype="bfloat16")
    mha = nn.MultiHeadDotProductAttention(num_heads=H, dtype=BF16)
    params = mha.init(jax.random.key(0), x)
    (causal,) = matches(lambda p, x: mha.apply(p, x, mask=nn.make_causal_mask(jnp.ones((B, T)))), params, x)
    (plain,) = matches(lambda p, x: mha.apply(p, x), params, x)
    assert causal.key.causal and not plain.key.causal
    assert causal.scale == plain.scale == 1.0  # flax scales the query before its dot


def test_heads_first_operands_and_a_multiplied_scale():
    (match,) = matches(heads_first_attention, Q, K, V)
    assert match.scale == 0.125 and not match.key.causal
    assert match.perms[0] == (0, 2, 1, 3)  # (b, h, t, d) -> (b, t, h, d)


def test_a_mask_closed_over_or_added_as_a_bias_is_read_as_one():
    tril = np.tril(np.ones((T, T), bool))
    bias = np.where(tril, 0.0, -np.inf).astype(np.float32)

    def closed_over(q, k, v):
        scores = jnp.where(tril, jnp.einsum("bqhd,bkhd->bhqk", q, k), -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v)

    def added(q, k, v):
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) + bias
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores).astype(q.dtype), v)

    assert [m.key.causal for m in matches(closed_over, Q, K, V)] == [True]
    assert [m.key.causal for m in matches(added, Q, K, V)] == [True]


@pytest.mark.parametrize("written", ["einsums", "jax_xla"])
def test_a_mask_broadcast_to_the_scores_is_read_without_a_copy(monkeypatch, written):
    """GPT-2's causal mask is (t, s), broadcast to the scores' (batch, heads, t, s) inside
    jnp.where (jax.nn.dot_product_attention's XLA implementation also ands it with a
    broadcast True): the walk reads it as a view of the (t, s) mask (a copy would be 100M
    entries a layer at GPT-2's size)."""
    from jax_autotune import attention
    real, extents = attention._Constants.evaluate, []

    def evaluate(eqn, values):
        const = real(eqn, values)
        low, high = getattr(np.lib, "array_utils", np).byte_bounds(const.value)  # numpy 2 moved it
        extents.append((eqn.primitive.name, high - low))
        return const

    monkeypatch.setattr(attention._Constants, "evaluate", staticmethod(evaluate))
    b, h, t = 64, 32, 256  # the scores: 134M entries
    q = jax.ShapeDtypeStruct((b, t, h, D), BF16)
    (match,) = matches(causal_attention if written == "einsums" else jax_xla_causal, q, q, q)
    assert match.key.causal and match.key.batch == b
    assert ("broadcast_in_dim", t * t) in extents and max(extent for _, extent in extents) <= 4 * t * t


def test_grouped_query_attention_repeated_before_its_dot_is_found():
    kv = numerics.rand(7, B, T, 2, D, dtype="bfloat16")
    (match,) = matches(lambda q, k, v: causal_attention(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)),
                       Q, kv, kv)
    assert match.key.heads == H


def jax_xla_causal(q, k, v):
    """jax.nn.dot_product_attention's own XLA implementation (what flax nnx runs): a 5-D
    scores product (heads as (kv heads, 1 group)) under the BF16_BF16_F32 algorithm."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def jax_xla_masked(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, mask=jnp.tril(jnp.ones((B, 1, T, T), bool)))


def jax_xla_unmasked(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, scale=0.25)


def test_a_row_max_transposed_back_after_the_mask_is_read():
    """The scores masked, then their row max taken in one layout and moved to another (as
    jax.nn.dot_product_attention's unmasked form moves it), meet again: one attention."""
    def fn(q, k, v):
        s = jnp.where(TRIL, jnp.einsum("bqhd,bkhd->bhqk", q, k), -1e9)  # (b, h, q, k)
        st = jnp.transpose(s, (1, 0, 2, 3))  # (h, b, q, k)
        m = jnp.transpose(jnp.max(s, -1), (1, 0, 2))[..., None]
        e = jnp.exp(st - m)
        return jnp.einsum("hbqk,bkhd->bqhd", e / e.sum(-1, keepdims=True), v)

    (match,) = matches(fn, Q, K, V)
    assert match.key.causal


def test_jax_nn_dot_product_attentions_xla_implementation_is_found():
    for fn, causal, scale in ((jax_xla_causal, True, D ** -0.5), (jax_xla_masked, True, D ** -0.5),
                              (jax_xla_unmasked, False, 0.25)):
        (match,) = matches(fn, Q, K, V)
        assert match.key == AttentionKey(batch=B, heads=H, t=T, s=T, head_dim=D, dtype="bfloat16", causal=causal)
        assert match.scale == pytest.approx(scale, rel=1e-6) and match.out_perm == (0, 1, 2, 3)
        assert match.q.aval.shape == (B, T, H, D)  # the queries before their 5-D reshape


KV = (numerics.rand(8, B, T, 2, D, dtype="bfloat16"), numerics.rand(9, B, T, 2, D, dtype="bfloat16"))


def jax_xla_grouped(q, k, v):
    """Grouped-query attention as jax.nn.dot_product_attention takes it: k and v with K
    heads for q's N, unrepeated (its XLA implementation splits the queries' heads (K, N/K))."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def test_grouped_query_attention_given_to_jax_unrepeated_is_found():
    for fn, causal in ((jax_xla_grouped, True), (lambda q, k, v: jax.nn.dot_product_attention(q, k, v), False),
                       (lambda q, k, v: jax.nn.dot_product_attention(
                           q, k, v, mask=jnp.tril(jnp.ones((B, 1, T, T), bool))), True)):
        (match,) = matches(fn, Q, *KV)
        assert match.key == AttentionKey(batch=B, heads=H, t=T, s=T, head_dim=D, dtype="bfloat16", causal=causal,
                                         kv_heads=2)
        assert match.q.aval.shape == (B, T, H, D) and match.out_perm == (0, 1, 2, 3)


def _heads_split(order: str, mask=None):
    """Grouped-query attention written by hand with the queries' heads split as ``order``:
    "kg" as jax splits them (query head i reads kv head i // group; MaxText's einsums,
    whose scores product jnp.einsum writes with the keys on the left), "gk" the other way
    (i reads i % kv heads); ``mask`` (B, kv heads, group, T, S), or causal."""
    def fn(q, k, v):
        b, t, n, d = q.shape
        kv = k.shape[2]
        qg = q.reshape(b, t, *((kv, n // kv) if order == "kg" else (n // kv, kv)), d)
        scores = jnp.einsum("btkgd,bskd->bkgts" if order == "kg" else "btgkd,bskd->bkgts", qg, k) * d ** -0.5
        keep = np.tril(np.ones((t, t), bool)) if mask is None else mask
        probs = jax.nn.softmax(jnp.where(keep, scores, -1e9), axis=-1)
        out = jnp.einsum("bkgts,bskd->btkgd" if order == "kg" else "bkgts,bskd->btgkd", probs, v)
        return out.reshape(b, t, n, d)
    return fn


def test_grouped_queries_split_another_way_or_masked_per_query_head_are_not_found():
    (match,) = matches(_heads_split("kg"), Q, *KV)  # jax's split, by hand: found
    assert match.key.kv_heads == 2 and match.key.causal
    np.testing.assert_array_equal(np.asarray(match.written(Q, *KV)), np.asarray(_heads_split("kg")(Q, *KV)))
    assert matches(_heads_split("gk"), Q, *KV) == []  # query head i reads kv head i % 2: another attention
    per_group = np.broadcast_to(TRIL, (B, 2, H // 2, T, T)).copy()
    assert [m.key.causal for m in matches(_heads_split("kg", per_group), Q, *KV)] == [True]
    per_head = per_group.copy()
    per_head[:, :, 1] = True  # the second query head of each group sees every key
    assert matches(_heads_split("kg", per_head), Q, *KV) == []


def test_scores_with_the_keys_on_the_left_are_found():
    """The scores' product may take the keys as its lhs (jnp.einsum orders operands so);
    the softmax's axis tells which operand holds the queries."""
    def keys_first(q, k, v):
        scores = jax.lax.dot_general(k, q, (((3,), (3,)), ((0, 2), (0, 2))))  # (b, h, s, t)
        probs = jax.nn.softmax(jnp.where(TRIL, jnp.swapaxes(scores, 2, 3) * D ** -0.5, -1e9), axis=-1)
        return jnp.einsum("bhts,bshd->bthd", probs, v)

    (match,) = matches(keys_first, Q, K, V)
    assert match.key == AttentionKey(batch=B, heads=H, t=T, s=T, head_dim=D, dtype="bfloat16", causal=True)
    assert match.q.aval.shape == (B, T, H, D) and match.scale == pytest.approx(D ** -0.5, rel=1e-3)  # a bf16 constant
    np.testing.assert_array_equal(np.asarray(match.written(Q, K, V)), np.asarray(keys_first(Q, K, V)))
    def queries_summed(q, k, v):  # the softmax along the queries' axis, the keys' summed: no attention
        probs = jax.nn.softmax(jax.lax.dot_general(k, q, (((3,), (3,)), ((0, 2), (0, 2)))) * D ** -0.5, axis=-1)
        return jnp.einsum("bhst,bshd->bthd", probs, v)

    assert matches(queries_summed, Q, K, V) == []


def test_flax_nnx_multi_head_attention_is_found_causal():
    from flax import nnx
    x = numerics.rand(5, B, T, 32, dtype="bfloat16")
    mha = nnx.MultiHeadAttention(num_heads=H, in_features=32, rngs=nnx.Rngs(0), param_dtype=BF16, dtype=BF16,
                                 decode=False)
    mask = nnx.make_causal_mask(jnp.ones((B, T), jnp.int32))
    (causal,) = matches(lambda x: mha(x, mask=mask), x)
    (plain,) = matches(lambda x: mha(x), x)
    assert causal.key.causal and not plain.key.causal and causal.key.heads == H


@pytest.mark.parametrize("fn", [
    # a bias that is no mask, a mask that is not causal, the scores read twice, an asked-for precision
    # (the scores' or the output's)
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) + 1.0), v),
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(
        jnp.where(np.triu(np.ones((T, T), bool)), jnp.einsum("bqhd,bkhd->bhqk", q, k), -1e9)), v),
    lambda q, k, v: (jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s := jnp.einsum("bqhd,bkhd->bhqk", q, k)), v), s),
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(
        jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest")), v),
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k)), v,
                               precision=jax.lax.DotAlgorithmPreset.F32_F32_F32),
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.sigmoid(jnp.einsum("bqhd,bkhd->bhqk", q, k)), v),
])
def test_what_is_not_plain_softmax_attention_is_not_found(fn):
    assert matches(fn, Q, K, V) == []


def _softmax_by_hand(scores, max_of=None, sum_of=None):
    """exp(scores - row max) / row sum, the max and sum shaped by ``max_of`` / ``sum_of``."""
    e = jnp.exp(scores - (max_of or (lambda m: m[..., None]))(jnp.max(scores, -1)))
    return e / (sum_of or (lambda t: t[..., None]))(e.sum(-1))


TRIL = np.tril(np.ones((T, T), bool))


@pytest.mark.parametrize("fn", [
    # a row max or row sum laid along the keys' axis, or reshaped there
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", _softmax_by_hand(
        jnp.einsum("bqhd,bkhd->bhqk", q, k), max_of=lambda m: m[:, :, None, :]), v),
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", _softmax_by_hand(
        jnp.einsum("bqhd,bkhd->bhqk", q, k), sum_of=lambda t: t[:, :, None, :]), v),
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", _softmax_by_hand(
        jnp.einsum("bqhd,bkhd->bhqk", q, k), sum_of=lambda t: t.reshape(B, H, 1, T)), v),
    # a scaling after the mask scales its fill: -1e9 * -1 hides nothing
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(
        jnp.where(TRIL, jnp.einsum("bqhd,bkhd->bhqk", q, k), -1e9) * -1.0), v),
    # a bias that broadcasts the scores (one query row to T)
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(
        jnp.einsum("bqhd,bkhd->bhqk", q[:, :1], k) + np.zeros((1, 1, T, T), np.float32)), v),
    # a row max of rank 5, transposed (the walk once raised here)
    lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", _softmax_by_hand(
        jnp.einsum("bqhd,bkhd->bhqk", q, k),
        max_of=lambda m: jnp.transpose(m[..., None, None], (0, 1, 2, 4, 3))[..., 0]), v),
])
def test_look_alikes_of_softmax_attention_are_not_found(fn):
    assert matches(fn, Q, K, V) == []


def test_a_mask_converted_as_lax_converts_is_read_as_lax_computes_it():
    """A mask built through converts lax and numpy disagree on (out of range, NaN): read
    as lax computes it."""
    def keep_of(fill, dtype):
        bias = np.where(TRIL, 0.0, fill).astype(np.float32)

        def fn(q, k, v):
            keep = jnp.asarray(bias).astype(dtype) == 0
            scores = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k), -1e9)
            return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v)
        return fn

    (int8,) = matches(keep_of(-1e9, jnp.int8), Q, K, V)  # lax: -1e9 -> -128, hidden: causal
    (nan,) = matches(keep_of(np.nan, jnp.int32), Q, K, V)  # lax: nan -> 0, kept: no mask
    assert int8.key.causal and not nan.key.causal


def test_a_closed_over_prng_key_and_one_head_of_jaxs_attention():
    key = jax.random.key(0)
    with_key = lambda q, k, v: causal_attention(q, k, v) + jax.random.normal(key, Q.shape, BF16)  # noqa: E731
    assert [m.key.causal for m in matches(with_key, Q, K, V)] == [True]
    (one_head,) = matches(jax_xla_causal, Q[:, :, :1], K[:, :, :1], V[:, :, :1])
    assert one_head.key.heads == 1 and one_head.key.causal


def test_the_attention_as_written_is_the_programs_own():
    (match,) = matches(causal_attention, Q, K, V)
    np.testing.assert_array_equal(np.asarray(match.written(Q, K, V)), np.asarray(causal_attention(Q, K, V)))


@pytest.mark.parametrize("fn", [causal_attention, heads_first_attention, jax_xla_causal, jax_xla_unmasked])
def test_substituted_gives_the_attention_and_its_gradients(fn):
    closed = jax.make_jaxpr(fn)(Q, K, V)
    fused = substituted(closed, lambda match: "xla")
    assert fused is not closed and substituted(closed, lambda match: None) is closed
    run = lambda q, k, v: jaxpr_as_fun(fused)(q, k, v)[0]  # noqa: E731
    assert numerics.rel_error(run(Q, K, V), fn(Q, K, V)) < 2e-2

    def grads(f):
        return jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * V.astype(jnp.float32)), (0, 1, 2))(Q, K, V)

    for got, want in zip(grads(run), grads(fn)):
        assert numerics.rel_error(got, want) < 4e-2


def test_attention_in_a_jitted_body_or_a_scan_is_substituted():
    def scanned(q, k, v):
        return jax.lax.scan(lambda c, _: (jax.jit(causal_attention)(c, k, v), None), q, None, length=2)[0]

    closed = jax.make_jaxpr(scanned)(Q, K, V)
    keys = []
    fused = substituted(closed, lambda match: keys.append(match.key) or "xla")
    assert fused is not closed and len(keys) == 1
    out = jaxpr_as_fun(fused)(Q, K, V)[0]
    assert numerics.rel_error(out, scanned(Q, K, V)) < 3e-2


# ---------------------------------------------------------------- keys and kept decisions

def test_an_attention_key_round_trips_and_a_bad_one_names_what_is_wrong():
    key = AttentionKey(batch=8, heads=12, t=1024, s=1024, head_dim=64, dtype="bfloat16", causal=True)
    assert AttentionKey.parse(key.canonical()) == key
    for text, part in [("attention:batch=8", "fields"), ("batch=8", "starting with"),
                       (key.canonical().replace("=true", "=yes"), "causal"),
                       (key.canonical().replace("t=1024", "t=x"), "not an int")]:
        with pytest.raises(ValueError, match=part):
            AttentionKey.parse(text)
    with pytest.raises(ValueError, match="heads"):
        AttentionKey(batch=1, heads=0, t=1, s=1, head_dim=8, dtype="bfloat16", causal=False)


def test_a_grouped_query_key_names_its_kv_heads_and_a_kept_key_reads_as_before():
    grouped = AttentionKey(batch=8, heads=32, t=512, s=512, head_dim=128, dtype="bfloat16", causal=True, kv_heads=8)
    assert AttentionKey.parse(grouped.canonical()) == grouped and "kv_heads=8" in grouped.canonical()
    assert grouped.kv_shape == (8, 512, 8, 128) and grouped != dataclasses.replace(grouped, kv_heads=32)
    # a key kept before kv heads were read: the same text, the same key
    kept = "attention:batch=8,heads=12,t=1024,s=1024,head_dim=64,dtype=bfloat16,causal=true"
    assert AttentionKey.parse(kept).canonical() == kept and AttentionKey.parse(kept).kv_heads == 12
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        AttentionKey(batch=1, heads=6, t=1, s=1, head_dim=8, dtype="bfloat16", causal=False, kv_heads=4)


def test_a_decision_round_trips_and_a_bad_row_is_no_decision():
    key = AttentionKey(batch=2, heads=4, t=16, s=16, head_dim=8, dtype="bfloat16", causal=True)
    decision = AttentionDecision(key, "cudnn", {AS_WRITTEN: 2e-3, "cudnn": 5e-4}, {"x": "why"})
    back = AttentionDecision.from_json(decision.to_json())
    assert (back.key, back.winner, back.seconds, back.rejected) == (key, "cudnn", decision.seconds, {"x": "why"})
    assert back.gain_seconds == pytest.approx(1.5e-3)
    for bad in [None, {}, {**decision.to_json(), "winner": "cudnn", "seconds": {}},
                {**decision.to_json(), "key": "attention:batch=2"},
                {**decision.to_json(), "seconds": {"cudnn": -1.0}}]:
        assert AttentionDecision.from_json(bad) is None


# ---------------------------------------------------------------- deciding

@pytest.fixture
def fusing_on_cpu(monkeypatch, fresh_tuning):
    """The CPU given ``jax.nn.dot_product_attention``'s XLA implementation as a fused one,
    and a fake clock: ``clock[name]`` seconds for each program timed (``timed`` lists them)."""
    monkeypatch.setitem(attention_tuning.FUSED, "cpu", ("xla",))
    clock = {AS_WRITTEN: 2e-3, "xla": 1e-3, "timed": []}

    def fake_seconds(timer, compiled, args, runs=10):
        name = clock["order"].pop(0)
        clock["timed"].append(name)
        return clock[name]

    real_tune = attention_tuning.tune

    def tune(tuner, match, names):
        clock["order"] = [AS_WRITTEN, *names]
        return real_tune(tuner, match, names)

    monkeypatch.setattr(attention_tuning, "program_seconds", fake_seconds)
    monkeypatch.setattr(attention_tuning, "tune", tune)
    return clock


def fused_keys(fn, *args):
    with attention_tuning.decisions_seen() as seen:
        jax.make_jaxpr(fn)(*args)
    return [(d.key, d.winner) for d in seen]


def test_the_faster_right_candidate_wins_and_is_kept_for_the_next_process(fusing_on_cpu):
    assert [w for _, w in fused_keys(jat.autotune(causal_attention), Q, K, V)] == ["xla"]
    assert fusing_on_cpu["timed"] == [AS_WRITTEN, "xla"]
    attention_decisions.forget()  # a new process: the store's row, nothing timed
    with attention_tuning.decisions_seen() as seen:
        jax.make_jaxpr(jat.autotune(causal_attention))(Q, K, V)
    assert [(d.winner, d.source) for d in seen] == [("xla", "store")] and fusing_on_cpu["timed"] == [AS_WRITTEN, "xla"]


def test_the_candidates_compile_at_once(fusing_on_cpu, monkeypatch):
    """The attention as written and the fused one compile on threads side by side: each
    compile waits for the other to start (a barrier), so one after the other would fail;
    each thread compiles for the device the caller chose (``jax.default_device``)."""
    import threading
    started, real = threading.Barrier(2, timeout=60), attention_tuning._compiled
    threads, devices = set(), []

    def compiled(fn, args, exclusive):
        threads.add(threading.get_ident())
        devices.append(jax.config.jax_default_device)
        started.wait()
        return real(fn, args, exclusive)

    monkeypatch.setattr(attention_tuning, "_compiled", compiled)
    with jax.default_device(jax.devices()[0]):
        assert [w for _, w in fused_keys(jat.autotune(causal_attention), Q, K, V)] == ["xla"]
    assert fusing_on_cpu["timed"] == [AS_WRITTEN, "xla"] and len(threads) == 2
    assert devices == [jax.devices()[0]] * 2


def test_as_written_stays_where_it_is_faster(fusing_on_cpu):
    fusing_on_cpu["xla"] = 3e-3
    assert [w for _, w in fused_keys(jat.autotune(causal_attention), Q, K, V)] == [AS_WRITTEN]


def test_a_wrong_fused_result_is_rejected_and_never_runs(fusing_on_cpu, monkeypatch):
    monkeypatch.setattr(attention_tuning, "fused", lambda match, q, k, v, name: match.written(q, k, v) * 1.5)
    (decision,) = [d for d in _decisions(jat.autotune(causal_attention), Q, K, V)]
    assert decision.winner == AS_WRITTEN and decision.rejected["xla"].startswith("wrong result: out")


def test_a_misread_pattern_fuses_nothing(fusing_on_cpu, monkeypatch):
    """Where the program as written disagrees with the attention as read (the scale, say),
    the reading is wrong: nothing is fused."""
    real = attention_tuning._reference
    monkeypatch.setattr(attention_tuning, "_reference",
                        lambda match, *a: real(dataclasses.replace(match, scale=match.scale * 3), *a))
    (decision,) = _decisions(jat.autotune(causal_attention), Q, K, V)
    assert decision.winner == AS_WRITTEN and AS_WRITTEN in decision.rejected


def _decisions(fn, *args):
    with attention_tuning.decisions_seen() as seen:
        jax.make_jaxpr(fn)(*args)
    return seen


@pytest.mark.parametrize("setting, value", [("mode", "off"), ("context", "off"), ("mode", "cached")])
def test_settings_that_fuse_nothing(fusing_on_cpu, setting, value):
    jat.config.update(setting, value)
    assert [w for _, w in fused_keys(jat.autotune(causal_attention), Q, K, V)] in ([], [AS_WRITTEN])
    assert fusing_on_cpu["timed"] == []


def test_a_key_left_plain_by_the_program_check_runs_as_written(fusing_on_cpu):
    (match,) = matches(causal_attention, Q, K, V)
    with leaving_plain(frozenset({match.key})):
        choose = attention_tuning.choice(jat.config.policy())
    assert choose(match) == LEFT_PLAIN and fusing_on_cpu["timed"] == []
    assert attention_tuning.choice(jat.config.policy())(match) == "xla"


def test_nothing_is_looked_for_where_nothing_can_be_fused(fresh_tuning):
    assert attention_tuning.choice(jat.config.policy()) is None  # a CPU as it comes


def test_no_fused_implementation_serves_a_cpu_or_an_f32_or_wide_head_key():
    key = AttentionKey(batch=1, heads=1, t=8, s=8, head_dim=64, dtype="bfloat16", causal=True)
    assert attention_tuning.implementations("cpu", key) == ()
    assert attention_tuning.implementations("gpu", key) == ("cudnn",)
    for changed in ({"dtype": "float32"}, {"head_dim": 256}, {"head_dim": 60}):
        assert attention_tuning.implementations("gpu", dataclasses.replace(key, **changed)) == ()


# ---------------------------------------------------------------- through jat.autotune, as users train

def mean_square(attention):
    """A loss of (q, k, v): the mean square of ``attention``'s output, in float32."""
    return lambda q, k, v: jnp.mean(attention(q, k, v).astype(jnp.float32) ** 2)


loss = mean_square(causal_attention)


def tuned_step_matches_jax(loss, *args) -> list:
    """``loss``'s value and gradients through ``jat.autotune`` under jit are JAX's within
    bf16 tolerances (value 2e-2, gradients 4e-2, same dtypes); the attention decisions the
    trace used."""
    tuned = jax.jit(jax.value_and_grad(jat.autotune(loss), (0, 1, 2)))
    with attention_tuning.decisions_seen() as seen:
        value, grads = tuned(*args)
    want_value, want_grads = jax.value_and_grad(loss, (0, 1, 2))(*args)
    assert abs(float(value) - float(want_value)) < 2e-2 * abs(float(want_value))
    for got, want in zip(grads, want_grads):
        assert (got.shape, got.dtype) == (want.shape, want.dtype) and numerics.rel_error(got, want) < 4e-2
    return list(seen)


def test_fused_under_grad_gives_jaxs_values_and_gradients(fusing_on_cpu):
    assert [d.winner for d in tuned_step_matches_jax(loss, Q, K, V)] == ["xla"]  # decided, and fused


def test_grouped_query_attention_is_checked_against_its_own_reference_and_fused(fusing_on_cpu):
    """The float64 reference of a grouped key (each kv head's gradient summed over its
    query heads) agrees with the program as written (else nothing would be fused: a
    rejected as-written program), so the fused one wins; fused under grad, jax's values
    and gradients."""
    for attention in (jax_xla_grouped, _heads_split("kg")):  # jax's, and MaxText's einsums (keys on the left)
        (decision,) = tuned_step_matches_jax(mean_square(attention), Q, *KV)
        assert (decision.winner, decision.rejected, decision.key.kv_heads) == ("xla", {}, 2)


def test_forward_mode_and_vmap_run_the_attention_as_written(fusing_on_cpu):
    tuned = jat.autotune(loss)
    _, tangent = jax.jvp(tuned, (Q, K, V), (Q, K, V))
    _, want = jax.jvp(loss, (Q, K, V), (Q, K, V))
    assert numerics.rel_error(tangent, want) < 2e-2
    per_example = jax.vmap(tuned)(Q[None], K[None], V[None])
    assert numerics.rel_error(per_example[0], loss(Q, K, V)) < 2e-2


def test_warmup_reports_the_attention_and_checks_it_with_the_program(fusing_on_cpu):
    tuned = jat.autotune(loss)
    report = jat.warmup(tuned, Q, K, V, grad=True)
    assert [(d.key.causal, d.winner) for d in report.attention] == [(True, "xla")]
    assert "attention 2x4x16x16x8 bfloat16 causal: xla" in str(report)
    assert report.program is not None and report.program.keys >= 1


def test_the_program_checks_plain_program_runs_the_attention_as_the_user_wrote_it(fusing_on_cpu, monkeypatch):
    """Every key left plain (the attention's too) is the program as written: no fused
    attention, and the attention's own dots lax's, not tuned ones."""
    import jax_autotune.attention as attention_module
    from jax_autotune.autotune import programs_traced
    from jax_autotune.jaxprs import equations
    from jax_autotune.primitive import fused_p, matmul_p
    from jax_autotune.program_check import _leave
    from jax_autotune.registry import tuner_for

    step = jax.value_and_grad(jat.autotune(loss))
    with programs_traced() as ids, attention_tuning.decisions_seen() as seen:
        closed = jax.make_jaxpr(step)(Q, K, V)
    keys = {e.params["key"] for e in equations(closed) if e.primitive in (matmul_p, fused_p)} | {seen[0].key}
    _leave(ids, tuner_for("cpu"), frozenset(keys), persist=False)
    calls, real = [], attention_module.fused
    monkeypatch.setattr(attention_module, "fused", lambda *a: calls.append(a) or real(*a))
    plain = jax.make_jaxpr(lambda *a: step(*a))(Q, K, V)  # a new function: traced again
    assert calls == [] and not any(e.primitive in (matmul_p, fused_p) for e in equations(plain))
    value, _ = jax.jit(lambda *a: step(*a))(Q, K, V)
    assert float(value) == pytest.approx(float(loss(Q, K, V)), rel=1e-6)
