"""psdp inside Grain and MaxText pipelines (docs/guides/grain-maxtext.md): Grain's MapDataset and
DataLoader (a sampler, read threads) over `GrainRecords` of a psdp mixture, and a `DataLoader` of
`MaxTextRows`, each element checked against rows built from the documents by the independent
oracles (tests/packing_oracle.py packs, tests/mixture_oracle.py walks the mixture's blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from psdp import DataLoader, DocumentStore, GrainRecords, MaxTextRows, Mixture, PackedSequences
from psdp.sources import ArraySource
from tests.mixture_oracle import OracleMixture
from tests.packing_oracle import naive_pack, named_documents, packed_table, with_eos, with_targets

grain = pytest.importorskip("grain.python")  # the `grain` extra; in both CI venvs

SEQ_LEN, EOS, BLOCK, SEED = 12, 999_999, 8, 3
LENGTHS = {"web": [5, 9, 3, 11, 7, 2, 8, 6, 4, 10, 1, 7], "code": [13, 4, 6, 2, 9, 5, 3]}
SHIFT = {"web": 0, "code": 500_000}  # the sources' tokens differ, so a row names its source
WEIGHTS = {"web": 3, "code": 1}


def _documents(name):
    return [{k: v + SHIFT[name] if k == "input_ids" else v for k, v in d.items()}
            for d in named_documents(LENGTHS[name])]  # fmt: skip


def _view(name):
    docs = _documents(name)
    offsets = np.concatenate([[0], np.cumsum(LENGTHS[name])]).astype(np.int64)
    store = DocumentStore.from_arrays(
        offsets, {"input_ids": np.concatenate([d["input_ids"] for d in docs])}
    )
    return PackedSequences(store, SEQ_LEN, targets=True, eos_id=EOS)


def _mixture():
    return Mixture({n: _view(n) for n in LENGTHS}, weights=WEIGHTS, block_size=BLOCK, seed=SEED)


def _oracle_rows(count):
    """The mixture's rows at offsets ``[0, count)``: each source's documents and EOS packed
    naively, the offsets' (source, row) walked block by block."""
    tables = {}
    for name in LENGTHS:
        docs, slots = with_eos(_documents(name), EOS)
        tables[name] = with_targets(
            packed_table(docs, naive_pack(slots, SEQ_LEN, "best_fit"), SEQ_LEN)
        )
    names = list(LENGTHS)
    lengths = [len(tables[n]["input_ids"]) for n in names]
    source, row = OracleMixture(names, lengths, [(0, WEIGHTS)], BLOCK, SEED).sequence(count)
    return [{k: v[row[g]] for k, v in tables[names[source[g]]].items()} for g in range(count)]


def _assert_record(got, want):
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


# ------------------------------------------------------------------------------ Grain pipelines
def test_a_grain_map_dataset_over_a_mixture_gives_the_mixtures_rows():
    """MapDataset.source, a host's shard (MaxText's ``ds[host::hosts]``), batches, and an
    IterDataset on two read threads: each element is the oracle's rows."""
    want = _oracle_rows(40)
    records = GrainRecords(_mixture())
    ds = grain.MapDataset.source(records)
    assert len(ds) == len(records) >= 40
    for i in (0, 7, 39):
        _assert_record(ds[i], want[i])
    shard = ds[1:40:2].batch(4)  # host 1 of 2, the first 40 offsets, in batches of 4
    batches = list(shard.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)))
    assert len(batches) == 5
    for b, batch in enumerate(batches):
        for j in range(4):
            _assert_record({k: v[j] for k, v in batch.items()}, want[1 + 2 * (4 * b + j)])


def test_a_grain_data_loader_with_a_shuffling_sampler_and_read_threads():
    """grain.DataLoader with an IndexSampler (the first 64 offsets of the endless mixture,
    shuffled, sharded 2 ways, this is shard 0) and two read threads: element i is the oracle's
    row at the sampler's record key i."""
    records, count = GrainRecords(_mixture()), 64
    sampler = grain.IndexSampler(
        num_records=count,
        shard_options=grain.ShardOptions(shard_index=0, shard_count=2, drop_remainder=True),
        shuffle=True,
        num_epochs=1,
        seed=11,
    )
    loader = grain.DataLoader(
        data_source=records,
        sampler=sampler,
        worker_count=0,
        read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=4),
    )
    got = list(loader)
    keys = [sampler[i].record_key for i in range(0, 2 * len(got), 2)]  # shard 0: every other one
    assert len(got) == count // 2 and sorted(set(keys)) != keys  # shuffled
    want = _oracle_rows(count)
    for record, key in zip(got, keys, strict=True):
        _assert_record(record, want[key])


def test_grains_batched_read_hook_reads_the_source_once():
    """Where Grain has the batched hook (``_getitems``), a batch of records is one read of the
    psdp source, not one per record."""
    from grain._src.python.dataset import base as grain_base  # where the hook's protocol lives

    if not hasattr(grain_base, "SupportsBatchedReadRandomAccessDataSource"):
        pytest.skip("this Grain (the lower bound, 0.2.9) reads record by record")
    reads = []

    class Counted(ArraySource):
        def read(self, ids):
            reads.append(list(ids))
            return super().read(ids)

    records = GrainRecords(Counted({"x": np.arange(20).reshape(10, 2)}))
    assert isinstance(records, grain_base.SupportsBatchedReadRandomAccessDataSource)
    got = grain.MapDataset.source(records)._getitems([7, 2, 4, 2])
    assert reads == [[7, 2, 4, 2]] and [int(r["x"][1]) for r in got] == [15, 5, 9, 5]


@pytest.mark.parametrize("compression", [None, "zstd"])  # memory maps; TensorStore
def test_records_of_stores_on_disk_pickle_for_grains_worker_processes(tmp_path, compression):
    """Grain's worker processes (``worker_count > 0``, MaxText's default of 1) pickle the data
    source. A mixture of stores written to disk did not pickle ("cannot pickle
    '_thread.lock' object": the store's memory-mapped shards), after reads or before. The copy
    reads the rows the original reads, as the oracle packs them."""
    import pickle

    from psdp.sources.documents.writer import write_documents

    for name in LENGTHS:
        docs = [d["input_ids"] for d in _documents(name)]
        write_documents(tmp_path / name, docs, compression=compression, progress=False)
    stores = {n: DocumentStore.open(tmp_path / n) for n in LENGTHS}
    views = {n: PackedSequences(s, SEQ_LEN, targets=True, eos_id=EOS) for n, s in stores.items()}
    records = GrainRecords(Mixture(views, weights=WEIGHTS, block_size=BLOCK, seed=SEED))
    want = _oracle_rows(24)
    for before in (records, pickle.loads(pickle.dumps(records))):  # unread, then read
        assert len(before._getitems(list(range(24)))) == 24
        copy = pickle.loads(pickle.dumps(before))
        for got, expected in zip(copy._getitems(list(range(24))), want, strict=True):
            _assert_record(got, expected)


def test_records_never_share_a_buffer_the_source_refills():
    """A source whose reads return a view of one reused buffer (no `fresh_rows`): each record
    keeps its own values after the next read."""

    class Reused:
        buffer = np.zeros((4, 2), np.int64)

        def __len__(self):
            return 10

        def read(self, ids):
            self.buffer[: len(ids)] = np.stack([ids, 10 * ids], axis=1)
            return self.buffer[: len(ids)]

    records = GrainRecords(Reused())
    first, second = records[3], records[5]
    assert first.tolist() == [3, 30] and second.tolist() == [5, 50]


def test_grain_records_errors_name_the_fix():
    with pytest.raises(TypeError, match="has no read; wrap an array"):
        GrainRecords([np.zeros(2)])
    records = GrainRecords(ArraySource(np.arange(5)))
    with pytest.raises(IndexError, match=r"in \[0, 4\] for ArraySource"):
        records[5]
    assert repr(records) == "GrainRecords(ArraySource(int64[5]), 5 records)"


# ------------------------------------------------------------------------------ MaxText batches
MAXTEXT = ["inputs", "inputs_position", "inputs_segmentation", "targets", "targets_position",
           "targets_segmentation"]  # fmt: skip


def test_a_data_loader_of_maxtext_rows_yields_maxtexts_global_batches(mesh_2d):
    """MaxText's train step takes ``next(data_iterator)``: a dict of int32 (batch, seq) global
    arrays with its six names and nothing else, which it then reshards over every mesh axis.
    Each leaf equals the oracle's rows under MaxText's rule (targets_segmentation: the segment
    where the loss counts, else 0)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    batch_size, steps = 8, 3
    want = _oracle_rows(batch_size * steps)
    with DataLoader(MaxTextRows(_mixture()), mesh=mesh_2d, global_batch_size=batch_size,
                    shuffle=False, mask_key=None, drop_last=True) as loader:  # fmt: skip
        data_iterator = iter(loader)
        for step in range(steps):
            batch = next(data_iterator)
            assert sorted(batch) == MAXTEXT
            rows = want[step * batch_size : (step + 1) * batch_size]
            expected = {
                "inputs": [r["input_ids"] for r in rows],
                "inputs_position": [r["positions"] for r in rows],
                "inputs_segmentation": [r["segment_ids"] for r in rows],
                "targets": [r["targets"] for r in rows],
                "targets_position": [r["positions"] for r in rows],
                "targets_segmentation": [r["segment_ids"] * (r["loss_mask"] != 0) for r in rows],
            }
            for key, value in expected.items():
                assert batch[key].dtype == np.int32 and batch[key].shape == (batch_size, SEQ_LEN)
                np.testing.assert_array_equal(np.asarray(batch[key]), np.stack(value), err_msg=key)
            # MaxText's DataLoader.load_next_batch: one device_put to its own input sharding
            axes = tuple(mesh_2d.axis_names)
            resharded = jax.device_put(batch, NamedSharding(mesh_2d, PartitionSpec(axes)))
            micro = {k: v[: batch_size // 2, :] for k, v in resharded.items()}  # its loss_fn's cut
            weights = int(jax.numpy.sum(micro["targets_segmentation"] != 0))
            assert weights == sum(int(np.sum(v != 0)) for v in expected["targets_segmentation"][:4])


def test_an_eval_pass_of_maxtext_rows_pads_with_rows_maxtext_weighs_zero(mesh_2d):
    """MaxText's eval runs ``for batch in eval_data_iterator`` and cuts every leaf as
    ``v[:micro_batch, :]``, so its batches can carry no 1-D mask leaf; an eval set whose rows
    are no multiple of the batch pads the last one. psdp refused ``mask_key=None`` there
    ("padded rows need a mask leaf"), though a zero MaxText row counts nowhere, so the
    guide's eval iterator could not be built. Every row once, as the oracle packs them; the
    padding all zeros (targets_segmentation 0); MaxText's cut and weights work on each batch."""
    from psdp import eval_loader

    name = "code"  # 5 rows: a batch of 4, then one row and 3 of padding
    docs, slots = with_eos(_documents(name), EOS)
    want = with_targets(packed_table(docs, naive_pack(slots, SEQ_LEN, "best_fit"), SEQ_LEN))
    rows, batch_size = len(want["input_ids"]), 4
    assert rows % batch_size  # the last batch is padded
    with eval_loader(MaxTextRows(_view(name)), mesh=mesh_2d, global_batch_size=batch_size,
                     mask_key=None) as loader:  # fmt: skip
        for _ in range(2):  # each `for` is a new pass, as MaxText's evals run
            batches = [{k: np.asarray(v) for k, v in b.items()} for b in loader]
            assert len(batches) == -(-rows // batch_size)
            assert all(sorted(b) == MAXTEXT for b in batches)
            got = {k: np.concatenate([b[k] for b in batches]) for k in MAXTEXT}
            expected = {"inputs": want["input_ids"], "inputs_position": want["positions"],
                        "inputs_segmentation": want["segment_ids"], "targets": want["targets"],
                        "targets_position": want["positions"],
                        "targets_segmentation": want["segment_ids"] * (want["loss_mask"] != 0)}  # fmt: skip
            for key, value in expected.items():
                np.testing.assert_array_equal(got[key][:rows], value, err_msg=key)
                assert not got[key][rows:].any(), key  # the padding: zeros, weighed nowhere
            micro = {k: v[: batch_size // 2, :] for k, v in batches[-1].items()}  # its loss's cut
            assert all(v.shape == (batch_size // 2, SEQ_LEN) for v in micro.values())
    # a source whose zero rows are not weightless still needs the mask to mark them
    with pytest.raises(ValueError, match="padded rows need a mask leaf"):
        eval_loader(_view(name), mesh=mesh_2d, global_batch_size=batch_size, mask_key=None)
    # nor may the padding be another value than the zero MaxText weighs nothing
    with pytest.raises(ValueError, match="padded rows need a mask leaf"):
        eval_loader(MaxTextRows(_view(name)), mesh=mesh_2d, global_batch_size=batch_size,
                    mask_key=None, pad_value=-1)  # fmt: skip


def test_maxtext_rows_need_language_model_rows():
    store = DocumentStore.from_documents([np.array([5, 6, 7])])
    with pytest.raises(ValueError, match=r"lacks \['targets'\].*targets=True"):
        MaxTextRows(PackedSequences(store, 4))
    with pytest.raises(ValueError, match="int32"):
        big = ArraySource({k: np.full((2, 3), 2**40) for k in
                           ("input_ids", "segment_ids", "positions", "targets", "loss_mask")})  # fmt: skip
        MaxTextRows(big).read(np.array([0]))
