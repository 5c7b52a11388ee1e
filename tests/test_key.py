"""The tune key's rules, against the reference's own table."""

import dataclasses
import json

import jax
import pytest

from jax_autotune.cli import main as cli_main
from jax_autotune.cli.keys import key_table
from jax_autotune.cli.parser import parse_shape
from jax_autotune.key import Kind, Layout, Level, MatmulKey, Precision, Scale, anchor, layout_from_strides, stride_factor
from jax_autotune.epilogue import Epilogue
from jax_autotune.problem import MatmulProblem
from jax_autotune.api import key_for


def square(n, dtype="float32", transpose_b=False, level="balanced"):
    a = jax.ShapeDtypeStruct((n, n), dtype)
    return key_for(a, a, transpose_b=transpose_b, level=level)


# (m=n=k bucket, pow2, stride, scale) per square, from the reference page
REFERENCE = {
    512: (512, 4, 10, Scale.MEDIUM),
    768: (1024, 4, 10, Scale.MEDIUM),
    1000: (1024, 4, 5, Scale.MEDIUM),
    1024: (1024, 4, 10, Scale.MEDIUM),
    1025: (2048, 4, 2, Scale.LARGE),
    2048: (2048, 4, 10, Scale.LARGE),
}


@pytest.mark.parametrize("size", sorted(REFERENCE))
def test_the_reference_table_field_by_field(size):
    bucket, pow2, stride, scale = REFERENCE[size]
    key = square(size)
    assert (key.m, key.n, key.k, key.batch) == (bucket, bucket, bucket, 1)
    assert (key.lhs_pow2_factor, key.rhs_pow2_factor) == (pow2, pow2)
    assert (key.lhs_stride_factor, key.rhs_stride_factor) == (stride, stride)
    assert key.lhs_layout == key.rhs_layout == Layout.contiguous()
    assert (key.lhs_dtype, key.rhs_dtype, key.out_dtype) == ("float32",) * 3
    assert key.precision == Precision.DEFAULT
    assert key.scale == scale and key.kind == Kind.GENERAL


def test_a_transposed_rhs_is_a_mildly_permuted_key_of_its_own():
    key = square(1024, transpose_b=True)
    assert key.rhs_layout == Layout("MildlyPermuted", transposed=True, batch_swap=False)
    assert str(key.rhs_layout) == "MildlyPermuted { transposed: true, batch_swap: false }"
    assert key.lhs_layout == Layout.contiguous()
    assert key != square(1024)
    assert (key.m, key.rhs_stride_factor, key.scale) == (1024, 10, Scale.MEDIUM)


def test_768_shares_the_key_of_1024_and_1000_does_not():
    assert square(768) == square(1024)
    assert square(1000) != square(1024)


def test_keys_cli_prints_the_reference_table(capsys):
    assert cli_main(["keys", "512", "768", "1000", "1024", "1025", "2048", "1024T"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (" 512  -> m=512 n=512 k=512 lhs_pow2=4 lhs_stride=10 rhs_pow2=4 rhs_stride=10 "
                      "layout_rhs=Contiguous scale=Medium kind=General")
    assert out[2] == ("1000  -> m=1024 n=1024 k=1024 lhs_pow2=4 lhs_stride=5 rhs_pow2=4 rhs_stride=5 "
                      "layout_rhs=Contiguous scale=Medium kind=General")
    assert out[4] == ("1025  -> m=2048 n=2048 k=2048 lhs_pow2=4 lhs_stride=2 rhs_pow2=4 rhs_stride=2 "
                      "layout_rhs=Contiguous scale=Large kind=General")
    assert out[6] == ("1024T -> m=1024 n=1024 k=1024 lhs_pow2=4 lhs_stride=10 rhs_pow2=4 rhs_stride=10 "
                      "layout_rhs=MildlyPermuted { transposed: true, batch_swap: false } "
                      "scale=Medium kind=General")
    assert "key(768) == key(1024): true" in out
    assert "key(1000) == key(1024): false" in out


def test_keys_cli_accepts_mxnxk_dtype_and_level():
    lines = key_table(["3x100x200x300"], dtype="bfloat16", level="minimal")
    assert lines[0].split(" -> ")[1].startswith("m=245 n=245 k=611 batch=7")
    with pytest.raises(ValueError, match="'12y'"):
        parse_shape("12y")


@pytest.mark.parametrize("level, expected", [
    ("minimal", {1: 1, 2: 3, 7: 16, 100: 245, 1000: 1526}),
    ("balanced", {1: 1, 2: 2, 7: 8, 100: 128, 1000: 1024, 1024: 1024, 1025: 2048}),
    ("extensive", {1: 1, 2: 3, 7: 8, 100: 130, 1000: 1478}),
    ("full", {1: 1, 7: 7, 1000: 1000, 1025: 1025}),
])
def test_every_level_buckets_by_its_base(level, expected):
    assert {x: anchor(x, level) for x in expected} == expected


def test_anchor_rejects_sizes_below_one():
    with pytest.raises(ValueError, match="size must be >= 1"):
        anchor(0)


@pytest.mark.parametrize("m, n, k, kind", [
    (64, 64, 64, Kind.GENERAL), (64, 1, 64, Kind.MAT_VEC), (1, 64, 64, Kind.VEC_MAT),
    (1, 64, 1, Kind.SCALAR_VEC), (64, 1, 1, Kind.VEC_SCALAR), (1, 1, 64, Kind.INNER_PRODUCT),
    (64, 64, 1, Kind.OUTER_PRODUCT), (1, 1, 1, Kind.SCALAR_PRODUCT),
])
def test_every_kind(m, n, k, kind):
    assert MatmulProblem(1, m, n, k, "float32", "float32", "float32").key().kind == kind


def test_scale_uses_the_bucketed_sizes():
    assert MatmulProblem(1, 511, 511, 511, "float32", "float32", "float32").key().scale == Scale.MEDIUM
    assert MatmulProblem(1, 256, 256, 256, "float32", "float32", "float32").key().scale == Scale.SMALL
    assert MatmulProblem(1, 16, 16, 2047, "float32", "float32", "float32").key().scale == Scale.LARGE


def test_stride_factors_count_bytes_so_bf16_halves_them():
    assert square(1000, "bfloat16").lhs_stride_factor == 4  # 2000 B = 2^4 * 125
    assert square(1000, "float32").lhs_stride_factor == 5   # 4000 B = 2^5 * 125
    assert square(1000, "float64").lhs_stride_factor == 6


def test_stride_factor_is_the_minimum_over_outer_strides_capped_at_ten():
    assert stride_factor((3, 1000, 1000), (4_000_000, 4000, 4)) == 5
    assert stride_factor((4, 1024, 1024), (2**22, 4096, 4)) == 10
    assert stride_factor((1, 7, 7), (196, 28, 4)) == 2  # the size-1 batch axis is ignored


def test_layouts_from_strides_transposed_batch_swapped_and_highly_permuted():
    assert layout_from_strides((2, 3, 4), (12, 4, 1)) == Layout.contiguous()
    assert layout_from_strides((2, 3, 4), (12, 1, 3)) == Layout.mildly_permuted(transposed=True)
    # (b0, b1, r, c) stored as (b1, b0, r, c): batch strides out of order
    assert layout_from_strides((2, 5, 3, 4), (12, 24, 4, 1)) == Layout.mildly_permuted(batch_swap=True)
    assert layout_from_strides((2, 3, 4), (1, 8, 2)) == Layout.highly_permuted()
    assert layout_from_strides((2, 3, 4), (0, 4, 1)) == Layout.highly_permuted()  # broadcast batch


def test_pow2_factor_follows_the_contiguous_axis():
    problem = MatmulProblem(1, 8, 1024, 4, "float32", "float32", "float32", transpose_a=True)
    key = problem.key("balanced")
    assert key.lhs_pow2_factor == 3  # transposed lhs: m (8) is contiguous
    assert key.rhs_pow2_factor == 4  # n (1024): capped
    assert key.lhs_layout.transposed


def test_key_json_round_trip_canonical_string_and_hash():
    key = square(1024, transpose_b=True)
    assert MatmulKey.from_json(json.loads(json.dumps(key.to_json()))) == key
    assert MatmulKey.parse(key.canonical()) == key
    assert " " not in key.canonical().split("rhs_layout=")[1].split()[0]
    assert len({key, MatmulKey.parse(key.canonical())}) == 1
    with pytest.raises(ValueError, match="'kind'"):
        MatmulKey.from_json({**key.to_json(), "kind": "Sideways"})
    with pytest.raises(ValueError, match="missing field 'm'"):
        MatmulKey.from_json({k: v for k, v in key.to_json().items() if k != "m"})


# a bare key's canonical string as stored before keys had an epilogue
STORED_BEFORE_EPILOGUES = ("m=1024 n=1024 k=1024 batch=1 lhs_pow2_factor=4 rhs_pow2_factor=4 lhs_stride_factor=10 "
                           "rhs_stride_factor=10 lhs_layout=Contiguous rhs_layout=Contiguous lhs_dtype=float32 "
                           "rhs_dtype=float32 out_dtype=float32 precision=DEFAULT scale=Medium kind=General")


def test_a_key_without_an_epilogue_reads_and_writes_as_before():
    key = square(1024)
    assert key.canonical() == STORED_BEFORE_EPILOGUES and "epilogue" not in key.to_json()
    assert MatmulKey.parse(STORED_BEFORE_EPILOGUES) == key and key.epilogue.is_bare


def test_a_key_with_an_epilogue_is_another_key_that_round_trips():
    epilogue = Epilogue.parse("row:float32,full:float32|add(y,$0);add(%0,$1)")
    bare = square(1024)
    key = dataclasses.replace(square(1024), epilogue=epilogue)
    assert key != bare and hash(key) != hash(bare)
    assert key.canonical() == STORED_BEFORE_EPILOGUES + " epilogue=" + str(epilogue)
    assert MatmulKey.parse(key.canonical()) == key
    assert MatmulKey.from_json(json.loads(json.dumps(key.to_json()))) == key
    assert key.describe() == "1024x1024x1024 float32 NN DEFAULT | add(y,row) > add(full)"
    with pytest.raises(ValueError, match="'epilogue'"):
        MatmulKey.from_json({**key.to_json(), "epilogue": "row:float32|explode(y)"})


def test_key_for_reads_dtypes_precision_and_batch():
    lhs = jax.ShapeDtypeStruct((6, 100, 64), "bfloat16")
    rhs = jax.ShapeDtypeStruct((6, 64, 32), "bfloat16")
    key = key_for(lhs, rhs, precision="highest", preferred_element_type="float32")
    assert (key.batch, key.m, key.n, key.k) == (8, 128, 32, 64)
    assert key.out_dtype == "float32" and key.precision == Precision.HIGHEST
    assert key_for(lhs, rhs, precision=(jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH)).precision == Precision.HIGH


def test_key_for_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(6, 7\)"):
        key_for(jax.ShapeDtypeStruct((4, 5), "float32"), jax.ShapeDtypeStruct((6, 7), "float32"))
    with pytest.raises(TypeError, match="lhs: expected an array"):
        key_for([1, 2], jax.ShapeDtypeStruct((2, 2), "float32"))
    with pytest.raises(ValueError, match="precision"):
        key_for(jax.ShapeDtypeStruct((2, 2), "float32"), jax.ShapeDtypeStruct((2, 2), "float32"),
                precision="fast-ish")
    with pytest.raises(ValueError):
        Level("medium")
