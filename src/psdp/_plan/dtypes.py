"""Leaf dtypes: which ones a batch can hold, and the checked casts the loader makes on a read.

A leaf's *source* dtype (learned from one row) and *delivered* dtype differ only for a byte swap
or a ``dtypes=`` cast; what JAX would change silently is refused at construction: ``docs/concepts/loader.md``,
"What the loader makes of a read".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from psdp._plan.leaves import Key, leaf_label

#: the x64 switch, as the error messages spell it
ENABLE_X64 = 'jax.config.update("jax_enable_x64", True)'
ENCODE = (
    "encode it as numbers before the source (token ids for text, datetime64 -> .astype('int64'), "
    "one leaf per field of a structured array)"
)


@dataclass(frozen=True)
class LeafDtype:
    """One leaf's dtypes: what its source rows hold, and what its batches hold.

    Examples:
        >>> leaf = LeafDtype(np.dtype(np.int64), np.dtype(np.int32))
        >>> leaf.convert(np.array([[5, -6]]), step=0, key="x", ids=np.array([9])).dtype
        dtype('int32')
        >>> leaf.convert(np.array([[2**40]]), step=3, key="x", ids=np.array([9]))
        Traceback (most recent call last):
            ...
        ValueError: step 3: leaf 'x' holds 1099511627776 in row 9, which does not fit its declared dtype int32 (integers in [-2147483648, 2147483647]); give the leaf a dtype that holds it in dtypes= (64-bit ones need jax.config.update("jax_enable_x64", True)), or fix the row
    """

    source: np.dtype
    delivered: np.dtype

    @property
    def casts(self) -> bool:
        """Whether a read's rows are converted (a declared dtype, or a byte swap)."""
        return self.source != self.delivered

    def convert(self, rows: np.ndarray, *, step: int, key: Key, ids: np.ndarray) -> np.ndarray:
        """``rows`` (row ``i`` is source row ``ids[i]``) as the delivered dtype; a new array.

        Raises:
            ValueError: a value does not fit the delivered dtype (see `cast_checked`).
        """
        if self.source.newbyteorder("=") == self.delivered:
            return rows.astype(self.delivered)  # a byte swap: always lossless
        out, bad = cast_checked(rows, self.delivered)
        if bad is not None:
            row = int(np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))[0])
            value = rows[row][bad[row]].ravel()[0]
            raise ValueError(
                f"step {step}: {leaf_label(key)} holds {value.item()!r} in row {int(ids[row])}, which does "
                f"not fit its declared dtype {self.delivered} ({_range_of(self.delivered)}); "
                f"give the leaf a dtype that holds it in dtypes= (64-bit ones need {ENABLE_X64}), "
                "or fix the row"
            )
        return out


def plan_dtypes(sources: Mapping[Key, np.dtype], declared: Any) -> dict[Key, LeafDtype]:
    """Every leaf's `LeafDtype`, from the source dtypes and the user's ``dtypes=``.

    ``declared`` is ``None``, one dtype (an array source), or a dict leaf -> dtype (some leaves of
    a dict source). The rules are in ``docs/concepts/loader.md``; the current ``jax_enable_x64``
    setting decides whether 64-bit dtypes can be delivered.

    Raises:
        TypeError: a leaf's dtype is not numeric, is 64-bit while x64 is off, or ``declared`` is
            not dtypes.
        ValueError: ``declared`` names a leaf the source does not have.

    Examples:
        >>> plan = plan_dtypes({"x": np.dtype(">i4"), "y": np.dtype(np.int64)}, {"y": "int32"})
        >>> {k: (str(v.source), str(v.delivered)) for k, v in plan.items()}
        {'x': ('>i4', 'int32'), 'y': ('int64', 'int32')}
    """
    wanted = _declared(declared, list(sources))
    plan = {}
    for key, source in sources.items():
        _check_holdable(source, key, "its rows are", ENCODE)
        delivered = wanted.get(key, source).newbyteorder("=")
        if key in wanted:
            _check_holdable(delivered, key, "its declared dtype is", "declare a numeric dtype")
        _check_without_x64(delivered, key, declared=key in wanted)
        plan[key] = LeafDtype(np.dtype(source), np.dtype(delivered))
    return plan


def check_pad_value(pad_value: int | float, dtype: np.dtype, key: Key, reason: str) -> None:
    """Raises `ValueError` unless ``dtype`` holds ``pad_value`` exactly (floats: without overflow).

    ``reason`` says why the leaf is ever filled with it (padding rows, halo columns).

    Examples:
        >>> check_pad_value(-1, np.dtype(np.uint16), "x", "padding rows can occur")
        Traceback (most recent call last):
            ...
        ValueError: pad_value=-1 does not fit leaf 'x', of dtype uint16 (integers in [0, 65535]), and padding rows can occur; pass a pad_value that uint16 holds (e.g. pad_value=0), or give the leaf another dtype with dtypes=
    """
    if not _fits(pad_value, dtype):
        raise ValueError(
            f"pad_value={pad_value!r} does not fit {leaf_label(key)}, of dtype {dtype} ({_range_of(dtype)}), "
            f"and {reason}; pass a pad_value that {dtype} holds (e.g. pad_value=0), or give the "
            "leaf another dtype with dtypes="
        )


def needs_x64(dtype: np.dtype) -> bool:
    """Whether JAX holds ``dtype`` only with ``jax_enable_x64`` on (int64, float64, ...)."""
    family = _family(dtype)
    if family == "complex":
        return dtype.itemsize == 16
    return family in ("int", "float") and dtype.itemsize == 8


def cast_checked(values: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """``values`` as ``dtype``, and where they did not fit (``None`` when all did).

    A value fits when the cast keeps it exactly; casting floats (or complex numbers) to a
    narrower float may round them, as narrowing means, but not overflow to infinity.

    Examples:
        >>> out, bad = cast_checked(np.array([1.0, 2.5, np.nan]), np.dtype(np.int8))
        >>> bad.tolist()
        [False, True, True]
        >>> cast_checked(np.array([0.1, 1e300]), np.dtype(np.float32))[1].tolist()
        [False, True]
    """
    source, target = _family(values.dtype), _family(dtype)
    lost: np.ndarray | None = None
    if source == "complex" and target != "complex":
        lost, values = values.imag != 0, values.real
        source = "float"
    with np.errstate(all="ignore"):  # what overflows or is invalid is found below, not warned
        out = values.astype(dtype)
        if source in ("int", "bool") and target in ("int", "bool"):
            low, high = _int_range(dtype)
            if values.size and (int(values.min()) < low or int(values.max()) > high):
                bad = (values < low) | (values > high)
            else:
                bad = None
        elif source in ("float", "complex") and target in ("float", "complex"):
            bad = np.isinf(out) & np.isfinite(values)
        else:
            bad = out.astype(values.dtype) != values  # NaN never equals itself: it does not fit
    if lost is not None:
        bad = lost if bad is None else bad | lost
    return out, bad if bad is not None and bad.any() else None


# ------------------------------------------------------------------------------------ helpers
def _family(dtype: np.dtype) -> str | None:
    """bool, int, float or complex (ml_dtypes' bfloat16, int4, float8 included); None otherwise."""
    by_kind = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}
    if dtype.kind in by_kind:
        return by_kind[dtype.kind]
    if dtype.kind == "V" and jax.dtypes.issubdtype(dtype, np.number):  # ml_dtypes' numbers
        return "int" if jax.dtypes.issubdtype(dtype, np.integer) else "float"
    return None  # strings, objects, datetimes and timedeltas, raw and structured bytes


def _holdable(dtype: np.dtype) -> bool:
    family = _family(dtype)
    if family == "float":  # numpy's float128 (long double) has no JAX counterpart
        return dtype.itemsize <= 8
    if family == "complex":
        return dtype.itemsize <= 16
    return family is not None


def _check_holdable(dtype: np.dtype, key: Key, what: str, fix: str) -> None:
    if not _holdable(dtype):
        raise TypeError(
            f"{leaf_label(key)}: {what} {dtype}, which a JAX array cannot hold (batches hold "
            f"bool, integer, float and complex numbers); {fix}"
        )


def _check_without_x64(dtype: np.dtype, key: Key, *, declared: bool) -> None:
    held = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if held == dtype:
        return
    what = "its declared dtype" if declared else "it"
    cast = f"dtypes=np.{held.name}" if key is None else f"dtypes={{{key!r}: np.{held.name}}}"
    raise TypeError(
        f"{leaf_label(key)}: {what} is {dtype}, which JAX holds as {held} while jax_enable_x64 is off, "
        f"silently wrapping values beyond {held}'s range; cast it on every read with a checked "
        f"range ({cast}), store it as {held}, or enable 64-bit JAX with {ENABLE_X64} before "
        "building the loader"
    )


def _declared(declared: Any, keys: list[Key]) -> dict[Key, np.dtype]:
    """``dtypes=`` as leaf -> dtype; raises naming what is wrong and how to write it."""
    if declared is None:
        return {}
    single = keys == [None]
    if isinstance(declared, Mapping):
        if single:
            raise TypeError(
                f"dtypes for an array source is one dtype (e.g. dtypes=np.int32), got a dict "
                f"{dict(declared)!r}"
            )
        unknown = sorted(str(k) for k in declared if k not in keys)
        if unknown:
            raise ValueError(
                f"dtypes names leaves {unknown} that the source does not have; its leaves are "
                f"{sorted(map(str, keys))}"
            )
        return {str(k): _as_dtype(v, f"dtypes[{k!r}]") for k, v in declared.items()}
    if not single:
        raise TypeError(
            f"dtypes for a dict source is a dict leaf -> dtype, e.g. dtypes={{{keys[0]!r}: "
            f"np.int32}}, got {declared!r}"
        )
    return {None: _as_dtype(declared, "dtypes")}


def _as_dtype(value: Any, name: str) -> np.dtype:
    try:
        return np.dtype(value)
    except TypeError as error:
        raise TypeError(
            f"{name} must be a numpy dtype (e.g. np.int32 or 'int32'), got {value!r}"
        ) from error


def _int_range(dtype: np.dtype) -> tuple[int, int]:
    if dtype.kind == "b":
        return 0, 1
    info = jax.dtypes.iinfo(dtype)
    return int(info.min), int(info.max)


def _range_of(dtype: np.dtype) -> str:
    family = _family(dtype)
    if family == "bool":
        return "False or True, i.e. 0 or 1"
    if family == "int":
        low, high = _int_range(dtype)
        return f"integers in [{low}, {high}]"
    if family == "float":
        return f"floats of magnitude up to {jax.dtypes.finfo(dtype).max}"
    return "complex numbers"


def _fits(value: int | float, dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds the number ``value`` (Python ints of any size included)."""
    family = _family(dtype)
    if family in ("int", "bool"):
        if isinstance(value, float | np.floating) and not float(value).is_integer():
            return False  # NaN, infinities and fractions
        low, high = _int_range(dtype)
        return low <= int(value) <= high
    try:
        number = float(value)
    except OverflowError:  # an int beyond every float
        return False
    with np.errstate(over="ignore"):
        return not (np.isinf(np.array(number).astype(dtype)) and np.isfinite(number))
