"""Stores: where rows' bytes live and how they are written (``docs/guides/stores.md``).

Random-access sources over arrays on disk or in an object store (`tensorstore`, `memmap`),
per-record sources (`grain`), sources without random access (`streams`), and `as_source`
(`adapt`), which picks one for whatever a user passes; `write_dataset` (`writer`, with `remote`
for object stores); where a path points (`location`), which errors are retried (`errors`), and a
Levanter token cache's arrays (`levanter_cache`).

May import: `psdp._plan`, psdp's helper modules (`_checks`, `_imports`, `_deprecated`),
`psdp.sources.base` and this folder; never `documents`, `views` or a layer above `sources`
(``tests/test_layers.py`` checks it). The modules that import tensorstore load on first use.
"""
