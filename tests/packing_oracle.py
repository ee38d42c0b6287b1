"""An independent oracle for packing, built from the documents themselves, never from a plan.

`naive_pack` is each strategy written the obvious slow way (a list of rooms, scanned);
`packed_table` lays the documents out as the packed rows every leaf must hold; `check_packed`
checks rows from their values alone: documents whose tokens name them (``doc * 1000 + i``) must
each appear exactly once, in runs of consecutive tokens that never cross a row.
"""

from __future__ import annotations

import numpy as np

#: Token ``i`` of document ``d`` is ``d * STRIDE + i`` (documents stay shorter than this).
STRIDE = 1000


def named_documents(lengths, masks: bool = False) -> list[dict[str, np.ndarray]]:
    """Documents whose tokens name them; with ``masks``, a loss mask of every third token off."""
    docs = []
    for d, n in enumerate(lengths):
        doc = {"input_ids": (d * STRIDE + np.arange(n)).astype(np.int32)}
        if masks:
            doc["loss_mask"] = (np.arange(n) % 3 != 1).astype(np.uint8)
        docs.append(doc)
    return docs


def naive_pack(
    lengths, seq_len, strategy, long_documents="split", seed=None, window=None, max_segments=None
):
    """Sequences as lists of ``(doc, start, length)``, item by item, every sequence scanned
    (``seed``: the documented order, numpy's ``default_rng(seed).permutation``). With
    ``window``, each window of that many documents is packed alone, the windows' sequences one
    after another, window ``w`` in the order ``default_rng([seed, w]).permutation``. With
    ``max_segments``, a sequence holding that many items takes no more."""
    if window is None:
        order = (
            range(len(lengths))
            if seed is None
            else np.random.default_rng(seed).permutation(len(lengths))
        )
        return _naive_bins(lengths, order, seq_len, strategy, long_documents, max_segments)
    bins = []
    for w, first in enumerate(range(0, len(lengths), window)):
        n = min(window, len(lengths) - first)
        local = range(n) if seed is None else np.random.default_rng([seed, w]).permutation(n)
        order = [first + int(i) for i in local]
        bins += _naive_bins(lengths, order, seq_len, strategy, long_documents, max_segments)
    return bins


def _naive_bins(lengths, order, seq_len, strategy, long_documents, max_segments=None):
    items = []
    for d in order:
        n = int(lengths[d])
        if n > seq_len and long_documents == "drop":
            continue
        if long_documents == "truncate":
            n = min(n, seq_len)
        items += [(int(d), s, min(seq_len, n - s)) for s in range(0, n, seq_len)]
    rooms: list[int] = []
    bins: list[list[tuple[int, int, int]]] = []
    for item in items:
        fits = [
            b
            for b, room in enumerate(rooms)
            if room >= item[2] and (max_segments is None or len(bins[b]) < max_segments)
        ]
        if strategy == "greedy":
            fits = fits[-1:] if fits and fits[-1] == len(rooms) - 1 else []
        elif strategy == "best_fit":
            fits = sorted(fits, key=lambda b: (rooms[b], b))
        if fits:
            b = fits[0]
        else:
            b = len(rooms)
            rooms.append(seq_len)
            bins.append([])
        rooms[b] -= item[2]
        bins[b].append(item)
    return bins


def packed_table(docs, bins, seq_len, pad_id=0) -> dict[str, np.ndarray]:
    """The rows a packed source must hold, leaf by leaf, from the documents and ``bins``."""
    q = len(bins)
    ids = docs[0]["input_ids"]
    table = {"input_ids": np.full((q, seq_len), pad_id, ids.dtype)}
    for key, value in docs[0].items():
        if key != "input_ids":
            table[key] = np.zeros((q, seq_len), value.dtype)
    table["segment_ids"] = np.zeros((q, seq_len), np.int32)
    table["positions"] = np.zeros((q, seq_len), np.int32)
    table.setdefault("loss_mask", np.zeros((q, seq_len), np.uint8))
    for row, pieces in enumerate(bins):
        column = 0
        for segment, (d, start, n) in enumerate(pieces, 1):
            cols = slice(column, column + n)
            for key, value in docs[d].items():
                table[key][row, cols] = value[start : start + n]
            if "loss_mask" not in docs[d]:
                table["loss_mask"][row, cols] = 1
            table["segment_ids"][row, cols] = segment
            table["positions"][row, cols] = np.arange(n)
            column += n
    return table


def check_packed(rows: dict[str, np.ndarray], lengths, seq_len, dropped=(), truncate=False) -> None:
    """Every token of every kept document exactly once (with ``truncate``, its first
    ``seq_len``), in segments that are runs of one document's consecutive tokens inside one row;
    positions restart at each segment; padding only after the segments, with segment id 0 and
    loss mask 0."""
    seen = []
    for r in range(len(rows["input_ids"])):
        seg, pos, tok = rows["segment_ids"][r], rows["positions"][r], rows["input_ids"][r]
        real = int((seg > 0).sum())
        assert (seg[:real] > 0).all() and (seg[real:] == 0).all(), (r, seg)
        assert (rows["loss_mask"][r, real:] == 0).all()
        for s in range(1, int(seg.max(initial=0)) + 1):
            at = np.flatnonzero(seg == s)
            assert at.size and (np.diff(at) == 1).all(), (r, s, at)
            docs, index = tok[at] // STRIDE, tok[at] % STRIDE
            assert (docs == docs[0]).all() and (np.diff(index) == 1).all(), (r, s, tok[at])
            assert pos[at].tolist() == list(range(at.size)), (r, s, pos[at])
            assert at.size <= seq_len
            seen.append(tok[at])
    got = np.sort(np.concatenate(seen)) if seen else np.zeros(0, int)
    kept = [d for d, n in enumerate(lengths) if d not in set(dropped)]
    cut = seq_len if truncate else max(lengths, default=0)
    want = np.sort(
        np.concatenate([d * STRIDE + np.arange(min(lengths[d], cut)) for d in kept] or [[]])
    )
    np.testing.assert_array_equal(got, want.astype(got.dtype))


class FormulaCorpus:
    """A corpus computed on the fly from a seeded formula, never written: document lengths
    repeat every ``period`` documents (so one packing window of ``period`` documents is every
    window, and the oracle packs it once); token ``t`` of the flat corpus is a 31-bit hash of
    ``t``, and its loss mask is ``t % 3 != 1``. (Branch seqscale adds tests/scale_corpus.py for
    `TokenSequences`; this one is periodic for the packing oracle's sake.)

    Example: 10**9 documents of 1 to 2400 tokens (mean ~1200), 1.2 * 10**12 tokens.
    """

    def __init__(self, documents: int, period: int = 4096, max_length: int = 2400, seed: int = 0):
        self.documents, self.period = documents, period
        self.period_lengths = (1 + _mix(np.arange(period) + seed * period) % max_length).astype(
            np.int64
        )
        self.period_offsets = np.concatenate([[0], np.cumsum(self.period_lengths)])
        self.num_tokens = int(self.offsets(np.array([documents]))[0])

    def offsets(self, docs: np.ndarray) -> np.ndarray:
        """``offsets[docs]``: where each document starts in the flat corpus (int64)."""
        docs = np.asarray(docs, np.int64)
        return (docs // self.period) * self.period_offsets[-1] + self.period_offsets[
            docs % self.period
        ]

    def lengths(self, first: int, stop: int) -> np.ndarray:
        return self.period_lengths[np.arange(first, stop) % self.period]

    @staticmethod
    def tokens(positions: np.ndarray) -> np.ndarray:
        return (_mix(positions) >> np.uint64(33)).astype(np.int32)

    @staticmethod
    def loss_mask(positions: np.ndarray) -> np.ndarray:
        return (np.asarray(positions) % 3 != 1).astype(np.uint8)


def _mix(x) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping, as the formula wants)."""
    z = np.asarray(x).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def with_eos(docs, eos_id):
    """The documents as packed with ``eos_id``: each non-empty one followed by the EOS (its other
    leaves 0 there), and their slot counts."""
    if eos_id is None:
        return docs, [len(d["input_ids"]) for d in docs]
    out = []
    for doc in docs:
        if not len(doc["input_ids"]):
            out.append(doc)
            continue
        out.append({k: np.append(v, np.array(eos_id if k == "input_ids" else 0, v.dtype))
                    for k, v in doc.items()})  # fmt: skip
    return out, [len(d["input_ids"]) for d in out]


def with_targets(table, pad_id=0, store_mask=False) -> dict[str, np.ndarray]:
    """``table`` (a `packed_table`) with next-token ``targets`` and ``loss_mask`` as documented:
    column c's target is column c + 1's token when both hold one segment (else ``pad_id``);
    the mask is 1 there (the store's loss mask of the target token, with ``store_mask``), else 0.
    Cell by cell, the obvious way."""
    ids, seg = table["input_ids"], table["segment_ids"]
    targets = np.full_like(ids, pad_id)
    mask = np.zeros_like(table["loss_mask"])
    for r, c in np.ndindex(ids.shape):
        if c + 1 < ids.shape[1] and seg[r, c] > 0 and seg[r, c + 1] == seg[r, c]:
            targets[r, c] = ids[r, c + 1]
            mask[r, c] = table["loss_mask"][r, c + 1] if store_mask else 1
    return {**table, "targets": targets, "loss_mask": mask}


def levanter_pack_ranges(lengths, seq_len, max_segments=None):
    """Levanter's prepacking (``levanter.data.packing.pack_documents`` with
    ``slice_strategy="left"``, its text packing) as its rule reads, for non-empty documents:
    documents in store order, each pack a run of consecutive documents, closed when the next
    does not fit or it holds ``max_segments``; a document longer than ``seq_len`` is a pack of
    its own (its first ``seq_len`` tokens read). Returns the packs as lists of documents."""
    packs, current, used = [], [], 0
    for d, n in enumerate(lengths):
        assert n > 0, "Levanter's packs count an empty document as a segment; psdp skips it"
        n = min(n, seq_len)
        if current and (used + n > seq_len or len(current) == max_segments):
            packs.append(current)
            current, used = [], 0
        current.append(d)
        used += n
    return [*packs, current] if current else packs
