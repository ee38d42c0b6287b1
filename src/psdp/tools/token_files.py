"""Token files of other tools read as documents for `psdp.write_documents` (``psdp write``).

Three forms (``docs/guides/tokens.md``, "Converting token files"):

- a flat ``.npy`` token array with an offsets ``.npy`` of ``D + 1`` entries (nanoGPT/MaxText);
- a flat ``.npy`` or a raw nanoGPT ``.bin`` (no header, ``uint16`` by default) split after each
  ``eos_id`` token, the EOS kept as its document's last token, so that the token stream is the
  file's exactly;
- ``.jsonl``: one document per line, a JSON list of token ids, or an object holding one under
  ``key``.

Every error names the file and the place (line, document or offset) and says the fix.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import numpy as np

#: The dtype of a raw ``.bin`` token file when none is given: nanoGPT's.
BIN_DTYPE = np.dtype(np.uint16)


class Documents:
    """Documents read from a token file, and the empty ones left out (a store holds none).

    Iterate it (once) for the documents as 1-D token arrays; ``empty`` counts the documents left
    out so far.
    """

    def __init__(self, docs: Iterator[np.ndarray], dtype: np.dtype):
        self._docs = docs
        self.dtype = dtype
        self.empty = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        for doc in self._docs:
            if len(doc):
                yield doc
            else:
                self.empty += 1


def flat_tokens(path: str, dtype: Any = None) -> np.ndarray:
    """The flat tokens of a ``.npy`` file (memory-mapped; ``dtype`` must be None or its own) or a
    raw ``.bin`` file (``dtype``, default `BIN_DTYPE`).

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> np.array([5, 6, 0], np.uint16).tofile(f"{tmp.name}/t.bin")
        >>> flat_tokens(f"{tmp.name}/t.bin").tolist()
        [5, 6, 0]
        >>> tmp.cleanup()
    """
    if path.endswith(".bin"):
        dtype = BIN_DTYPE if dtype is None else integer_dtype(dtype)
        size = _file_size(path)
        if size % dtype.itemsize:
            raise ValueError(
                f"{path!r} holds {size} bytes, not a whole number of {dtype} tokens "
                f"({dtype.itemsize} bytes each); give the dtype it was written with (--dtype)"
            )
        return np.memmap(path, dtype, mode="r") if size else np.zeros(0, dtype)
    tokens = _load_npy(path, "tokens")
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError(
            f"{path!r} must hold a flat (1-D) integer token array, got {tokens.dtype}"
            f"{list(tokens.shape)}; save the concatenated token ids (np.save(path, tokens))"
        )
    if dtype is not None and integer_dtype(dtype) != tokens.dtype:
        raise ValueError(
            f"--dtype {np.dtype(dtype)} reads raw .bin files; {path!r} is a .npy file of "
            f"{tokens.dtype} (to store another dtype, write the store with write_documents)"
        )
    return tokens


def split_at_offsets(tokens: np.ndarray, offsets_path: str, tokens_path: str) -> Documents:
    """Document ``d`` is ``tokens[offsets[d]:offsets[d + 1]]``; the offsets are checked first.

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> np.save(f"{tmp.name}/o.npy", np.array([0, 2, 2, 3]))
        >>> docs = split_at_offsets(np.array([7, 8, 9]), f"{tmp.name}/o.npy", "t.npy")
        >>> [d.tolist() for d in docs], docs.empty
        ([[7, 8], [9]], 1)
        >>> tmp.cleanup()
    """
    offsets = _load_npy(offsets_path, "offsets")
    where = f"the offsets {offsets_path!r}"
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 2:
        raise ValueError(
            f"{where} must be a 1-D integer array of D + 1 >= 2 entries (each document's start, "
            f"then the end), got {offsets.dtype}{list(offsets.shape)}"
        )
    offsets = np.asarray(offsets, np.int64)
    if offsets[0] != 0:
        raise ValueError(f"{where} must start at 0, got {int(offsets[0])}")
    down = np.flatnonzero(np.diff(offsets) < 0)
    if len(down):
        d = int(down[0])
        raise ValueError(
            f"{where} must never decrease, got offsets[{d}]={int(offsets[d])} > "
            f"offsets[{d + 1}]={int(offsets[d + 1])}"
        )
    if offsets[-1] != len(tokens):
        raise ValueError(
            f"{where} end at {int(offsets[-1])}, but {tokens_path!r} holds {len(tokens)} tokens; "
            "the last offset is the number of tokens (if the file holds only each document's "
            "start, append it: np.append(offsets, len(tokens)))"
        )
    spans = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
    return Documents((tokens[a:b] for a, b in spans), tokens.dtype)


def split_after_eos(tokens: np.ndarray, eos_id: int) -> Documents:
    """Documents ending with (and keeping) each ``eos_id`` token; tokens after the last EOS are
    the last document.

    Examples:
        >>> docs = split_after_eos(np.array([5, 6, 0, 7, 0, 8]), 0)
        >>> [d.tolist() for d in docs]
        [[5, 6, 0], [7, 0], [8]]
    """
    if eos_id < 0 or (tokens.dtype.kind in "iu" and eos_id > np.iinfo(tokens.dtype).max):
        raise ValueError(f"--eos-id {eos_id} cannot be a token of {tokens.dtype}")
    block = 1 << 24  # tokens compared at a time: a memory-mapped file is never read whole
    ends = [
        start + 1 + np.flatnonzero(np.asarray(tokens[start : start + block]) == eos_id)
        for start in range(0, len(tokens), block)
    ]
    cuts = [0, *np.concatenate([np.zeros(0, np.int64), *ends]).tolist()]
    if cuts[-1] != len(tokens):
        cuts.append(len(tokens))
    spans = itertools.pairwise(cuts)
    return Documents((tokens[a:b] for a, b in spans), tokens.dtype)


def jsonl_documents(path: str, dtype: Any, key: str | None = None) -> Documents:
    """One document per line of a ``.jsonl`` file: a JSON list of integer token ids, or with
    ``key`` an object holding that list under ``key``. Blank lines are skipped; every id must fit
    ``dtype``.

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> with open(f"{tmp.name}/d.jsonl", "w") as f:
        ...     _ = f.write('{"ids": [5, 6]}\\n{"ids": [7]}\\n')
        >>> [d.tolist() for d in jsonl_documents(f"{tmp.name}/d.jsonl", np.uint16, "ids")]
        [[5, 6], [7]]
        >>> tmp.cleanup()
    """
    dtype = integer_dtype(dtype)
    try:
        # utf-8-sig: a byte-order mark (Windows tools write one) is not part of line 1's JSON
        handle = open(path, encoding="utf-8-sig")  # noqa: SIM115  (closed by the generator)
    except OSError as err:
        raise ValueError(f"cannot read {path!r}: {err.strerror}") from None
    return Documents(_jsonl_lines(handle, path, dtype, key), dtype)


def _jsonl_lines(handle: Any, path: str, dtype: np.dtype, key: str | None) -> Iterator[np.ndarray]:
    low, high = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path!r} line {number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{where} is not JSON ({err.msg} at character {err.pos})"
                ) from None
            ids = _ids_of(value, where, key)
            bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool)]
            if bad:
                raise ValueError(
                    f"{where}: token ids must be integers, got {bad[0]!r}; write each document "
                    "as a list of token ids (tokenize first)"
                )
            out = [i for i in ids if not low <= i <= high]
            if out:
                raise ValueError(
                    f"{where}: token id {out[0]} does not fit {dtype} ({low} to {high}); give "
                    f"{_dtype_for(out[0])}"
                )
            yield np.array(ids, dtype)


def _dtype_for(token: int) -> str:
    """The fix for an id that does not fit: a dtype that holds it."""
    if token < 0:
        return f"a signed --dtype (e.g. {'int32' if token >= -(2**31) else 'int64'})"
    wider = next((d for d in ("uint16", "uint32") if token <= np.iinfo(d).max), "uint64")
    return f"a wider --dtype (e.g. {wider})"


def _ids_of(value: Any, where: str, key: str | None) -> list[Any]:
    if key is not None:
        if not isinstance(value, dict) or key not in value:
            got = f"keys {sorted(value)}" if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{where} must be an object with the key {key!r} (--key), got {got}")
        value = value[key]
    if not isinstance(value, list):
        hint = (
            " (lines are objects: name the key of the token ids with --key)"
            if (key is None and isinstance(value, dict))
            else " (text is tokenized by `psdp prepare`, docs/guides/prepare.md)"
            if isinstance(value, str)
            else ""
        )
        raise ValueError(f"{where} must be a list of token ids, got {type(value).__name__}{hint}")
    return value


def integer_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy integer dtype, or a `ValueError` naming it."""
    try:
        out = np.dtype(dtype)
    except TypeError:
        out = None
    if out is None or out.kind not in "iu":
        raise ValueError(f"--dtype {dtype} is not an integer dtype; give e.g. uint16 or uint32")
    return out


def _load_npy(path: str, what: str) -> np.ndarray:
    if not path.endswith(".npy"):
        raise ValueError(f"the {what} file {path!r} must be a .npy file (np.save)")
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the {what} file {path!r}: {err}") from None


def _file_size(path: str) -> int:
    import os

    try:
        return os.path.getsize(path)
    except OSError as err:
        raise ValueError(f"cannot read {path!r}: {err.strerror}") from None
