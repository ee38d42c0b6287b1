"""A length index over a store of 10^9 documents that is never written (``docs/measurements/
scale.md``, "The length index at 10^9 documents"): `tests.packing_oracle.FormulaCorpus`'s
documents of at least `MIN_LENGTH` tokens (about half of them), whose selection is periodic as
the corpus's lengths are, so its head file (the selection's document index, a real file beside a
real directory) and its blocks (served from the formula when read) are computed, not found by a
pass. Opening it reads the head file and no block, and a host keeps 16 bytes per 4,096 selected
documents; rows far into the selection (past 2^39 tokens) hold the tokens a numpy oracle of the
formula gives. Counts only, no timing: ``python -m tests.test_length_scale DIR`` prints the
seconds and MiB of the open (``docs/measurements/scale.md``)."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

from psdp import DocumentStore, TokenSequences
from psdp.sources import LengthBounds, SelectedDocuments
from psdp.sources.documents import selected
from psdp.sources.documents.beside import IndexFolder, store_digest
from psdp.sources.documents.index import STRIDE, DocumentIndex
from tests.packing_oracle import FormulaCorpus

DOCUMENTS, PERIOD, MIN_LENGTH, SEQ_LEN = 10**9, 4096, 1200, 4096


class Selection:
    """The oracle: selected document ``i`` of the formula corpus, in closed form (numpy only)."""

    def __init__(self, corpus: FormulaCorpus):
        self.corpus = corpus
        self.positions = np.flatnonzero(corpus.period_lengths >= MIN_LENGTH)  # in a period
        chosen = corpus.period_lengths[self.positions]
        self.per_period, self.period_tokens = len(chosen), int(chosen.sum())
        self.before = np.concatenate([[0], np.cumsum(chosen)])  # tokens before each, in a period
        tail = DOCUMENTS % PERIOD  # the last period is a prefix of one
        self.count = (DOCUMENTS // PERIOD) * self.per_period + int((self.positions < tail).sum())
        self.tokens = int(self.start(np.array([self.count]))[0])

    def ids(self, i: np.ndarray) -> np.ndarray:
        return (i // self.per_period) * PERIOD + self.positions[i % self.per_period]

    def start(self, i: np.ndarray) -> np.ndarray:
        """Where selected document ``i`` starts in the selection (``i = count``: the end)."""
        return (i // self.per_period) * self.period_tokens + self.before[i % self.per_period]

    def token_at(self, p: np.ndarray) -> np.ndarray:
        """The selection's token at position ``p``: its document found in closed form."""
        period, within = p // self.period_tokens, p % self.period_tokens
        i = period * self.per_period + np.searchsorted(self.before, within, side="right") - 1
        return self.corpus.tokens(self.corpus.offsets(self.ids(i)) + p - self.start(i))

    def block(self, k: int) -> np.ndarray:
        i = np.arange(k * selected.BLOCK, min((k + 1) * selected.BLOCK, self.count))
        return np.stack([self.ids(i), self.start(i), self.corpus.offsets(self.ids(i))], axis=1)


class Formula:
    """A flat array of the formula (``[a:b]``, and ``take`` for the offsets)."""

    def __init__(self, length: int, dtype, values):
        self.shape, self.dtype, self._values = (length,), np.dtype(dtype), values

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, _ = where.indices(self.shape[0])
        return self.take(np.arange(start, max(start, stop)))

    def take(self, d: np.ndarray) -> np.ndarray:
        return self._values(np.asarray(d, np.int64)).astype(self.dtype)


def formula_store(corpus: FormulaCorpus) -> DocumentStore:
    docs = np.minimum(np.arange(-(-DOCUMENTS // STRIDE) + 1) * STRIDE, DOCUMENTS)
    index = DocumentIndex(DOCUMENTS, STRIDE, corpus.offsets(docs), docs,
                          int(corpus.period_lengths.max()))  # fmt: skip
    offsets = Formula(DOCUMENTS + 1, np.int64, corpus.offsets)
    tokens = Formula(corpus.num_tokens, np.int32, corpus.tokens)
    return DocumentStore(offsets, {"input_ids": tokens}, name="formula", index=index,
                         spot_check=False)  # fmt: skip


def write_head(directory: Path, store: DocumentStore, oracle: Selection) -> int:
    """The head file `build_length_index` would write, computed; returns its size."""
    marks_at = np.minimum(np.arange(-(-oracle.count // STRIDE) + 1) * STRIDE, oracle.count)
    header = {
        "format": selected.FORMAT, "version": selected.VERSION, "block": selected.BLOCK,
        "store": store_digest(store.index, store.written), "blocks": "length-formula/",
        "min_length": MIN_LENGTH, "max_length": None, "documents": oracle.count,
        "tokens": oracle.tokens, "longest": int(oracle.corpus.period_lengths.max()),
        "shortest": 1, "source_longest": int(oracle.corpus.period_lengths.max()),
    }  # fmt: skip
    body = io.BytesIO()
    np.savez(body, header=np.array(json.dumps(header)), marks=oracle.start(marks_at),
             nonempty=marks_at)  # fmt: skip
    IndexFolder(str(directory)).write(LengthBounds(MIN_LENGTH).file_name, body.getvalue())
    return len(body.getvalue())


def opened(directory: Path) -> tuple[SelectedDocuments, Selection, list[int], list[str]]:
    """The selection opened as a `DataConfig` source opens it; the blocks and files it read."""
    corpus = FormulaCorpus(DOCUMENTS, period=PERIOD)
    store, oracle = formula_store(corpus), Selection(corpus)
    write_head(directory, store, oracle)
    blocks: list[int] = []
    files: list[str] = []
    real_read = IndexFolder.read

    def counted_block(folder, name):
        def block(k):
            blocks.append(k)
            return oracle.block(k)

        return block

    def counted_read(folder, name):
        files.append(name)
        return real_read(folder, name)

    with (
        mock.patch.object(IndexFolder, "read", counted_read),
        mock.patch.object(selected, "_local_block", counted_block),
    ):
        selection = SelectedDocuments.beside(str(directory), store, min_length=MIN_LENGTH)
    return selection, oracle, blocks, files


def test_a_length_index_of_a_billion_documents_opens_from_its_head_and_reads_exact_rows(
    tmp_path,
):
    selection, oracle, blocks, files = opened(tmp_path)
    assert (files, blocks) == ([LengthBounds(MIN_LENGTH).file_name], [])  # the head, no block
    assert selection.num_documents == oracle.count > 4 * 10**8
    assert selection.num_tokens == oracle.tokens > 2**39
    held = selection.index.marks.nbytes + selection.index.nonempty.nbytes
    assert held == 16 * (-(-oracle.count // STRIDE) + 1)  # 16 bytes per 4,096 selected
    view = TokenSequences(selection, SEQ_LEN)
    rows = np.array([0, 1, 2**26 + 5, (2**39 // SEQ_LEN) + 3, len(view) - 1])
    got = view.read(rows)["input_ids"]
    positions = rows[:, None] * SEQ_LEN + np.arange(SEQ_LEN)
    assert got.tolist() == oracle.token_at(positions).tolist()
    ids = selection.document_ids(oracle.count - 3, oracle.count)
    assert ids.tolist() == oracle.ids(np.arange(oracle.count - 3, oracle.count)).tolist()
    assert len(blocks) <= 2 * len(rows) + 1  # a block or two a row, never a pass


def _rss_anon() -> int:
    text = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("RssAnon")))


if __name__ == "__main__":  # the seconds and MiB of the open, for docs/measurements/scale.md
    directory = Path(sys.argv[1])
    corpus = FormulaCorpus(DOCUMENTS, period=PERIOD)
    store, oracle = formula_store(corpus), Selection(corpus)
    size = write_head(directory, store, oracle)
    before, started = _rss_anon(), time.perf_counter()
    selection = SelectedDocuments.beside(str(directory), store, min_length=MIN_LENGTH)
    seconds = time.perf_counter() - started
    print(json.dumps({
        "selected": selection.num_documents, "tokens": selection.num_tokens,
        "head_bytes": size, "open_s": round(seconds, 4),
        "added_rss_anon_mib": round((_rss_anon() - before) / 1024, 2),
    }))  # fmt: skip
