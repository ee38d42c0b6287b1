"""`MemmapSource`: rows of ``.npy`` files, memory-mapped: an `ArraySource` over ``np.load`` views
(``docs/guides/stores.md``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from psdp._plan.leaves import SINGLE_LEAF
from psdp.sources.base import ArraySource, Rows, as_rows, describe_rows, fresh_rows


class MemmapSource(ArraySource):
    """Rows of ``.npy`` files (``np.save``), memory-mapped: one file, or a dict leaf -> file.

    The fastest source for random rows on a local disk (a read is a gather from the page cache),
    but the files must hold uncompressed arrays and the OS decides what stays in memory.

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> np.save(f"{tmp.name}/tokens.npy", np.arange(8).reshape(4, 2))
        >>> src = MemmapSource({"tokens": f"{tmp.name}/tokens.npy"})
        >>> len(src), src.read(np.array([3, 3, 0]))["tokens"].tolist()
        (4, [[6, 7], [6, 7], [0, 1]])
        >>> tmp.cleanup()
    """

    def __init__(self, path: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]]):
        if isinstance(path, Mapping):
            if not path:
                raise ValueError("a dict of .npy files needs at least one leaf, got an empty dict")
            self._files = {str(k): Path(p) for k, p in path.items()}
            leaves = {k: _map_npy(p, f"leaf {k!r}") for k, p in self._files.items()}
            lengths = {k: len(v) for k, v in leaves.items()}
            if len(set(lengths.values())) > 1:
                files = {k: str(p) for k, p in self._files.items()}
                raise ValueError(
                    f"every .npy file of a MemmapSource needs the same number of rows, got "
                    f"{lengths} from {files}; rewrite the files with one row count"
                )
            super().__init__(leaves)
        elif isinstance(path, str | os.PathLike):
            self._files = {SINGLE_LEAF: Path(path)}
            super().__init__(_map_npy(Path(path), "the source"))
        else:
            raise TypeError(
                "MemmapSource needs a .npy path or a dict of leaf name -> .npy path, got "
                f"{type(path).__name__}"
            )

    @fresh_rows  # an index array copies from the map
    def read(self, ids: np.ndarray) -> Rows:
        rows = super().read(ids)
        if isinstance(rows, dict):
            return {k: np.asarray(v) for k, v in rows.items()}
        return np.asarray(rows)

    def describe(self) -> str:
        files = ", ".join(str(p) for p in self._files.values())
        return f"MemmapSource({describe_rows(self._data)} from {files})"


def _map_npy(path: Path, what: str) -> np.ndarray:
    if not path.exists():
        raise FileNotFoundError(f"{what}: no .npy file at {path}; check the path")
    if path.is_dir():
        raise ValueError(
            f"{what}: {path} is a directory, not a .npy file; for a dataset directory written by "
            "psdp.write_dataset use TensorStoreSource"
        )
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(
            f"{what}: {path} is not a readable .npy file ({error}); MemmapSource maps arrays "
            "saved with np.save"
        ) from error
    if not isinstance(array, np.ndarray):
        array.close()
        raise ValueError(
            f"{what}: {path} is an .npz archive, not a .npy file; save each array with np.save "
            "and pass a dict of leaf name -> .npy path"
        )
    return as_rows(array, f"{what} ({path})")
