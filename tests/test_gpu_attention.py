"""On a CUDA GPU: ``jat.autotune`` fuses a model's softmax attention with cuDNN where that is
faster and right, and the step's values and gradients stay JAX's."""

import jax
import pytest

import jax_autotune as jat
from jax_autotune.tuning.attention_decisions import AS_WRITTEN
import numerics
from test_attention import _heads_split, jax_xla_grouped, loss, mean_square, tuned_step_matches_jax

pytestmark = pytest.mark.gpu

B, T, H, D = 4, 1024, 12, 64  # GPT-2-small's attention, batch 4


def test_cudnn_wins_gpt2s_attention_and_the_gradients_are_jaxs(fresh_tuning):
    q, k, v = (numerics.rand(i, B, T, H, D, dtype="bfloat16") for i in range(3))
    (decision,) = tuned_step_matches_jax(loss, q, k, v)
    assert decision.key.causal and set(decision.seconds) == {AS_WRITTEN, "cudnn"}, decision.rejected
    assert decision.winner == "cudnn", decision.seconds


def test_forward_mode_through_a_fused_attention_runs_it_as_written(fresh_tuning):
    q, k, v = (numerics.rand(i, 1, T, H, D, dtype="bfloat16") for i in range(3))
    _, tangent = jax.jvp(jat.autotune(loss), (q, k, v), (q, k, v))
    _, want = jax.jvp(loss, (q, k, v), (q, k, v))
    assert numerics.rel_error(tangent, want) < 3e-2


@pytest.mark.parametrize("written", ["jax", "maxtext"])
def test_cudnn_is_right_on_grouped_query_attention_and_the_gradients_are_jaxs(fresh_tuning, written):
    """Llama's attention shape (32 query heads on 8 kv heads), k and v given unrepeated: to
    jax.nn.dot_product_attention's XLA implementation, or as MaxText's einsums write it
    (the keys on the left of the scores' product). cuDNN's result passes the float64 check
    (it is timed, not rejected), and the step's gradients are JAX's whichever wins."""
    b, t, h, kv, d = 2, 1024, 32, 8, 128
    q = numerics.rand(0, b, t, h, d, dtype="bfloat16")
    k, v = (numerics.rand(i, b, t, kv, d, dtype="bfloat16") for i in (1, 2))
    attention = jax_xla_grouped if written == "jax" else _heads_split("kg")
    (decision,) = tuned_step_matches_jax(mean_square(attention), q, k, v)
    assert (decision.key.heads, decision.key.kv_heads, decision.key.causal) == (h, kv, True)
    assert set(decision.seconds) == {AS_WRITTEN, "cudnn"}, decision.rejected
