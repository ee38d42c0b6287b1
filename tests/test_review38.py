"""Issue 38 reviewed through its documented paths (DataConfig dicts, the Python API, the CLI):
each test is a case that once gave wrong data or a wrong answer, against an exact oracle
computed here with numpy, never by the code under test."""

from __future__ import annotations

import numpy as np

from psdp import DataConfig, write_documents
from psdp._integration.source_config import SourceConfig
from psdp.prepare import build_indexes
from psdp.sources import LengthBounds


def test_an_index_of_min_length_0_serves_a_source_that_leaves_min_length_unset(tmp_path):
    """``--min-length 0 --max-length 100`` and ``--max-length 100`` select alike and write one
    file, ``length-0-100.npz``; the source refused the first's index and named the second's
    command, which found the file up to date and left it: no way out but deleting it."""
    lengths = np.random.default_rng(0).integers(1, 200, 50)
    store = str(tmp_path / "web")
    write_documents(store, [np.arange(1, n + 1) for n in lengths], progress=False)
    build_indexes(store, lengths=[LengthBounds(min_length=0, max_length=100)], progress=False)
    for bounds in ({"max_length": 100}, {"min_length": 0, "max_length": 100}):
        config = DataConfig(sources={"s": SourceConfig(store=store, **bounds)}, seq_len=16)
        selected = config.train_source().sources["s"].store
        ids = selected.document_ids(0, selected.num_documents)
        assert ids.tolist() == np.flatnonzero(lengths <= 100).tolist()
