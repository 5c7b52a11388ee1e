"""The epilogue: a canonical, hashable program over the product, run by lax and in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_autotune.epilogue import BARE, MAX_OPS, Epilogue, Op, Operand

GELU_BIAS_RESIDUAL = ("row:float32,full:float32|add(y,$0);integer_pow{y=3}(%0);mul(%1,0.044715:float32);"
                      "add(%0,%2);mul(%3,0.7978845834732056:float32);tanh(%4);add(%5,1.0:float32);"
                      "mul(%6,0.5:float32);mul(%0,%7);add(%8,$1)")
LOGSUMEXP = ("|convert_element_type{new_dtype=float32}(y);reduce_max{axes=n}(%0);sub(%0,%1);exp(%2);"
             "reduce_sum{axes=n}(%3);log(%4);add(%5,%1)")


def random(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("text", [GELU_BIAS_RESIDUAL, LOGSUMEXP, "|relu(y)", "col:float32|mul(y,$0)",
                                  "scalar:bfloat16|mul(y,$0);reduce_sum{axes=all}(%0)",
                                  "|gt(y,0.0:float32);select_n(%0,0.0:float32,y)"])
def test_an_epilogue_reads_back_from_its_canonical_line(text):
    epilogue = Epilogue.parse(text)
    assert str(epilogue) == text and " " not in text
    assert Epilogue.parse(str(epilogue)) == epilogue and hash(Epilogue.parse(text)) == hash(epilogue)


def test_the_bare_epilogue_is_the_empty_line_and_returns_the_product():
    assert str(BARE) == "" and Epilogue.parse("") is BARE and BARE.is_bare
    y = jnp.ones((1, 2, 3))
    assert BARE.apply(y, ()) is y


@pytest.mark.parametrize("text, part", [
    ("add(y,$0)", "operands|ops"), ("row:float32|frobnicate(y)", "frobnicate"),
    ("row:float32|add(y,$1)", "$1"), ("|add(y)", "takes 2"), ("|exp(%0)", "%0"),
    ("|reduce_sum{axes=m}(y)", "reduces over 'm'"), ("diagonal:float32|add(y,$0)", "role"),
    ("|integer_pow(y)", "parameters"), ("|reduce_sum{axes=n}(y);reduce_sum{axes=n}(%0)", "reduces a reduced"),
])
def test_a_malformed_epilogue_is_a_value_error_naming_the_part(text, part):
    with pytest.raises(ValueError, match=part.replace("$", r"\$").replace("|", r"\|")):
        Epilogue.parse(text)


def test_an_epilogue_holds_at_most_max_ops():
    with pytest.raises(ValueError, match="at most"):
        Epilogue((), tuple(Op("neg", ("y" if i == 0 else f"%{i - 1}",)) for i in range(MAX_OPS + 1)))


@pytest.mark.parametrize("text, shape, dtype", [
    (GELU_BIAS_RESIDUAL, (2, 8, 16), "float32"), (LOGSUMEXP, (2, 8), "float32"),
    ("|convert_element_type{new_dtype=float32}(y);reduce_sum{axes=all}(%0)", (), "float32"),
    ("|convert_element_type{new_dtype=float32}(y)", (2, 8, 16), "float32"),
])
def test_the_result_shape_and_dtype_follow_the_classes(text, shape, dtype):
    product = "float32" if "row:float32" in text else "bfloat16"
    assert Epilogue.parse(text).result(2, 8, 16, product) == (shape, dtype)


@pytest.mark.parametrize("text", [GELU_BIAS_RESIDUAL, LOGSUMEXP, "col:float32|mul(y,$0);logistic(%0)",
                                  "|erf(y);abs(%0);sqrt(%1);rsqrt(%2)",
                                  "|gt(y,0.0:float32);select_n(%0,0.0:float32,y);relu(%1)"])
def test_lax_and_float64_evaluations_agree(text):
    epilogue = Epilogue.parse(text)
    y = random((2, 8, 16), 0)
    operands = [random(o.shape(2, 8, 16), i + 1) for i, o in enumerate(epilogue.operands)]
    got = jax.jit(lambda y, *ops: epilogue.apply(y, ops))(y, *operands)
    want = epilogue.reference(y.astype(np.float64), operands)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5)


def test_compute_dtype_runs_a_bf16_chain_in_f32():
    """Inside a kernel: literals and converts of narrower floats stay f32, rounded once."""
    epilogue = Epilogue.parse("row:bfloat16|add(y,$0);mul(%0,0.1:bfloat16);"
                              "convert_element_type{new_dtype=bfloat16}(%1)")
    y, bias = random((4, 8), 0), random((8,), 1)
    out = epilogue.apply(jnp.asarray(y), (jnp.asarray(bias),), compute_dtype="float32")
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), (y + bias) * np.float32(0.1), rtol=1e-6)
    rounded = epilogue.apply(jnp.asarray(y, jnp.bfloat16), (jnp.asarray(bias, jnp.bfloat16),))
    assert rounded.dtype == jnp.bfloat16


def test_describe_names_the_ops_with_operand_roles():
    assert Epilogue.parse("row:float32,full:float32|add(y,$0);add(%0,$1);tanh(%1)").describe() == \
        "add(y,row) > add(full) > tanh"


def test_an_operand_checks_its_role_and_shape():
    assert Operand("col", "float32").shape(3, 4, 5) == (3, 4)
    with pytest.raises(ValueError, match="role"):
        Operand("rows", "float32")
