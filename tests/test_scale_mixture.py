"""The scale simulation of a mixture: 100 sources, each a `TokenSequences` over its own corpus of
10^9 documents (~1.2 x 10^12 tokens) that is never written (tests/scale_corpus.py, one seed each),
mixed in 3 stages. The oracle is the corpus formula and the mixture rule summed stage by stage
(tests/mixture_oracle.py's `mixture_at`): nothing from psdp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SEQ_LEN, BATCH, SOURCES, BLOCK = 2048, 64, 100, 2048


def stages(names: list[str]) -> list[tuple[int, dict[str, float]]]:
    """Three stages of seeded weights, the second from 2**26 sequences, the third from 2**29."""
    rng = np.random.default_rng(0)
    starts = (0, 2**26, 2**29 - BLOCK)  # the batch past 2**40 tokens straddles the third's start
    return [
        (s, dict(zip(names, rng.uniform(1, 4, len(names)).tolist(), strict=True))) for s in starts
    ]


def mixture_simulation(documents: int = 10**9, sources: int = SOURCES) -> dict:
    """Opens ``sources`` corpora of ``documents`` each (with the index write_documents records),
    their `TokenSequences` and their `Mixture`, reads the first batch and batches past 2**32 and
    2**40 tokens of the mixture's order, and checks every token, segment id and position against
    the formula at the (source, sequence) the oracle gives. Returns what it measured; run it in
    a process of its own (its peak memory is the measure)."""
    import resource
    import time

    from psdp import DocumentStore, Mixture, TokenSequences
    from psdp.sources.documents.index import STRIDE, DocumentIndex
    from tests.mixture_oracle import mixture_at
    from tests.scale_corpus import ScaleCorpus

    def peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

    names = [f"corpus{i}" for i in range(sources)]
    corpora = [ScaleCorpus(documents=documents, seed=i) for i in range(sources)]
    before, start = peak(), time.perf_counter()
    views = {}
    for name, corpus in zip(names, corpora, strict=True):
        marks, nonempty = corpus.marks(STRIDE)
        index = DocumentIndex(documents, STRIDE, marks, nonempty, 2 * corpus.length - 1)
        store = DocumentStore.from_arrays(
            corpus.offsets_array(), {"input_ids": corpus.tokens_array()}, index=index
        )
        views[name] = TokenSequences(store, SEQ_LEN)
    mix = Mixture(views, stages=stages(names), block_size=BLOCK, seed=11)
    firsts = {"first": 0, "past 2**32": 2**32 // SEQ_LEN + 1, "past 2**40": 2**40 // SEQ_LEN + 1}
    batches = {}
    for name, first in firsts.items():
        ids = first + np.arange(BATCH)
        batches[name] = ids, mix.read(ids)
        if name == "first":
            open_s = time.perf_counter() - start
    read_s = time.perf_counter() - start - open_s
    added = peak() - before
    lengths = [corpus.num_tokens // SEQ_LEN for corpus in corpora]  # whole rows, no EOS
    assert [len(v) for v in views.values()] == lengths
    checked, touched = 0, set()
    for name, (ids, got) in batches.items():
        for offset, *row in zip(ids.tolist(), *(got[k] for k in sorted(got)), strict=True):
            source, sequence = mixture_at(names, lengths, stages(names), BLOCK, 11, offset)
            positions = sequence * SEQ_LEN + np.arange(SEQ_LEN)
            want = corpora[source].stream(positions, eos=False)
            for key, value in zip(sorted(got), row, strict=True):
                assert np.array_equal(value, want[key]), (name, offset, key)
            checked += SEQ_LEN
            touched.add(source)
    return {
        "sources": sources,
        "documents_per_source": documents,
        "tokens_per_source": corpora[0].num_tokens,
        "past_2_40_tokens": int(firsts["past 2**40"]) * SEQ_LEN > 2**40,
        "checked_tokens": checked,
        "sources_read": len(touched),
        "open_and_first_batch_s": open_s,
        "two_more_batches_s": read_s,
        "rss_added_bytes": added,
    }


def test_a_100_source_mixture_of_billion_document_corpora_reads_exact_tokens():
    """100 corpora of 10^9 documents each, never written, mixed in 3 stages: the first batch and
    batches past 2**32 and 2**40 tokens hold the oracle's source and sequence at every offset,
    every token, segment id and position the formula's; opening plus the first batch adds at
    most 1 GiB of resident memory (times are printed, not asserted)."""
    root = Path(__file__).resolve().parents[1]
    child = "import json; from tests.test_scale_mixture import mixture_simulation as m; print(json.dumps(m()))"
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=300, cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    print(got)
    assert got["past_2_40_tokens"] and got["tokens_per_source"] > 2**40
    assert got["checked_tokens"] == 3 * BATCH * SEQ_LEN
    assert got["sources_read"] > 50  # 192 samples drawn from most of the 100 sources
    assert got["rss_added_bytes"] <= 1 << 30, got
