"""The global order: the source rows of every step's batch, a pure function of the step.

Endless epochs of sample offsets, each a keyed permutation evaluated only where a step needs it,
so any step costs the same to look up: ``docs/concepts/order-and-resume.md``, "The order and the resume rule".
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from psdp._checks import check_int
from psdp._plan.block_shuffle import BlockShuffle
from psdp._plan.index_shuffle import MASK64, IndexShuffle, splitmix64
from psdp._plan.offsets import StepInfo, StepOffsets, stages_of

#: Up to this many rows, an epoch's whole permutation is computed once (8 bytes a row) and each
#: step slices it: a numpy slice per step instead of ~70 numpy calls of the Feistel network.
CACHED_PERMUTATION_ROWS = 1 << 20


@functools.lru_cache(maxsize=2)  # this epoch's and the next (read-ahead crosses epochs)
def epoch_permutation(shuffle: IndexShuffle | BlockShuffle) -> np.ndarray:
    """``shuffle`` at every position, read-only.

    Examples:
        >>> epoch_permutation(IndexShuffle(10, 7)).tolist() == IndexShuffle(10, 7)(np.arange(10)).tolist()
        True
    """
    permutation = shuffle(np.arange(shuffle.n, dtype=np.int64))
    permutation.flags.writeable = False
    return permutation


#: The id `GlobalOrder.batch_ids` gives a padding position (an epoch's short final batch).
PAD = -1


def check_seed(seed: object) -> None:
    """Raises unless ``seed`` is an int in ``[0, 2**64 - 1]``, the seeds with distinct orders.

    The order hashes the seed as 64 bits, so a seed outside that range would silently repeat
    the order of another (``2**64`` that of ``0``, ``-1`` that of ``2**64 - 1``).

    Examples:
        >>> check_seed(2**64)
        Traceback (most recent call last):
            ...
        ValueError: seed must be in [0, 2**64 - 1] (the order hashes it as 64 bits, so other seeds would repeat another seed's order), got 18446744073709551616; pass seed % 2**64 (the order such a seed used to give) or a new one, e.g. secrets.randbits(64)
    """
    check_int("seed", seed, minimum=None)
    if not 0 <= int(seed) <= MASK64:  # type: ignore[call-overload]
        raise ValueError(
            f"seed must be in [0, 2**64 - 1] (the order hashes it as 64 bits, so other seeds "
            f"would repeat another seed's order), got {seed}; pass seed % 2**64 (the order such a "
            "seed used to give) or a new one, e.g. secrets.randbits(64)"
        )


@dataclass(frozen=True)
class GlobalOrder:
    """Row ids of every step's global batch, from the sample offsets the step covers.

    Sample offset ``g`` is row ``permutation_e(g - e N)`` of epoch ``e = g // N`` (the identity
    without shuffle); which offsets a step covers is `StepOffsets`' business (batch-size
    schedule, skips, epochs' ends).

    Args:
        num_rows: ``N``, the number of source rows.
        batch_size: ``B``, rows per global batch; or a schedule ``[(start_step, B), ...]``
            starting at step 0.
        shuffle: permute each epoch (from ``seed`` and the epoch number) or keep source order.
        seed: the shuffle seed.
        drop_last: drop a step cut short (by an epoch's end or a skip) instead of padding it
            with `PAD` ids.
        skip_steps: ranges ``(first, end)`` of steps whose samples are skipped: step ``first``
            gets the samples step ``end`` would have had.
        skip_offsets: ranges ``(first, end)`` of sample offsets never read.
        start: the ``(step, offset)`` the order continues from (a restored run's resume point).
        io_block: shuffle blocks of this many consecutive rows, then rows within windows of
            ``window_blocks`` blocks (`BlockShuffle`: few large reads from an object store);
            ``None``: a full shuffle (`IndexShuffle`).
        window_blocks: the blocks whose rows a block shuffle mixes.

    Examples:
        >>> GlobalOrder(10, 4, shuffle=False).batch_ids(2).tolist()  # the short final batch
        [8, 9, -1, -1]
        >>> GlobalOrder(10, 4, shuffle=False).batch_ids(3).tolist()  # epoch 1 starts afresh
        [0, 1, 2, 3]
        >>> GlobalOrder(10, 4, shuffle=False, drop_last=True).batch_ids(2).tolist()
        [0, 1, 2, 3]
        >>> ramp = GlobalOrder(10, [(0, 2), (2, 4)], shuffle=False)
        >>> [ramp.batch_ids(step).tolist() for step in range(4)]
        [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9, -1, -1]]
    """

    num_rows: int
    batch_size: int | Sequence[tuple[int, int]]
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    skip_steps: Sequence[tuple[int, int]] = ()
    skip_offsets: Sequence[tuple[int, int]] = ()
    start: tuple[int, int] = (0, 0)
    io_block: int | None = None
    window_blocks: int = 16

    def __post_init__(self) -> None:
        check_seed(self.seed)
        for name in ("num_rows", "seed"):  # numpy ints would overflow the hashing
            object.__setattr__(self, name, operator.index(getattr(self, name)))
        if not isinstance(self.batch_size, Sequence):
            object.__setattr__(self, "batch_size", operator.index(self.batch_size))
        if any(stage.batch_size < 1 for stage in stages_of(self.batch_size)):
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_rows < 1:
            raise ValueError(f"the source is empty (num_rows={self.num_rows}); it needs rows")
        offsets = StepOffsets.create(
            self.num_rows,
            self.batch_size,
            drop_last=self.drop_last,
            skip_steps=self.skip_steps,
            skip_offsets=self.skip_offsets,
            start=self.start,
        )
        object.__setattr__(self, "offsets", offsets)

    offsets: StepOffsets = field(init=False, repr=False, compare=False)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch of a constant batch size: ``N // B`` with ``drop_last``, otherwise
        ``ceil(N / B)``."""
        if not isinstance(self.batch_size, int):
            raise ValueError(
                f"steps_per_epoch needs a constant batch size, got the schedule "
                f"{self.batch_size}; use step_info(step).epoch"
            )
        if self.drop_last:
            return self.num_rows // self.batch_size
        return -(-self.num_rows // self.batch_size)

    @property
    def pads(self) -> bool:
        """Whether some batch holds padding (`PAD` ids): a step cut short by an epoch's end or
        a skip (`StepOffsets.cuts_short`)."""
        return self.offsets.cuts_short()

    def step_info(self, step: int) -> StepInfo:
        """The step's sample offset, batch size, real rows and epoch (reads nothing)."""
        if operator.index(step) < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.offsets.info(step)

    def sample_ids(self, offset: int, count: int) -> np.ndarray:
        """The source rows of the ``count`` sample offsets from ``offset`` (one epoch's), in
        offset order (int64)."""
        epoch, first = divmod(offset, self.num_rows)
        if not self.shuffle:
            return first + np.arange(count, dtype=np.int64)
        shuffle = self.shuffle_of(epoch)
        if self.num_rows <= CACHED_PERMUTATION_ROWS:  # one slice of the epoch's permutation
            return epoch_permutation(shuffle)[first : first + count]
        return shuffle(first + np.arange(count, dtype=np.int64))

    def shuffle_of(self, epoch: int) -> IndexShuffle | BlockShuffle:
        """The permutation of epoch ``epoch``: position in the epoch -> source row."""
        key = self._epoch_key(epoch)
        if self.io_block is None:
            return IndexShuffle(self.num_rows, key)
        return BlockShuffle(self.num_rows, self.io_block, self.window_blocks, key)

    def batch_ids(self, step: int) -> np.ndarray:
        """The source row ids of the global batch at ``step``: increasing, then `PAD` for
        padding (int64; as many as the step's batch size)."""
        info = self.step_info(step)
        return np.concatenate(
            [self.rows(info), np.full(info.batch_size - info.rows, PAD, np.int64)]
        )

    def rows(self, info: StepInfo) -> np.ndarray:
        """The real rows of the step ``info`` describes, in increasing id order."""
        ids = self.sample_ids(info.offset, info.rows)
        # a batch is a set of rows: in increasing id order, every host's reads are sorted gathers
        return np.sort(ids) if self.shuffle else ids

    def resume_offset(self, step: int) -> int:
        """The sample offset a state saved at ``step`` records (`StepOffsets.resume_offset`)."""
        return self.offsets.resume_offset(step)

    def _epoch_key(self, epoch: int) -> int:
        return splitmix64((splitmix64(self.seed & MASK64) ^ epoch) & MASK64)
