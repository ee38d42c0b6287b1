"""The pack index: where each window's sequences start, so that sequence ``q`` of a corpus packed
in windows is found without packing the corpus (``docs/guides/packing.md``, "Packing in windows").

Window ``w`` packs documents ``[w * W, (w + 1) * W)`` alone (`plan_window`), and the corpus's
sequences are the windows' sequences one window after another. The index holds, per window, its
sequence count (cumulative), the tokens it packs and the documents it leaves out: O(D / W)
numbers, computed once from the lengths, keyed by everything they depend on (`PackKey`), and
checked against each window's plan whenever a window is planned again to be read. Built over a
store, saved and loaded by ``psdp/sources/views/pack_index.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from psdp._plan.packing import PackPlan, capped, nothing_to_pack

#: The counts the index keeps per window, in its arrays' order.
COUNTS = ("sequences", "tokens", "dropped", "empty")


@dataclass(frozen=True)
class PackKey:
    """What a pack index depends on: the packing options and the corpus's size.

    Examples:
        >>> key = PackKey(2048, "best_fit", "split", None, window=4096, num_documents=10_000,
        ...               num_tokens=3_000_000)
        >>> key.num_windows, key.documents(2)
        (3, (8192, 10000))
    """

    seq_len: int
    strategy: str
    long_documents: str
    seed: int | None
    window: int
    num_documents: int
    num_tokens: int
    #: an EOS slot after every non-empty document (`PackedSequences` ``eos_id``); an index
    #: saved before this field existed was built without
    eos: bool = False
    #: the most segments a sequence holds (`plan_packing`), ``None``: no cap; an index saved
    #: before this field existed was built without
    max_segments: int | None = None

    @property
    def num_windows(self) -> int:
        return -(-self.num_documents // self.window)

    def documents(self, w: int) -> tuple[int, int]:
        """The documents ``[first, stop)`` of window ``w``."""
        first = w * self.window
        return first, min(first + self.window, self.num_documents)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def window_counts(plan: PackPlan) -> tuple[int, int, int, int]:
    """A window plan's `COUNTS`: sequences, tokens packed, documents dropped and empty."""
    return len(plan), plan.num_tokens, len(plan.dropped), len(plan.empty)


@dataclass(frozen=True, eq=False)
class PackIndex:
    """Per window of a packing in windows: where its sequences start and what it holds.

    Attributes:
        key: what the index was computed for.
        starts: int64 ``(num_windows + 1,)``: window ``w`` holds sequences
            ``starts[w]:starts[w + 1]``; ``starts[-1]`` is the sequence count.
        tokens, dropped, empty: int64 ``(num_windows,)``: per window, the tokens it packs and
            the documents it leaves out (longer than ``seq_len`` with ``"drop"``, or empty).

    Examples:
        >>> key = PackKey(8, "best_fit", "split", None, window=2, num_documents=3, num_tokens=14)
        >>> index = PackIndex.from_counts(key, [(2, 12, 0, 0), (1, 2, 0, 0)])
        >>> len(index), [a.tolist() for a in index.locate(np.array([2, 0, 1]))]
        (3, [[1, 0, 0], [0, 0, 1]])
        >>> index.describe()
        'best_fit packing in windows of 2 documents of 14 tokens into 3 sequences of 8 (efficiency 0.5833)'
    """

    key: PackKey
    starts: np.ndarray
    tokens: np.ndarray
    dropped: np.ndarray
    empty: np.ndarray

    @classmethod
    def from_counts(cls, key: PackKey, counts: Any) -> PackIndex:
        """The index of windows with `COUNTS` ``counts`` (one row per window, in order)."""
        table = np.asarray(counts, np.int64).reshape(-1, len(COUNTS))
        assert len(table) == key.num_windows, (len(table), key)
        sequences, tokens, dropped, empty = table.T
        if not sequences.sum():
            raise nothing_to_pack(key.num_documents, int(empty.sum()), int(dropped.sum()),
                                  key.seq_len)  # fmt: skip
        starts = np.concatenate([[0], np.cumsum(sequences)]).astype(np.int64)
        return cls(key, starts, tokens.copy(), dropped.copy(), empty.copy())

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def num_tokens(self) -> int:
        """The real tokens the sequences hold."""
        return int(self.tokens.sum())

    @property
    def efficiency(self) -> float:
        """Real tokens per slot: ``num_tokens / (len(index) * seq_len)``."""
        return self.num_tokens / (len(self) * self.key.seq_len)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sequences ``ids`` as ``(window, sequence within the window)``."""
        windows = np.searchsorted(self.starts, ids, side="right") - 1
        return windows, ids - self.starts[windows]

    def check(
        self, w: int, plan: PackPlan, where: str, fix: str = "delete the index to build it again"
    ) -> None:
        """Raises unless window ``w``'s plan has the counts the index holds for it: an index
        built for other lengths (a store rewritten with the same size) is never used."""
        want = (int(self.starts[w + 1] - self.starts[w]), int(self.tokens[w]),
                int(self.dropped[w]), int(self.empty[w]))  # fmt: skip
        got = window_counts(plan)
        if got != want:
            first, stop = self.key.documents(w)
            raise ValueError(
                f"the pack index {where} does not match the store: window {w} (documents "
                f"[{first}, {stop})) packs into {dict(zip(COUNTS, got, strict=True))} now, "
                f"the index says {dict(zip(COUNTS, want, strict=True))}; the store changed "
                f"after the index was built: {fix}"
            )

    def describe(self) -> str:
        """One line, as `PackPlan.describe`, with the window size."""
        dropped, empty = int(self.dropped.sum()), int(self.empty.sum())
        left_out = f", {dropped} long documents dropped" if dropped else ""
        empties = f", {empty} empty documents" if empty else ""
        return (
            f"{self.key.strategy} packing in windows of {self.key.window} documents of "
            f"{self.num_tokens} tokens into {len(self)} sequences of {self.key.seq_len}"
            f"{capped(self.key.max_segments)} (efficiency {self.efficiency:.4f}){left_out}{empties}"
        )
