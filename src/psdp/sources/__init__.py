"""Sources: where rows come from. One module per kind; everything is importable from here.

Mental model: a **source** is a sized table read in batches: ``len(source)`` rows, and
``source.read(ids)`` returns the rows at ``ids`` (any order, repeats allowed) as one array or a dict
of arrays, one call per step (`base`). On disk: `TensorStoreSource` reads a zarr3 dataset written
by `psdp.sources.writer.write_dataset` (`tensorstore`), `MemmapSource` maps ``.npy`` files (`memmap`), and
`GrainSource` batches a Grain-style per-record source on a thread pool (`grain`). A **stream** is
an iterable without random access (`streams`): `StreamSource.open(shard, num_shards, start)`
gives a `StreamReader` of one shard (one per data-shard uid), resumed by skipping. Missing or
damaged data is an error, never a silently wrong batch. See ``docs/sources.md``.
"""

from typing import TYPE_CHECKING

from psdp._imports import lazy_attributes
from psdp._plan.leaves import SINGLE_LEAF as SINGLE_LEAF
from psdp.sources.base import ArraySource as ArraySource
from psdp.sources.base import IndexableSource as IndexableSource
from psdp.sources.base import Rows as Rows
from psdp.sources.base import Source as Source
from psdp.sources.base import as_source as as_source
from psdp.sources.grain import GrainSource as GrainSource
from psdp.sources.memmap import MemmapSource as MemmapSource
from psdp.sources.streams import StreamReader as StreamReader
from psdp.sources.streams import StreamSource as StreamSource

if TYPE_CHECKING:  # imported on first use below: tensorstore is slow to import
    from psdp.sources.tensorstore import DATASET_FORMAT as DATASET_FORMAT
    from psdp.sources.tensorstore import DATASET_VERSION as DATASET_VERSION
    from psdp.sources.tensorstore import INCOMPLETE_MARKER as INCOMPLETE_MARKER
    from psdp.sources.tensorstore import METADATA_FILE as METADATA_FILE
    from psdp.sources.tensorstore import TensorStoreSource as TensorStoreSource
    from psdp.sources.tensorstore import read_metadata as read_metadata

_TENSORSTORE_NAMES = [
    "DATASET_FORMAT",
    "DATASET_VERSION",
    "INCOMPLETE_MARKER",
    "METADATA_FILE",
    "TensorStoreSource",
    "read_metadata",
]
__getattr__, __dir__ = lazy_attributes(
    __name__, {"psdp.sources.tensorstore": _TENSORSTORE_NAMES}, globals()
)

__all__ = [
    "DATASET_FORMAT",
    "DATASET_VERSION",
    "INCOMPLETE_MARKER",
    "METADATA_FILE",
    "SINGLE_LEAF",
    "ArraySource",
    "GrainSource",
    "IndexableSource",
    "MemmapSource",
    "Rows",
    "Source",
    "StreamReader",
    "StreamSource",
    "TensorStoreSource",
    "as_source",
    "read_metadata",
]
