"""Views: rows made from the documents of a `DocumentStore` (``docs/guides/tokens.md``,
``docs/guides/packing.md``, ``docs/guides/mixtures.md``).

`TokenSequences` (`tokens`) cuts fixed-length rows from the documents back to back;
`PackedSequences` (`packed`) packs whole documents into rows, its `PackIndex` built and saved by
`pack_index` (what they read is planned, pure, in `psdp._plan.packing` and
`psdp._plan.pack_windows`); `Mixture` (`mixture`) reads weighted sources as one (its pure map:
`psdp._plan.mixture`); `StagedTokens` (`staged`) reads them in stages of
another ``seq_len`` (its pure map: `psdp._plan.length_stages`), `StagedPacked` (`staged_packed`)
packed (its pure map: `psdp._plan.packed_stages`); `provenance` says where each delivered segment came from.

May import: `psdp._plan`, psdp's helper modules, `psdp.sources.base`, `stores`, `documents` and
this folder; never a layer above `sources` (``tests/test_layers.py`` checks it).
"""
