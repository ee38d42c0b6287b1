"""`ViewConfig`: how a `DataConfig` makes rows of ``seq_len`` tokens from documents, concatenated
then split (`TokenSequences`) or packed (`PackedSequences`) with a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psdp._checks import is_int
from psdp._plan.packing import LONG_DOCUMENTS, PACKING_STRATEGIES, check_max_segments


@dataclass(frozen=True)
class ViewConfig:
    """How documents become rows of ``seq_len`` tokens: concatenated then split
    (`TokenSequences`), or packed (`PackedSequences`) with a strategy.

    Examples:
        >>> ViewConfig(packing="best_fit", window=4096).view_kwargs()
        {'strategy': 'best_fit', 'long_documents': 'split', 'seed': None, 'pad_id': 0, 'window': 4096}
    """

    packing: str | None = None
    """Unset: concatenate the documents and split them (`TokenSequences`); a strategy
    (best_fit, first_fit, greedy): pack them (`PackedSequences`)."""

    window: int | None = None
    """Packing only: pack each window of this many documents alone (unset: the whole corpus)."""

    long_documents: str = "split"
    """Packing only: ``split`` a document longer than seq_len into pieces, ``drop`` it, or
    ``truncate`` it to its first seq_len tokens (Levanter's packing)."""

    seed: int | None = None
    """Packing only: pack the documents in an order drawn from this seed (unset: store order)."""

    max_segments: int | None = None
    """Packing only: the most documents (segments) a row holds, Levanter's
    ``max_segments_per_example`` (unset: as many as fit)."""

    targets: bool = False
    """Next-token targets: one more token per row (concatenate then split), or a ``targets``
    leaf and a loss mask of the real targets (packing)."""

    eos_id: int | None = None
    """A token put after every non-empty document by the view; unset: none."""

    pad_id: int = 0
    """The ``input_ids`` of padding."""

    def __post_init__(self) -> None:
        if self.packing is not None and self.packing not in PACKING_STRATEGIES:
            raise ValueError(
                f"ViewConfig.packing must be one of {list(PACKING_STRATEGIES)} or unset (concatenate "
                f"then split), got {self.packing!r}; e.g. packing: best_fit"
            )
        if self.long_documents not in LONG_DOCUMENTS:
            raise ValueError(
                f"ViewConfig.long_documents must be one of {list(LONG_DOCUMENTS)}, got "
                f"{self.long_documents!r}; e.g. long_documents: split"
            )
        if self.window is not None and (not is_int(self.window) or self.window < 1):
            raise ValueError(
                f"ViewConfig.window must be an int >= 1 or unset, got {self.window!r}; e.g. "
                "window: 4096"
            )
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise ValueError(
                f"ViewConfig.seed must be an int >= 0 or unset, got {self.seed!r}; e.g. seed: 0"
            )
        check_max_segments(self.max_segments, "ViewConfig.max_segments", "max_segments: 64")
        if not isinstance(self.targets, bool):
            raise TypeError(
                f"ViewConfig.targets must be true or false, got {self.targets!r}; e.g. "
                "targets: true"
            )
        for name in ("eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise TypeError(
                    f"ViewConfig.{name} must be a token id (an int), got {value!r}; e.g. "
                    f"{name}: 0"
                )
        self._check_packing_only()

    def _check_packing_only(self) -> None:
        """Packing's fields without packing are refused: they would be ignored."""
        packing_only = {"window": None, "long_documents": "split", "seed": None,
                        "max_segments": None}  # fmt: skip
        set_ = [n for n, unset in packing_only.items() if getattr(self, n) != unset]
        if self.packing is None and set_:
            raise ValueError(
                f"ViewConfig.{set_[0]}={getattr(self, set_[0])!r} applies to packing only, but "
                "packing is unset (concatenate then split); set packing (e.g. packing: "
                f"best_fit) or drop {set_[0]}"
            )

    def view_kwargs(self) -> dict[str, Any]:
        """The keywords of the view's constructor (beyond the store and seq_len)."""
        if self.packing is None:
            return {"targets": self.targets, "eos_id": self.eos_id, "pad_id": self.pad_id}
        kwargs = {"strategy": self.packing, "long_documents": self.long_documents,
                  "seed": self.seed, "pad_id": self.pad_id, "window": self.window}  # fmt: skip
        if self.max_segments is not None:
            kwargs["max_segments"] = self.max_segments
        if self.targets:
            kwargs["targets"] = True
        if self.eos_id is not None:
            kwargs["eos_id"] = self.eos_id
        return kwargs
