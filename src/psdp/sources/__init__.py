"""Sources: where rows come from (``docs/guides/stores.md``), in three folders by what they are.

- `base`: the `Source` protocol, `Rows`, and the in-memory sources (`ArraySource`, ...).
- `stores/`: where bytes live and how they are written: `TensorStoreSource` and `write_dataset`,
  `MemmapSource`, `GrainSource` and `GrainRecords` (Grain, both ways), streams (`StreamSource`:
  no random access, read shard by shard),
  `as_source`, object-store locations and retries, a Levanter cache's arrays.
- `documents/`: token documents stored flat and their indexes: `DocumentStore`,
  `SelectedDocuments` (a store's documents selected by length),
  `DocumentIndex`, `write_documents`, `open_levanter_cache`.
- `views/`: rows made from documents: `TokenSequences`, `PackedSequences`, `Mixture`,
  provenance, MaxText's leaves (`MaxTextRows`).

Each folder imports only those before it in this list (and ``psdp._plan``, pure), nothing above
``sources``; ``tests/test_layers.py`` checks it. This package's names are the public ones.
"""

import importlib
from typing import TYPE_CHECKING, Any

from psdp._deprecated import MOVED_MODULES
from psdp._imports import lazy_attributes
from psdp._plan.leaves import SINGLE_LEAF as SINGLE_LEAF
from psdp.sources.base import ArraySource as ArraySource
from psdp.sources.base import IndexableSource as IndexableSource
from psdp.sources.base import Rows as Rows
from psdp.sources.base import Source as Source
from psdp.sources.base import SupportsReadWindow as SupportsReadWindow
from psdp.sources.documents.beside import LengthBounds as LengthBounds
from psdp.sources.documents.beside import PackSettings as PackSettings
from psdp.sources.documents.index import DocumentIndex as DocumentIndex
from psdp.sources.documents.selected import SelectedDocuments as SelectedDocuments
from psdp.sources.documents.store import DocumentStore as DocumentStore
from psdp.sources.documents.store import FlatArray as FlatArray
from psdp.sources.stores.adapt import as_source as as_source
from psdp.sources.stores.grain import GrainRecords as GrainRecords
from psdp.sources.stores.grain import GrainSource as GrainSource
from psdp.sources.stores.memmap import MemmapSource as MemmapSource
from psdp.sources.stores.streams import StreamReader as StreamReader
from psdp.sources.stores.streams import StreamSource as StreamSource
from psdp.sources.views.maxtext import MaxTextRows as MaxTextRows
from psdp.sources.views.mixture import Mixture as Mixture
from psdp.sources.views.pack_index import pack_index_beside as pack_index_beside
from psdp.sources.views.pack_index import save_pack_index_beside as save_pack_index_beside
from psdp.sources.views.packed import PackedSequences as PackedSequences
from psdp.sources.views.staged import StagedTokens as StagedTokens
from psdp.sources.views.staged_packed import StagedPacked as StagedPacked
from psdp.sources.views.tokens import TokenSequences as TokenSequences

if TYPE_CHECKING:  # imported on first use below: tensorstore is slow to import
    from psdp.sources.documents.levanter import open_levanter_cache as open_levanter_cache
    from psdp.sources.documents.writer import write_documents as write_documents
    from psdp.sources.stores.tensorstore import DATASET_FORMAT as DATASET_FORMAT
    from psdp.sources.stores.tensorstore import DATASET_VERSION as DATASET_VERSION
    from psdp.sources.stores.tensorstore import INCOMPLETE_MARKER as INCOMPLETE_MARKER
    from psdp.sources.stores.tensorstore import METADATA_FILE as METADATA_FILE
    from psdp.sources.stores.tensorstore import TensorStoreSource as TensorStoreSource
    from psdp.sources.stores.tensorstore import read_metadata as read_metadata

_TENSORSTORE_NAMES = [
    "DATASET_FORMAT",
    "DATASET_VERSION",
    "INCOMPLETE_MARKER",
    "METADATA_FILE",
    "TensorStoreSource",
    "read_metadata",
]
_lazy_getattr, __dir__ = lazy_attributes(
    __name__,
    {
        "psdp.sources.stores.tensorstore": _TENSORSTORE_NAMES,
        "psdp.sources.documents.writer": ["write_documents"],
        "psdp.sources.documents.levanter": ["open_levanter_cache"],
    },
    globals(),
)


def __getattr__(name: str) -> Any:
    if f"{__name__}.{name}" in MOVED_MODULES:  # a flat module of the previous release, warning
        return importlib.import_module(f"{__name__}.{name}")
    return _lazy_getattr(name)


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
    "GrainRecords",
    "GrainSource",
    "IndexableSource",
    "LengthBounds",
    "MaxTextRows",
    "MemmapSource",
    "Mixture",
    "PackSettings",
    "PackedSequences",
    "Rows",
    "SelectedDocuments",
    "Source",
    "StagedPacked",
    "StagedTokens",
    "StreamReader",
    "StreamSource",
    "SupportsReadWindow",
    "TensorStoreSource",
    "TokenSequences",
    "as_source",
    "open_levanter_cache",
    "pack_index_beside",
    "read_metadata",
    "save_pack_index_beside",
    "write_documents",
]
