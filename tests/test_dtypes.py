"""psdp._plan.dtypes: which leaf dtypes a batch can hold, and the checked casts of ``dtypes=``.

The oracles are per-value Python arithmetic (``int`` ranges, ``float.is_integer``), never the
vectorised code under test.
"""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp._compat import enable_x64  # jax.enable_x64, or jax.experimental's on older jax
from psdp._plan.dtypes import LeafDtype, cast_checked, check_pad_value, needs_x64, plan_dtypes

INT_TARGETS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, ml_dtypes.int4]


def int_range(dtype) -> tuple[int, int]:
    info = ml_dtypes.iinfo(dtype) if dtype is ml_dtypes.int4 else np.iinfo(dtype)
    return int(info.min), int(info.max)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20),
    target=st.sampled_from(INT_TARGETS),
)
def test_an_int_cast_flags_exactly_the_values_outside_the_range(values, target):
    low, high = int_range(target)
    out, bad = cast_checked(np.array(values, np.int64), np.dtype(target))
    want = [not low <= v <= high for v in values]
    assert (bad.tolist() if bad is not None else [False] * len(values)) == want
    fitting = [v for v, b in zip(values, want, strict=True) if not b]
    assert [int(o) for o, b in zip(out, want, strict=True) if not b] == fitting


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20),
    target=st.sampled_from([np.int8, np.int32, np.uint16, np.bool_]),
)
def test_a_float_to_int_cast_keeps_only_whole_numbers_in_range(values, target):
    low, high = (0, 1) if target is np.bool_ else int_range(target)
    _, bad = cast_checked(np.array(values, np.float64), np.dtype(target))
    want = [not (math.isfinite(v) and v.is_integer() and low <= v <= high) for v in values]
    assert (bad.tolist() if bad is not None else [False] * len(values)) == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20))
def test_narrowing_floats_rounds_but_never_overflows_silently(values):
    out, bad = cast_checked(np.array(values, np.float64), np.dtype(np.float32))
    overflow = [math.isfinite(v) and overflows_float32(v) for v in values]
    assert (bad.tolist() if bad is not None else [False] * len(values)) == overflow
    for v, o, over in zip(values, out.tolist(), overflow, strict=True):
        if not over and math.isfinite(v):
            assert abs(o - v) <= abs(v) * 2**-23 + 2**-149  # float32's precision (or underflow)


def overflows_float32(value: float) -> bool:
    """Python's own float32 packing: rounds to nearest, raises where that is infinite."""
    try:
        struct.pack("<f", value)
    except OverflowError:
        return True
    return False


def test_complex_to_real_needs_a_zero_imaginary_part():
    _, bad = cast_checked(np.array([1 + 0j, 2 + 1e-9j, 3.5 + 0j]), np.dtype(np.int32))
    assert bad.tolist() == [False, True, True]


def test_convert_names_the_step_the_leaf_the_row_and_the_value():
    leaf = LeafDtype(np.dtype(np.float64), np.dtype(np.int16))
    rows = np.array([[1.0, 2.0], [3.0, 40000.0]])
    with pytest.raises(ValueError, match=r"step 7: leaf 'w' holds 40000.0 in row 12, .* int16"):
        leaf.convert(rows, step=7, key="w", ids=np.array([11, 12]))
    swapped = LeafDtype(np.dtype(">i4"), np.dtype("<i4"))
    data = np.array([[1, -2]], ">i4")
    got = swapped.convert(data, step=0, key=None, ids=np.array([0]))
    assert got.dtype == np.dtype("<i4") and got.tolist() == [[1, -2]]


# ------------------------------------------------------------------------------- plan_dtypes
@pytest.mark.parametrize(
    ("source", "delivered"),
    [
        (">i4", "int32"),  # big-endian: a lossless byte swap
        (">f2", "float16"),
        ("<u2", "uint16"),
        (ml_dtypes.bfloat16, ml_dtypes.bfloat16),  # ml_dtypes have numpy kind 'V' but are numbers
        (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
        (ml_dtypes.int4, ml_dtypes.int4),
        ("bool", "bool"),
        ("complex64", "complex64"),
    ],
)
def test_holdable_dtypes_are_delivered_natively(source, delivered):
    plan = plan_dtypes({"x": np.dtype(source)}, None)["x"]
    assert plan.source == np.dtype(source) and plan.delivered == np.dtype(delivered)
    assert plan.delivered.isnative


@pytest.mark.parametrize("dtype", ["<U3", "S2", "O", "datetime64[s]", "timedelta64[ms]", "V4",
                                   [("a", "<i4")], np.longdouble])  # fmt: skip
def test_dtypes_jax_cannot_hold_are_refused(dtype):
    if np.dtype(dtype) == np.dtype(np.float64):
        pytest.skip("this platform's long double is float64")
    with pytest.raises(TypeError, match=r"leaf 'x': its rows are .* a JAX array cannot hold"):
        plan_dtypes({"x": np.dtype(dtype)}, None)


@pytest.mark.parametrize("dtype", ["int64", "uint64", "float64", "complex128", ">i8"])
def test_64_bit_dtypes_are_refused_without_x64_and_pass_with_it(dtype):
    assert needs_x64(np.dtype(dtype).newbyteorder("="))
    with pytest.raises(TypeError, match="jax_enable_x64 is off"):
        plan_dtypes({"x": np.dtype(dtype)}, None)
    with enable_x64(True):
        assert plan_dtypes({"x": np.dtype(dtype)}, None)["x"].delivered == np.dtype(
            dtype
        ).newbyteorder("=")


def test_a_declared_dtype_is_what_is_delivered():
    plan = plan_dtypes({None: np.dtype(np.int64)}, "int16")[None]
    assert (plan.source, plan.delivered, plan.casts) == (np.dtype("int64"), np.dtype("int16"), True)
    assert not plan_dtypes({"x": np.dtype(np.int32)}, None)["x"].casts


# ---------------------------------------------------------------------------- check_pad_value
@pytest.mark.parametrize(
    ("value", "dtype", "fits"),
    [
        (0, np.uint16, True),
        (-1, np.uint16, False),
        (65535, np.uint16, True),
        (65536, np.uint16, False),
        (-1, np.int8, True),
        (0.0, np.int32, True),  # a whole float is the same number
        (0.5, np.int32, False),
        (float("nan"), np.int32, False),
        (float("inf"), np.int64, False),
        (2**64 - 1, np.uint64, True),  # Python ints of any size are compared exactly
        (2**64, np.uint64, False),
        (0, np.bool_, True),
        (1, np.bool_, True),
        (-1, np.bool_, False),
        (2, np.bool_, False),
        (float("nan"), np.float32, True),  # a float leaf holds NaN and infinities
        (float("-inf"), np.float16, True),
        (0.1, np.float16, True),  # rounding is what a float pad value means
        (65504, np.float16, True),
        (1e6, np.float16, False),  # but not overflow
        (3e38, ml_dtypes.bfloat16, True),  # bfloat16 has float32's range
        (3e38, np.float16, False),
        (1e39, np.float32, False),
        (10**400, np.float64, False),
        (-8, ml_dtypes.int4, True),
        (8, ml_dtypes.int4, False),
    ],
)
def test_a_pad_value_must_fit_the_leaf(value, dtype, fits):
    if fits:
        check_pad_value(value, np.dtype(dtype), "x", "padding rows can occur")
    else:
        with pytest.raises(ValueError, match=r"does not fit leaf 'x', of dtype"):
            check_pad_value(value, np.dtype(dtype), "x", "padding rows can occur")
