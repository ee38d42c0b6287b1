"""Streams: iterables without random access, sharded by data-shard uid, resumed by skipping.

How elements are dealt to shards (round-robin over a re-iterable, or a callable per shard), what an
element is, and why resume is O(step): ``docs/guides/streams.md``, "Streams".
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from psdp._checks import check_int
from psdp._plan.leaves import Key, in_leaf_order
from psdp.sources.base import Rows

#: dtype kinds a stream element may have: bool, integers, floats, complex (what JAX arrays hold).
_NUMERIC_KINDS = "biufc"

#: What `StreamReader._next` returns at the end of a shard (an element may be anything, even None).
_END = object()

Leaves = dict[Key, np.ndarray]
Schema = dict[Key, tuple[np.dtype, tuple[int, ...]]]


class StreamSource:
    """An iterable without random access, read shard by shard (one shard per data-shard uid).

    Args:
        stream: a re-iterable (``iter()`` is called again for every `open`; element ``k`` goes to
            shard ``k % num_shards``; an incomplete final round is dropped), or a callable ``(shard_index, num_shards) -> iterable`` of
            that shard's elements (called once per `open`). Elements are array-likes of one row
            (the same shape and dtype every time) or dicts of them.
        name: how `describe` names the stream; default: its type or function name.

    Raises:
        TypeError: ``stream`` is a one-shot iterator (a generator object), a dict, a callable that
            cannot take ``(shard_index, num_shards)``, or neither iterable nor callable.

    Examples:
        >>> rows = [{"tokens": np.array([k, k]), "id": k} for k in range(7)]
        >>> src = StreamSource(rows, name="rows")
        >>> reader = src.open(shard=1, num_shards=2)  # elements 1, 3, 5
        >>> reader.take(2)["id"].tolist(), reader.take(2)["tokens"].tolist(), reader.take(2)
        ([1, 3], [[5, 5]], None)
        >>> src.open(shard=1, num_shards=2, start=2).take(5)["id"].tolist()  # skips 1 and 3
        [5]
        >>> by_file = StreamSource(lambda shard, n: range(10 * shard, 10 * shard + 3))
        >>> by_file.open(2, 4).take(8).tolist()
        [20, 21, 22]
    """

    def __init__(
        self,
        stream: Iterable[Any] | Callable[[int, int], Iterable[Any]],
        *,
        name: str | None = None,
    ):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {type(name).__name__} {name!r}")
        if isinstance(stream, Iterator):
            raise TypeError(
                f"StreamSource needs a stream it can start again, but got a one-shot iterator "
                f"({type(stream).__name__}): every shard and every resume iterates the stream "
                "anew. Pass a re-iterable (a list, or an object whose __iter__ starts over) or a "
                "callable that makes the iterator, e.g. "
                "StreamSource(lambda shard, num_shards: my_generator(shard, num_shards))"
            )
        if isinstance(stream, Mapping):
            raise TypeError(
                "StreamSource got a dict; a dict of equally long arrays is random access: pass it "
                "to DataLoader directly (or wrap it in psdp.ArraySource)"
            )
        self._iterable: Iterable[Any] | None = None
        self._shard_fn: Callable[[int, int], Iterable[Any]] | None = None
        if isinstance(stream, Iterable):
            self._iterable = stream
        elif callable(stream):
            _check_shard_signature(stream)
            self._shard_fn = stream
        else:
            raise TypeError(
                f"StreamSource needs a re-iterable or a callable (shard_index, num_shards) -> "
                f"iterable, got {type(stream).__name__}"
            )
        self.name = name if name is not None else _default_name(stream)

    @property
    def round_robin(self) -> bool:
        """True when elements are dealt to shards in turn (a re-iterable stream)."""
        return self._iterable is not None

    def open(self, shard: int, num_shards: int, start: int = 0) -> StreamReader:
        """A reader of shard ``shard`` of ``num_shards``, after skipping ``start`` of its elements.

        Skipping walks the elements one by one: O(start) (O(start * num_shards) stream elements for
        a round-robin stream). If the shard has fewer than ``start`` elements, the reader is at its
        end (`StreamReader.take` returns ``None``) and its ``consumed`` is the shard's length.

        Examples:
            >>> reader = StreamSource(np.arange(10)).open(0, 3, start=1)  # shard 0: 0, 3, 6
            >>> reader.consumed, reader.take(5).tolist(), reader.consumed
            (1, [3, 6], 3)
        """
        check_int("num_shards", num_shards, minimum=1)
        check_int("shard", shard, minimum=0)
        if shard >= num_shards:
            raise ValueError(
                f"shard must be in [0, {num_shards - 1}] for num_shards={num_shards}, got {shard}"
            )
        check_int("start", start, minimum=0)
        shard, num_shards, start = int(shard), int(num_shards), int(start)
        where = f"{self.describe()}, shard {shard} of {num_shards}"
        underlying = self._iterate(shard, num_shards, where)
        elements = _whole_rounds(underlying, shard, num_shards) if self.round_robin else underlying
        return StreamReader(
            elements,
            underlying,
            shard=shard,
            num_shards=num_shards,
            start=start,
            where=where,
            round_robin=self.round_robin,
        )

    def _iterate(self, shard: int, num_shards: int, where: str) -> Iterator[Any]:
        if self._iterable is not None:
            return iter(self._iterable)
        assert self._shard_fn is not None
        try:
            produced = self._shard_fn(shard, num_shards)
        except Exception as error:
            error.add_note(f"while opening {where}")
            raise
        if isinstance(produced, Mapping) or not isinstance(produced, Iterable):
            raise TypeError(
                f"{where}: the stream callable returned a {type(produced).__name__}; it must "
                "return an iterable of the shard's elements (a generator, a list, ...)"
            )
        return iter(produced)

    def describe(self) -> str:
        """One line for logs.

        Examples:
            >>> StreamSource([1, 2], name="ids").describe()
            'StreamSource(ids, round-robin over a re-iterable)'
        """
        how = "round-robin over a re-iterable" if self.round_robin else "sharded by a callable"
        return f"StreamSource({self.name}, {how})"

    def __repr__(self) -> str:
        return self.describe()


class StreamReader:
    """One shard of a `StreamSource`, read forwards in chunks of rows; made by `StreamSource.open`.

    Attributes:
        consumed: elements of this shard consumed so far: ``start`` plus the rows taken (less
            only when the shard had fewer than ``start`` elements).
        shard: the shard index.
        num_shards: the number of shards.

    Thread-safe: concurrent `take` calls get consecutive, disjoint elements. `close` never waits
    for a `take` in progress; the underlying iterator is closed when that take returns.

    Examples:
        >>> with StreamSource([[1, 2], [3, 4], [5, 6]]).open(0, 1) as reader:
        ...     reader.take(2).tolist(), reader.consumed
        ([[1, 2], [3, 4]], 2)
    """

    def __init__(
        self,
        elements: Iterator[Any],
        underlying: Iterator[Any],
        *,
        shard: int,
        num_shards: int,
        start: int,
        where: str,
        round_robin: bool,
    ):
        self.shard = shard
        self.num_shards = num_shards
        self.consumed = 0
        self._elements = elements
        self._underlying = underlying
        self._where = where
        self._round_robin = round_robin
        self._lock = threading.Lock()
        self._closed = False
        self._ended = False
        self._pending: list[Leaves] = []  # an element looked at by take(0), not yet consumed
        self._schema: Schema | None = None
        self._schema_from = 0
        while self.consumed < start and self._next() is not _END:
            self.consumed += 1

    def take(self, n: int) -> Rows | None:
        """The next ``n`` elements stacked into rows: an array ``(k, ...)`` or a dict of them.

        ``k < n`` only when the shard ended; ``None`` when it ended with ``k == 0``. ``take(0)``
        returns zero rows of the stream's leaves (looking at one element, which stays unconsumed).

        Raises:
            ValueError: an element's leaves, shape or dtype differ from the first element this
                reader read (the message names both elements, the shard and the change), or the
                reader is closed.
            TypeError: an element is not numeric (strings, objects, ragged lists).

        Examples:
            >>> reader = StreamSource(np.arange(5)).open(0, 1)
            >>> reader.take(3).tolist(), reader.take(3).tolist(), reader.take(3)
            ([0, 1, 2], [3, 4], None)
        """
        check_int("n", n, minimum=0)
        with self._lock:
            try:
                return self._take(int(n))
            finally:
                if self._closed:
                    self._close_underlying()

    def _take(self, n: int) -> Rows | None:
        if self._closed:
            raise ValueError(f"{self._where}: this reader is closed; open a new one to read again")
        if n == 0:
            if not self._pending and not self._ended:
                element = self._next()
                if element is not _END:
                    self._pending.append(self._leaves(element, self.consumed))
            if not self._pending:
                return None
            return _stack([], self._schema)
        rows: list[Leaves] = []
        while len(rows) < n:
            if self._pending:
                rows.append(self._pending.pop())
            else:
                element = self._next()
                if element is _END:
                    break
                rows.append(self._leaves(element, self.consumed))
            self.consumed += 1
        return _stack(rows, self._schema) if rows else None

    def _next(self) -> Any:
        """The next raw element, or `_END` at the end of the shard."""
        if self._ended:
            return _END
        try:
            return next(self._elements)
        except StopIteration:
            self._ended = True
            return _END
        except Exception as error:
            error.add_note(f"while reading element {self._number(self.consumed)} of {self._where}")
            raise

    def _number(self, index: int) -> str:
        if self._round_robin and self.num_shards > 1:
            return f"{index} (element {self.shard + index * self.num_shards} of the stream)"
        return str(index)

    def _leaves(self, element: Any, index: int) -> Leaves:
        """The element's leaves as arrays, checked against the first element this reader read."""
        if isinstance(element, Mapping):
            if not element:
                raise ValueError(
                    f"{self._where}: element {self._number(index)} is an empty dict; an element "
                    "is one row: an array or a dict of arrays"
                )
            items: list[tuple[Key, Any]] = [(str(k), v) for k, v in element.items()]
        else:
            items = [(None, element)]
        leaves: Leaves = {}
        for key, value in items:
            try:
                array = np.asarray(value)
            except ValueError as error:  # ragged nested lists
                raise TypeError(
                    f"{self._where}: element {self._number(index)}{_leaf_suffix(key)} is not an "
                    f"array ({error}); pad it to one shape"
                ) from error
            if array.dtype.kind not in _NUMERIC_KINDS:
                raise TypeError(
                    f"{self._where}: element {self._number(index)}{_leaf_suffix(key)} has dtype "
                    f"{array.dtype}; stream elements must be numeric or bool arrays (tokenize "
                    "or encode them first)"
                )
            leaves[key] = array
        schema: Schema = {k: (a.dtype, a.shape) for k, a in leaves.items()}
        if self._schema is None:
            self._schema, self._schema_from = schema, index
        elif schema != self._schema:
            raise ValueError(
                f"{self._where}: element {self._number(index)} "
                f"{_schema_change(self._schema, schema, self._number(self._schema_from))}; every "
                "element of a "
                "stream must have the same leaves, shapes and dtypes (pad or cast the elements)"
            )
        return leaves

    def close(self) -> None:
        """Closes the stream's iterator (a generator's ``finally`` runs); idempotent.

        Examples:
            >>> reader = StreamSource([1, 2, 3]).open(0, 1)
            >>> reader.close(); reader.close()
        """
        self._closed = True
        if self._lock.acquire(blocking=False):  # else the running take closes it when it returns
            try:
                self._close_underlying()
            finally:
                self._lock.release()

    def _close_underlying(self) -> None:
        self._ended = True
        self._pending.clear()
        close = getattr(self._underlying, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StreamReader({self._where}, consumed={self.consumed})"


def _whole_rounds(elements: Iterator[Any], shard: int, num_shards: int) -> Iterator[Any]:
    """Element ``shard`` of every complete round of ``num_shards`` elements.

    A final incomplete round is dropped, so all shards have the same length and every host of a
    pod reaches the end of its shard at the same step.
    """
    while True:
        elements_of_round = list(itertools.islice(elements, num_shards))
        if len(elements_of_round) < num_shards:
            return
        yield elements_of_round[shard]


def _check_shard_signature(fn: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return
    try:
        signature.bind(0, 1)
    except TypeError as error:
        raise TypeError(
            f"a callable stream is called as stream(shard_index, num_shards), but "
            f"{_default_name(fn)}{signature} cannot take those two arguments ({error}). A "
            "generator function of no arguments cannot be sharded by psdp: make it take "
            "(shard_index, num_shards), or pass a re-iterable to shard round-robin"
        ) from error


def _default_name(stream: Any) -> str:
    name = getattr(stream, "__qualname__", None)
    return name if isinstance(name, str) else type(stream).__name__


def _leaf_suffix(key: Key) -> str:
    """How an element's messages name a leaf: nothing for an array element."""
    return "" if key is None else f" leaf {key!r}"


def _describe_schema(schema: Schema) -> str:
    if list(schema) == [None]:
        dtype, shape = schema[None]
        return f"an array {dtype}{list(shape)}"
    return f"a dict with leaves {sorted(map(str, schema))}"


def _schema_change(reference: Schema, got: Schema, reference_index: str) -> str:
    """How ``got`` differs from ``reference``, e.g. "leaf 'x' is int32[3] but element 0 had ..."."""
    if reference.keys() != got.keys():
        return f"is {_describe_schema(got)} but element {reference_index} was {_describe_schema(reference)}"
    for key, (dtype, shape) in got.items():
        want_dtype, want_shape = reference[key]
        if (dtype, shape) != (want_dtype, want_shape):
            label = "is" if key is None else f"has leaf {key!r}"
            return (
                f"{label} {dtype}{list(shape)} but element {reference_index} had "
                f"{want_dtype}{list(want_shape)}"
            )
    raise AssertionError("schemas differ but no leaf does")


def _stack(rows: list[Leaves], schema: Schema | None) -> Rows:
    """Stacks checked elements into rows (an array for array elements, else a dict)."""
    assert schema is not None
    out = {
        key: (np.stack([r[key] for r in rows]) if rows else np.empty((0, *shape), dtype))
        for key, (dtype, shape) in schema.items()
    }
    return out[None] if None in out else in_leaf_order({str(k): v for k, v in out.items()})
