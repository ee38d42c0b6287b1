"""Documents: variable-length token documents stored flat, and their indexes (``docs/guides/tokens.md``).

`DocumentStore` (`store`) reads token ranges of documents; `DocumentIndex` (`index`) is what a
host keeps of their offsets; `write_documents` (`writer`) writes a store, which `format` reads
back (and `parts` joins, for a parted store of `psdp prepare`); `open_levanter_cache`
(`levanter`) reads a Levanter token cache in place as a store; `SelectedDocuments` (`selected`)
is a store's documents selected by length, itself a store, read through the length index
`beside` keeps with the store's other indexes.

May import: `psdp._plan`, psdp's helper modules, `psdp.sources.base`, `stores` and this folder;
never `views` or a layer above `sources` (``tests/test_layers.py`` checks it). Inside it:
`index`, `parts` and `format` <- `store` <- `beside` <- `selected`, `levanter`, `writer`.

``psdp.sources.documents`` was the module of `DocumentStore` in the previous release: its names
still work here, with a warning, for one release (``psdp._deprecated``).
"""

from typing import Any

from psdp._deprecated import warn_moved_name

#: the names of the previous release's module ``psdp.sources.documents``, now in ``.store``
_PREVIOUS_NAMES = (
    "DocumentStore", "FlatArray", "TOKENS", "SEGMENT_IDS", "POSITIONS", "MAX_DOCUMENTS",
    "check_view_of", "chosen_leaves", "document_leaves",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _PREVIOUS_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    public = name in ("DocumentStore", "FlatArray")
    return warn_moved_name(
        __name__, name, f"{__name__}.store", "psdp.sources" if public else f"{__name__}.store"
    )
