"""Sources: where rows come from, one module per kind (``docs/guides/stores.md``).

A random-access source is a sized table read in batches (`base`); `tensorstore`, `memmap` and
`grain` read from disk or per-record sources, and the writer next to them writes datasets; a
stream (`streams`) is an iterable without random access, read shard by shard.
"""

from typing import TYPE_CHECKING

from psdp._imports import lazy_attributes
from psdp._plan.leaves import SINGLE_LEAF as SINGLE_LEAF
from psdp.sources.base import ArraySource as ArraySource
from psdp.sources.base import IndexableSource as IndexableSource
from psdp.sources.base import Rows as Rows
from psdp.sources.base import Source as Source
from psdp.sources.base import SupportsReadWindow as SupportsReadWindow
from psdp.sources.base import as_source as as_source
from psdp.sources.document_index import DocumentIndex as DocumentIndex
from psdp.sources.documents import DocumentStore as DocumentStore
from psdp.sources.documents import FlatArray as FlatArray
from psdp.sources.grain import GrainSource as GrainSource
from psdp.sources.memmap import MemmapSource as MemmapSource
from psdp.sources.mixture import Mixture as Mixture
from psdp.sources.packed import PackedSequences as PackedSequences
from psdp.sources.streams import StreamReader as StreamReader
from psdp.sources.streams import StreamSource as StreamSource
from psdp.sources.tokens import TokenSequences as TokenSequences

if TYPE_CHECKING:  # imported on first use below: tensorstore is slow to import
    from psdp.sources.document_writer import write_documents as write_documents
    from psdp.sources.levanter import open_levanter_cache as open_levanter_cache
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
    "TokenSequences",
    "read_metadata",
    "write_documents",
]
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "psdp.sources.tensorstore": _TENSORSTORE_NAMES,
        "psdp.sources.document_writer": ["write_documents"],
        "psdp.sources.levanter": ["open_levanter_cache"],
    },
    globals(),
)

__all__ = [
    "DATASET_FORMAT",
    "DATASET_VERSION",
    "INCOMPLETE_MARKER",
    "METADATA_FILE",
    "SINGLE_LEAF",
    "ArraySource",
    "DocumentIndex",
    "DocumentStore",
    "FlatArray",
    "GrainSource",
    "IndexableSource",
    "MemmapSource",
    "Mixture",
    "PackedSequences",
    "Rows",
    "Source",
    "StreamReader",
    "StreamSource",
    "SupportsReadWindow",
    "TensorStoreSource",
    "TokenSequences",
    "as_source",
    "open_levanter_cache",
    "read_metadata",
    "write_documents",
]
