"""The bad-input catalogue: every user error raises a specific exception naming the values and the fix.

One table, one row per mistake. Each row builds the mistake from scratch (``tmp_path`` for files),
and must raise the row's exception type with every one of its message fragments: the values the
user gave (so they can find the line) and the fix. Rows that fail only after some steps (a source
that changes its rows mid-dataset) also check that every batch delivered before the error is exact:
nothing yields a wrong batch. Every row runs under a hang guard, so nothing hangs either.

Padding is not an error: a batch that the shards do not divide is padded with a mask for dict
sources (see test_loader.py); only what remains a user error is here.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from psdp import (
    ArraySource,
    DataConfig,
    DataLoader,
    DocumentStore,
    GrainSource,
    LoaderClosedError,
    LoaderConfig,
    MemmapSource,
    MeshConfig,
    MeshLayout,
    Mixture,
    MixtureConfig,
    OrderOptions,
    PackedSequences,
    ReadingOptions,
    SourceConfig,
    StageConfig,
    StreamSource,
    TensorStoreSource,
    TokenSequences,
    ViewConfig,
    check_consistency,
    eval_loader,
    plan_packing,
    write_dataset,
)
from psdp.prepare.chat import render_chat
from psdp.prepare.ray_engine import RayEngine
from psdp.prepare.readers import BadRecordError, CorruptFileError
from psdp.sources import open_levanter_cache
from psdp.sources.documents.writer import write_documents
from psdp.sources.stores.location import GCS_ENDPOINT_VARIABLE, environment_endpoint, gcs_endpoint
from psdp.tools.benchmarks.object_store import GCS_ENVIRONMENT, free_port
from psdp.tools.pod import run_pod
from psdp.tools.simulate import Simulation, check_simulation
from tests import chat_tokenizer, scale_corpus, token_oracle
from tests.batch_checks import assert_batch_exact, expected_batch, token_table
from tests.levanter_cache import write_levanter_cache
from tests.meshes import mesh_of

B = 8  # global batch: one row per data shard pair on data=4 x model=2
TOKENS = token_table(64, width=8)  # row r is [r*1000, r*1000 + 1, ...]
HANG_GUARD_S = 120  # not a timing threshold: only turns a hang into a failure
_CLOSED_PORT = free_port()  # nothing listens there


def _open_gs_at(endpoint: str) -> TensorStoreSource:
    """``TensorStoreSource("gs://psdp/x/")`` with TensorStore's GCS endpoint at ``endpoint``
    (the token set as `GcsServer` sets it: TensorStore reads it once per process)."""
    for name, value in GCS_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    saved = os.environ.get(GCS_ENDPOINT_VARIABLE)
    os.environ[GCS_ENDPOINT_VARIABLE] = endpoint
    try:
        return TensorStoreSource("gs://psdp/x/")
    finally:
        if saved is None:
            os.environ.pop(GCS_ENDPOINT_VARIABLE)
        else:
            os.environ[GCS_ENDPOINT_VARIABLE] = saved


def _mesh(names=("data", "model")) -> Mesh:
    return mesh_of(names, (4, 2))


def _loader(source: Any = None, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("mesh", _mesh())
    kwargs.setdefault("global_batch_size", B)
    return DataLoader({"tokens": TOKENS} if source is None else source, **kwargs)


def _haloed_batch() -> dict[str, Any]:
    """A batch of TOKENS' rows 0-7 over data x model with a halo of 1: (8, 2 x (4 + 2))."""
    spec = {"tokens": PartitionSpec("data", "model")}
    with _loader(batch_spec=spec, halo=1, shuffle=False) as loader:
        return loader.batch_at(0)


def _expected_unshuffled(data: Any, step: int) -> Any:
    """What ``_loader(source, shuffle=False)`` must deliver at ``step``, from its settings."""
    return expected_batch(data, step, mesh=_mesh(), global_batch_size=B, shuffle=False)


class ChangesMidDataset:
    """Reads rows faithfully until step 3 (unshuffled), then breaks them in one way."""

    FROM_STEP = 3

    def __init__(self, data: dict[str, np.ndarray], how: str):
        self.rows = ArraySource(data)
        self.how = how

    def __len__(self) -> int:
        return len(self.rows)

    def describe(self) -> str:
        return f"ChangesMidDataset({self.how})"

    def read(self, ids):
        rows = self.rows.read(ids)
        if len(ids) < 2 or ids.min() < self.FROM_STEP * B:
            return rows  # the constructor's one-row probe, and steps 0-2
        if self.how == "stop iteration":
            next(iter(()))  # a stray next() on an exhausted iterator
        broken = {
            "dtype": lambda v: v.astype(np.float32),
            "trailing shape": lambda v: v[:, :4],
            "row count": lambda v: v[:-1],
            "list leaf": lambda v: v.tolist(),
        }
        if self.how == "leaves":
            return {"other": rows["tokens"]}
        return {k: broken[self.how](v) for k, v in rows.items()}


def _mid_dataset(how: str) -> Callable[[Path], Any]:
    """Iterates 6 steps over a source that breaks at step 3; steps 0-2 must be exact."""

    def run(_: Path) -> None:
        data = {"tokens": TOKENS}
        with _loader(ChangesMidDataset(data, how), shuffle=False) as loader:
            for step, batch in zip(range(6), loader, strict=False):
                assert step < ChangesMidDataset.FROM_STEP, f"step {step} was delivered"
                assert_batch_exact(batch, _expected_unshuffled(data, step))

    return run


def _too_wide_for_declared_dtype(_: Path) -> None:
    """An int64 leaf declared int32 whose row 27 (step 3) holds 2**40 + 7; steps 0-2 exact."""
    wide = TOKENS.astype(np.int64)
    wide[27, 1] = 2**40 + 7
    with _loader({"tokens": wide}, shuffle=False, dtypes={"tokens": np.int32}) as loader:
        for step, batch in zip(range(6), loader, strict=False):
            assert step < 3, f"step {step} was delivered"
            assert_batch_exact(batch, _expected_unshuffled({"tokens": TOKENS}, step))


DOCS = [
    np.arange(n, dtype=np.uint16) + 100 * (d + 1) for d, n in enumerate((5, 9, 3, 12, 7, 20, 6, 11))
]


def _damaged_store(tmp: Path, damage: Callable[[Path], Any]) -> Path:
    """A document store of `DOCS` (73 tokens in 5 shard files of 16, chunks of 4), damaged."""
    path = write_documents(
        tmp / "docs", DOCS, tokens_per_shard=16, tokens_per_chunk=4, progress=False
    )
    damage(path)
    return path


def _edit_metadata(**changes: Any) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        meta = json.loads((path / "psdp.json").read_text())
        (path / "psdp.json").write_text(json.dumps(meta | changes))

    return damage


def _truncate_offsets(path: Path) -> None:
    """The offsets rewritten without their last entry (a valid zarr array, one entry short)."""
    import tensorstore as ts

    store = DocumentStore.open(path)
    offsets = store.offsets_range(0, store.num_documents + 1)
    shutil.rmtree(path / "offsets")
    spec = {"driver": "zarr3", "kvstore": f"file://{path / 'offsets'}/", "create": True}
    array = ts.open(spec, dtype=ts.int64, shape=[len(offsets) - 1]).result()
    array.write(offsets[:-1]).result()


def _read_damaged(damage: Callable[[Path], Any]) -> Callable[[Path], None]:
    """Reads a damaged store through TokenSequences, unshuffled: the steps before the damaged
    tokens (the last shard file holds rows 16 and 17: step 2) must be exact."""

    def run(tmp: Path) -> None:
        path = _damaged_store(tmp, damage)
        rows = token_oracle.rows(DOCS, 4)
        with _loader(TokenSequences(DocumentStore.open(path), 4), shuffle=False) as loader:
            for step, batch in zip(range(3), loader, strict=False):
                assert step < 2, f"step {step} was delivered"
                assert_batch_exact(batch, _expected_unshuffled(rows, step))

    return run


def _state_with(**changes: Any) -> dict[str, Any]:
    """A real saved state, with keys replaced (or removed when given ``None``)."""
    with _loader() as loader:
        state = loader.state()
    for key, value in changes.items():
        if value is None:
            del state[key]
        else:
            state[key] = value
    return state


def _closed_then_iter(_: Path) -> None:
    loader = _loader()
    loader.close()
    loader.iter_from(0)


def _resume(saved: dict[str, Any], **changes: Any) -> Callable[[Path], Any]:
    """Saves the state of a loader built with ``saved`` after 2 steps; restores with ``changes``."""

    def run(_: Path) -> None:
        kwargs = {"seed": 3, **saved}
        source = kwargs.pop("source", {"tokens": TOKENS})
        with _loader(source, **kwargs) as loader:
            iterator = iter(loader)
            next(iterator), next(iterator)
            state = loader.state()
        restored = changes.pop("source", source)
        DataLoader.restore(state, restored, mesh=_mesh(), **changes)

    return run


def _config_resume(_: Path) -> None:
    """Saves a state (seed 3) after 2 steps; restores it from a config that sets seed 4."""
    with _loader(seed=3) as loader:
        iterator = iter(loader)
        next(iterator), next(iterator)
        state = iterator.state()
    LoaderConfig.create(global_batch_size=B, seed=4).restore(
        state, _mesh(), source={"tokens": TOKENS}
    )


def _state_of_two_iterators(_: Path) -> None:
    with _loader() as loader:
        train, peek = iter(loader), iter(loader)  # a peek with next(iter(loader)), left open
        next(train), next(peek)
        loader.state()


def _store(tmp_path: Path) -> Path:
    return Path(
        write_dataset(tmp_path / "ds", {"tokens": TOKENS}, rows_per_shard=16, progress=False)
    )


def _truncated_shard(tmp_path: Path) -> None:
    path = _store(tmp_path)
    shard = path / "tokens" / "c" / "1" / "0"  # rows 16-31
    shard.write_bytes(shard.read_bytes()[:-10])
    with _loader(TensorStoreSource(path), shuffle=False) as loader:
        for step, batch in zip(range(6), loader, strict=False):
            assert step < 2, f"step {step} (rows 16-23) was delivered"  # never zero-filled rows
            assert_batch_exact(batch, _expected_unshuffled({"tokens": TOKENS}, step))


def _missing_shard(tmp_path: Path) -> None:
    path = _store(tmp_path)
    (path / "tokens" / "c" / "2" / "0").unlink()
    TensorStoreSource(path)


def _garbled_metadata(tmp_path: Path) -> None:
    path = _store(tmp_path)
    (path / "psdp.json").write_text("{garbage")
    TensorStoreSource(path)


def _truncated_npy(tmp_path: Path) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, TOKENS)
    path.write_bytes(path.read_bytes()[:100])
    MemmapSource(path)


FIELD = np.zeros((16, 2, 8, 12), np.float32)  # (B, C, H, W) for data=2 x h=2 x w=2


def _npy(path: Path) -> str:
    """A small ``.npy`` of rows at ``path``, as a source string."""
    np.save(path, TOKENS)
    return str(path)


def _length_source(tmp: Path, min_length: int, build: bool) -> DataConfig:
    """A config whose source ``long`` is a store's documents of ``min_length`` tokens or more
    (the store's are 2 to 9), its length index built beside the store if ``build``."""
    from psdp.prepare import build_indexes
    from psdp.sources import LengthBounds

    store = str(tmp / "docs")
    write_documents(store, [np.arange(n) for n in (2, 9, 5)], progress=False)
    if build:
        build_indexes(store, lengths=[LengthBounds(min_length)], progress=False)
    return DataConfig(sources={"long": SourceConfig(store=store, min_length=min_length)},
                      seq_len=4)  # fmt: skip


def _data_store(tmp: Path, name: str = "code", lengths=(5, 9, 3, 12, 7, 20, 6, 11)) -> str:
    """A small document store for the data config's rows (written once per path)."""
    path = tmp / name
    if not path.exists():
        docs = [np.arange(1, n + 1, dtype=np.uint16) for n in lengths]
        write_documents(path, docs, progress=False)
    return str(path)


def _data(tmp: Path, **changes: Any) -> DataConfig:
    """A data config over one small store, 8 rows a step, with ``changes``."""
    base: dict[str, Any] = {
        "sources": {"code": SourceConfig(store=_data_store(tmp))},
        "seq_len": 4,
        "order": OrderOptions(global_batch_size=B),
        "mixture": MixtureConfig(block_size=8),
    }
    return DataConfig(**{**base, **changes})


def _data_state(tmp: Path) -> dict[str, Any]:
    """The state of the `_data` loader with a stage at step 2, saved at step 3."""
    stages = [StageConfig(0, {"code": 1}), StageConfig(2, {"code": 1})]
    with _data(tmp, stages=stages).build(_mesh()) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = it.state()
        it.close()
    return state


def _unfinished_store(tmp: Path) -> str:
    (tmp / "web").mkdir()
    (tmp / "web" / "psdp.json").write_text('{"format": "psdp.document_parts", "complete": false}')
    return str(tmp / "web")


def _levanter_cache(tmp: Path, finished: bool = True) -> str:
    """A Levanter token cache of 4 documents (its exact layout) at ``tmp / "lev"``, with a
    per-document leaf ``sources_len`` (one value a document, as Levanter's supervised caches)."""
    docs = [
        {"input_ids": np.arange(1, n + 1, dtype=np.int32), "sources_len": np.array([2], np.int32)}
        for n in (5, 9, 3, 12)
    ]
    write_levanter_cache(tmp / "lev", docs, finished=finished)
    return str(tmp / "lev")


def _levanter_data(tmp: Path, store: str) -> DataConfig:
    return _data(tmp, sources={"web": SourceConfig(store=store, format="levanter")})


def _file(path: Path) -> Path:
    """``path`` made as an empty file."""
    path.write_text("")
    return path


def _field_loader(field: np.ndarray = FIELD, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_spec", {"field": PartitionSpec("data", None, "h", "w")})
    mesh = mesh_of(("data", "h", "w"), (2, 2, 2))
    return DataLoader({"field": field}, mesh=mesh, global_batch_size=4, **kwargs)


_SHAPE_RULE = "every row of a source must have one shape and dtype"
_RESUME_FIX = "resume with the saved value"

# (id, action, exception, fragments the message must contain: the values, then the fix)


def _length(loader: DataLoader) -> int:
    with loader:
        return len(loader)


def _mix(sources: Any = None, **kwargs: Any) -> Mixture:
    """A mixture of two token sources (64 and 16 rows), weights 3:1, blocks of 8, unless given."""
    if "stages" not in kwargs:
        kwargs.setdefault("weights", {"web": 3, "code": 1})
    kwargs.setdefault("block_size", 8)
    if sources is None:
        sources = {"web": {"tokens": TOKENS}, "code": {"tokens": TOKENS[:16]}}
    return Mixture(sources, **kwargs)


_CHATS = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the fox"}]]
_UNMARKED_TEMPLATE = chat_tokenizer.TEMPLATE.replace("{% generation %}", "").replace(
    "{% endgeneration %}", ""
)


def _prepare(tmp: Path, lines: Any = ('{"text": "a b"}',), **options: Any) -> Any:
    """`psdp.prepare` of ``lines`` (a.jsonl) into tmp/store with a 3-word tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from psdp.prepare import prepare

    words = Tokenizer(models.WordLevel({"[unk]": 0, "a": 1, "b": 2}, unk_token="[unk]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp / "tokenizer.json"))
    (tmp / "a.jsonl").write_text("".join(line + "\n" for line in lines))
    options = {"tokenizer": tmp / "tokenizer.json", "workers": 1, "progress": False, **options}
    return prepare(options.pop("inputs", tmp / "a.jsonl"), tmp / "store", **options)


def _prepare_while_held(tmp: Path) -> Any:
    """`_prepare` while tmp/store is held, as another run holds it."""
    from psdp.prepare.parts import Output

    held = Output(tmp / "store")
    try:
        return _prepare(tmp)
    finally:
        held.release()


def _bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _prepare_twice(tmp: Path, second: dict[str, Any], before: Callable[[Path], Any] = str) -> Any:
    """A prepare into tmp/store, ``before(tmp)``, then the same prepare with ``second`` changed."""
    _prepare(tmp)
    before(tmp)
    return _prepare(tmp, **second)


def _jsonl(path: Path) -> str:
    """A one-record jsonl file at ``path`` (whatever its name says)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"text": "a"}\n')
    return str(path)


def _parquet(path: Path, columns: dict[str, list[Any]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return str(path)


def _cut_short(path: Path) -> str:
    """``path``, 200 records ``{"text": "a b"}`` in the format its name says, with only its first
    half left as an interrupted download leaves it (an Arrow stream: all but its end marker)."""
    import pyarrow as pa
    import zstandard

    body = '{"text": "a b"}\n' * 200
    if path.name.endswith(".gz"):
        data = gzip.compress(body.encode())
    elif path.name.endswith(".zst"):
        data = zstandard.compress(body.encode())
    elif path.name.endswith(".parquet"):
        data = _parquet_bytes(["a b"] * 200)
    else:  # .arrow: an IPC file (with its footer), or with "stream" in its name an IPC stream
        sink = pa.BufferOutputStream()
        table = pa.table({"text": ["a b"] * 200})
        new = pa.ipc.new_stream if "stream" in path.name else pa.ipc.new_file
        with new(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=50):
                writer.write_batch(batch)
        data = sink.getvalue().to_pybytes()
        if "stream" in path.name:  # cut after its last batch, before its end marker
            path.write_bytes(data[:-8])
            return str(path)
    path.write_bytes(data[: len(data) // 2])
    return str(path)


def _parquet_bytes(texts: list[str]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": texts}), sink, row_group_size=50)
    return sink.getvalue().to_pybytes()


def _damaged_export(tmp: Path) -> str:
    """A datasets save_to_disk directory whose state.json is not JSON."""
    (tmp / "export").mkdir()
    (tmp / "export" / "state.json").write_text('{"_data_files": [')
    return str(tmp / "export")


def _prepare_into_a_file(tmp: Path) -> Any:
    """A prepare whose output, tmp/out.txt, is a file."""
    from psdp.prepare import prepare

    _prepare(tmp)  # writes the tokenizer and a.jsonl
    return prepare(tmp / "a.jsonl", _file(tmp / "out.txt"), tokenizer=tmp / "tokenizer.json",
                   workers=1, progress=False)  # fmt: skip


def _unfinished_prepare(tmp: Path) -> Path:
    """A store whose prepare planned its part, then stopped (as if killed) before committing it."""
    _prepare(tmp)
    meta = json.loads((tmp / "store" / "psdp.json").read_text())
    meta = {**meta, "complete": False, "parts": dict.fromkeys(meta["parts"])}
    (tmp / "store" / "psdp.json").write_text(json.dumps(meta))
    return tmp / "store"


CASES: list[tuple[str, Callable[[Path], Any], type[BaseException], list[str]]] = [
    # ---------------------------------------------------------------- mesh and partition specs
    (
        "mesh has no batch axis",
        lambda _: _loader(mesh=_mesh(("x", "y"))),
        ValueError,
        ["('x', 'y')", "('replica', 'data', 'fsdp', 'batch')", "pass batch_spec=PartitionSpec"],
    ),
    (
        "batch spec names an unknown axis",
        lambda _: _loader(batch_spec=PartitionSpec("replica")),
        ValueError,
        ["'replica'", "the mesh axes are ('data', 'model')"],
    ),
    (
        "a leaf's spec names an unknown axis",
        lambda _: _loader(batch_spec={"tokens": PartitionSpec("data", "context")}),
        ValueError,
        ["'context'", "('data', 'model')"],
    ),
    (
        "feeding with leaves whose batch is split differently",
        lambda _: _loader(
            {"tokens": TOKENS, "w": np.arange(len(TOKENS), dtype=np.int32)},
            feeding_processes=[0],
            batch_spec={"w": "full"},
        ),  # fmt: skip
        ValueError,
        [
            "feeding_processes needs every leaf's batch dimension split over the same mesh axes",
            "'w': ",  # the spec's repr differs across jax versions (P or PartitionSpec)
            "(('data', 'model'),)",
            "give every leaf the same batch sharding",
        ],
    ),
    (
        "batch spec names an unknown leaf",
        lambda _: _loader(batch_spec={"tokenz": "batch"}),
        ValueError,
        ["['tokenz']", "its leaves are ['tokens']"],
    ),
    (
        "batch spec is an unknown strategy",
        lambda _: _loader(batch_spec="data-parallel"),
        ValueError,
        ["'data-parallel'", "('batch', 'full', 'replicated')"],
    ),
    (
        "batch spec longer than the leaf",
        lambda _: _loader(TOKENS[:, 0], batch_spec=PartitionSpec("data", "model")),
        ValueError,
        ["P('data', 'model')", "only 1 dimensions", "drop the extra entries"],
    ),
    (
        "array source needs padding",  # a dict source is padded with a mask instead
        lambda _: _loader(TOKENS, global_batch_size=6),
        ValueError,
        [
            "global_batch_size=6 is not a multiple of the batch shards",
            "padded to 8 rows",
            "an array source cannot carry one; pass a dict source",
        ],  # fmt: skip
    ),
    (
        "halo larger than a sequence shard",
        lambda _: _loader(batch_spec={"tokens": PartitionSpec("data", "model")}, halo=5),
        ValueError,
        ["halo=5", "4 columns per device", "use halo <= 4"],
    ),
    (
        "halo without a sequence-sharded leaf",
        lambda _: _loader(halo=1),
        ValueError,
        ["halo=1", 'give a leaf a spec like P("data", "context") or drop the halo'],
    ),
    (
        "check_consistency of a haloed batch without its halo",
        lambda _: check_consistency(_haloed_batch(), source={"tokens": TOKENS}, ids=np.arange(B)),
        ValueError,
        [
            "expected leaf 'tokens' has 8 entries along dimension 1",
            "but the batch leaf has 12: 6 per shard, 4 + 2 x 1, a halo of 1",
            "pass check_consistency the loader's halo= and pad_value=",
        ],
    ),
    (
        "check_consistency of a continue halo against expected rows",
        lambda _: check_consistency(
            _haloed_batch(), {"tokens": TOKENS[:B]}, halo={"tokens": {1: (1, "continue")}}
        ),
        ValueError,
        [
            "leaf 'tokens' has a 'continue' halo",
            "pass source=<that source> and ids=, not expected=",
        ],
    ),
    # ------------------------------------------------------------------------------ sources
    (
        "source shorter than one batch with drop_last",
        lambda _: _loader({"tokens": TOKENS[:5]}, drop_last=True),
        ValueError,
        ["5 rows", "global_batch_size=8", "set drop_last=False"],
    ),
    (
        "empty source",
        lambda _: _loader({"tokens": TOKENS[:0]}),
        ValueError,
        ["empty (num_rows=0)"],
    ),
    (
        "0-d array source",
        lambda _: _loader(np.zeros(())),
        ValueError,
        ["0-d array", "row dimension"],
    ),
    (
        "leaves with different lengths",
        lambda _: _loader({"tokens": TOKENS, "weight": np.ones(10)}),
        ValueError,
        ["{'tokens': 64, 'weight': 10}", "trim or pad the leaves"],
    ),
    (
        "a list where an array leaf is required",
        lambda _: _loader({"tokens": TOKENS.tolist()}),
        TypeError,
        ["leaf 'tokens'", "got list", "np.asarray"],
    ),
    (
        "an iterable without random access",
        lambda _: _loader(row for row in TOKENS),
        TypeError,
        ["generator", "StreamSource"],
    ),
    (
        "a Grain source without __len__",
        lambda _: GrainSource(iter([{"tokens": row} for row in TOKENS])),
        TypeError,
        ["list_iterator has no __len__", "MapDataset with a length"],
    ),
    (
        "a Grain source whose dropped records are None (a filtered MapDataset)",
        lambda _: GrainSource(
            [{"tokens": row} if i % 2 == 0 else None for i, row in enumerate(TOKENS)],
            read_threads=1,
        ).read(np.arange(4)),
        ValueError,
        ["record 1 is None (2 of the 4 read)", "filtered Grain MapDataset", "drop the .filter"],
    ),
    # ------------------------------------------------------------- the source changes mid-run
    (
        "wrong dtype mid-dataset",
        _mid_dataset("dtype"),
        ValueError,
        ["step 3", "float32", "int32", "ids [24, 25", _SHAPE_RULE],
    ),
    (
        "wrong trailing shape mid-dataset",
        _mid_dataset("trailing shape"),
        ValueError,
        ["step 3", "shape (4,)", "had (8,)", _SHAPE_RULE],
    ),
    (
        "a list leaf mid-dataset",
        _mid_dataset("list leaf"),
        ValueError,
        ["step 3", "int64", "int32", _SHAPE_RULE],
    ),
    (
        "other leaves mid-dataset",
        _mid_dataset("leaves"),
        ValueError,
        ["step 3", "['other']", "['tokens']", "every read must return the same leaves"],
    ),
    (
        "too few rows mid-dataset",
        _mid_dataset("row count"),
        ValueError,
        ["step 3", "7 rows", "8 ids"],
    ),
    (
        "a stray StopIteration mid-dataset",  # only a stream's end may end iteration
        _mid_dataset("stop iteration"),
        RuntimeError,
        ["step 3", "ChangesMidDataset(stop iteration)", "raised StopIteration", "catch it"],
    ),
    (
        "a value beyond the declared dtype mid-dataset",
        _too_wide_for_declared_dtype,
        ValueError,
        ["step 3", "leaf 'tokens'", "1099511627783", "row 27", "int32", "dtypes="],
    ),
    # ------------------------------------------------------------------------------- dtypes
    (
        "an int64 leaf while x64 is off",
        lambda _: _loader({"tokens": TOKENS.astype(np.int64)}),
        TypeError,
        [
            "leaf 'tokens'",
            "int64",
            "holds as int32",
            "dtypes={'tokens': np.int32}",
            'jax.config.update("jax_enable_x64", True)',
        ],
    ),  # fmt: skip
    (
        "a uint64 leaf while x64 is off",
        lambda _: _loader({"tokens": TOKENS.astype(np.uint64)}),
        TypeError,
        ["leaf 'tokens'", "uint64", "dtypes={'tokens': np.uint32}", "jax_enable_x64"],
    ),
    (
        "a float64 array source while x64 is off",
        lambda _: _loader(TOKENS.astype(np.float64)),
        TypeError,
        ["the array source", "float64", "dtypes=np.float32", "jax_enable_x64"],
    ),
    (
        "a complex128 leaf while x64 is off",
        lambda _: _loader({"tokens": TOKENS.astype(np.complex128)}),
        TypeError,
        ["leaf 'tokens'", "complex128", "np.complex64", "jax_enable_x64"],
    ),
    (
        "a declared 64-bit dtype while x64 is off",
        lambda _: _loader(dtypes={"tokens": np.int64}),
        TypeError,
        ["leaf 'tokens'", "its declared dtype is int64", "jax_enable_x64"],
    ),
    (
        "dtypes names an unknown leaf",
        lambda _: _loader(dtypes={"tokenz": np.int32}),
        ValueError,
        ["['tokenz']", "its leaves are ['tokens']"],
    ),
    (
        "dtypes holds something that is not a dtype",
        lambda _: _loader(dtypes={"tokens": "int33"}),
        TypeError,
        ["dtypes['tokens']", "'int33'", "np.int32"],
    ),
    (
        "one dtype for a dict source",
        lambda _: _loader(dtypes=np.int16),
        TypeError,
        ["dict leaf -> dtype", "dtypes={'tokens': np.int32}"],
    ),
    (
        "a string leaf",
        lambda _: _loader({"tokens": TOKENS, "text": np.array(["a"] * 64)}),
        TypeError,
        ["leaf 'text'", "<U1", "a JAX array cannot hold", "encode it as numbers"],
    ),
    (
        "an object leaf",
        lambda _: _loader({"tokens": TOKENS, "meta": np.array([None] * 64)}),
        TypeError,
        ["leaf 'meta'", "object", "encode it as numbers"],
    ),
    (
        "a datetime leaf",
        lambda _: _loader({"tokens": TOKENS, "t": np.arange(64).astype("datetime64[s]")}),
        TypeError,
        ["leaf 't'", "datetime64[s]", ".astype('int64')"],
    ),
    (
        "a structured leaf",
        lambda _: _loader({"tokens": TOKENS, "rec": np.zeros(64, [("a", "i4"), ("b", "f4")])}),
        TypeError,
        ["leaf 'rec'", "[('a', '<i4'), ('b', '<f4')]", "one leaf per field"],
    ),
    (
        "a list of strings as the source",
        lambda _: _loader([f"row {i}" for i in range(64)]),
        TypeError,
        ["the array source", "<U5", "encode it as numbers"],
    ),
    # ---------------------------------------------------------------------------- pad_value
    (
        "pad_value -1 on a uint16 leaf that is padded",
        lambda _: _loader({"tokens": TOKENS.astype(np.uint16)}, global_batch_size=6, pad_value=-1),
        ValueError,
        [
            "pad_value=-1",
            "leaf 'tokens'",
            "uint16",
            "[0, 65535]",
            "padding rows",
            "pad_value that uint16 holds",
        ],
    ),  # fmt: skip
    (
        "pad_value nan on an int leaf that is padded",
        lambda _: _loader(global_batch_size=6, pad_value=float("nan")),
        ValueError,
        ["pad_value=nan", "leaf 'tokens'", "int32"],
    ),
    (
        "pad_value 0.5 on an int leaf that is padded",
        lambda _: _loader(global_batch_size=6, pad_value=0.5),
        ValueError,
        ["pad_value=0.5", "int32"],
    ),
    (
        "pad_value -1 on a bool leaf that is padded",
        lambda _: _loader(
            {"tokens": TOKENS, "keep": np.ones(64, bool)}, global_batch_size=6, pad_value=-1
        ),
        ValueError,
        ["pad_value=-1", "leaf 'keep'", "bool", "0 or 1"],
    ),  # fmt: skip
    (
        "pad_value 2 on a bool leaf that is padded",
        lambda _: _loader({"keep": np.ones(64, bool)}, global_batch_size=6, pad_value=2),
        ValueError,
        ["pad_value=2", "leaf 'keep'", "bool"],
    ),
    (
        "pad_value beyond a float16 leaf that is padded",
        lambda _: _loader({"x": np.ones(64, np.float16)}, global_batch_size=6, pad_value=1e6),
        ValueError,
        ["pad_value=1000000.0", "leaf 'x'", "float16", "65504"],
    ),
    (
        "pad_value -1 on a uint16 leaf with a halo",  # no padding rows: the halo's edges
        lambda _: _loader(
            {"tokens": TOKENS.astype(np.uint16)},
            halo=1,
            pad_value=-1,
            batch_spec={"tokens": PartitionSpec("data", "model")},
        ),
        ValueError,
        ["pad_value=-1", "leaf 'tokens'", "uint16", "halo=1"],
    ),  # fmt: skip
    # ------------------------------------------------------------------- stores on disk
    (
        "store path does not exist",
        lambda tmp: TensorStoreSource(tmp / "nowhere"),
        FileNotFoundError,
        ["nowhere", "does not exist", "psdp.write_dataset"],
    ),
    (
        "store shard file truncated",
        _truncated_shard,
        ValueError,
        ["ids [16, 17", "tokens/c/1/0", "truncated", "write_dataset(..., overwrite=True)"],
    ),
    (
        "store shard file missing",
        _missing_shard,
        ValueError,
        ["tokens/c/2/0", "would read as zeros", "overwrite=True"],
    ),
    (
        "store metadata unreadable",
        _garbled_metadata,
        ValueError,
        ["psdp.json", "overwrite=True"],
    ),
    (
        "write_dataset to the directory that holds the working directory",
        lambda tmp: write_dataset(Path.cwd().parent, np.arange(3), progress=False),
        ValueError,
        [str(Path.cwd().parent), "current directory", "renamed into place", "/dataset'"],
    ),
    (
        ".npy file truncated",
        _truncated_npy,
        ValueError,
        ["tokens.npy", "not a readable .npy file", "np.save"],
    ),
    # --------------------------------------------------------------------- steps and closing
    (
        "negative step for iter_from",
        lambda _: _loader().iter_from(-1),
        ValueError,
        ["step must be >= 0", "-1"],
    ),
    (
        "negative step for batch_at",
        lambda _: _loader().batch_at(-2),
        ValueError,
        ["step must be >= 0", "-2"],
    ),
    (
        "iter_from after close()",
        _closed_then_iter,
        LoaderClosedError,
        ["closed", "create a new DataLoader"],
    ),
    # ---------------------------------------------------------------------------- resuming
    (
        "drop_last with a schedule stage larger than the source",
        lambda _: _loader(global_batch_size=[(0, 8), (5, 4096)], drop_last=True),
        ValueError,
        [
            "stage 1 (from step 5) of global_batch_size=4096",
            "would yield no batch",
            "drop_last=False",
        ],
    ),
    (
        "skip_offsets with a stream",
        lambda _: _loader(
            StreamSource([{"tokens": row} for row in TOKENS]), skip_offsets=[(8, 16)]
        ),
        ValueError,
        ["skip_offsets=[(8, 16)] with a stream", "skip whole steps with skip_steps"],
    ),
    (
        "resume with a new skip of steps already trained on",
        _resume({}, skip_steps=[(1, 4)]),
        ValueError,
        ["skip_steps (1, 4) starts before step 2", "did not have it", "give (2, 5)", "(2, 4)"],
    ),
    (
        "resume with a new skip of offsets already trained on",  # saved at offset 16
        _resume({}, skip_offsets=[(8, 24)]),
        ValueError,
        ["skip_offsets (8, 24) starts before sample offset 16", "did not have it", "(16, 24)"],
    ),
    (
        "resume with start_at",
        _resume({}, start_at=(0, 0)),
        ValueError,
        ["start_at=(0, 0)", "step 2, offset 16", "drop start_at"],
    ),
    (
        "resume with another seed",
        _resume({}, seed=4),
        ValueError,
        ["seed=4", "seed=3", _RESUME_FIX],
    ),
    (
        "resume with shuffling switched",
        _resume({"shuffle": True}, shuffle=False),
        ValueError,
        ["shuffle=False", "shuffle=True", _RESUME_FIX],
    ),
    (
        "resume on a source with other rows",
        _resume({}, source={"tokens": TOKENS[:32]}),
        ValueError,
        ["'rows': 64", "'rows': 32", "resume with the source the state was saved from"],
    ),
    (
        "resume on a source with another dtype",
        _resume({}, source={"tokens": TOKENS.astype(np.int16)}),
        ValueError,
        ["'int32'", "'int16'", "resume with the source the state was saved from"],
    ),
    (
        "resume from a state missing keys",
        lambda _: DataLoader.restore(
            _state_with(seed=None, step=None), {"tokens": TOKENS}, mesh=_mesh()
        ),
        ValueError,
        ["lacks keys ['seed', 'step']", "pass the whole dict DataLoader.state() returned"],
    ),  # fmt: skip
    (
        "resume with an order group of the wrong type",  # like the constructor: not AttributeError
        _resume({}, order={"seed": 3}),
        TypeError,
        ["order must be a OrderOptions", "{'seed': 3}", "order=OrderOptions(...)"],
    ),
    (
        "resume from a state with a step of the wrong type",
        lambda _: DataLoader.restore(_state_with(step="3"), {"tokens": TOKENS}, mesh=_mesh()),
        TypeError,
        ["'step' must be an int", "str '3'", "pass the whole dict DataLoader.state() returned"],
    ),
    (
        "resume from a config with another seed",
        _config_resume,
        ValueError,
        ["seed=4", "seed=3", _RESUME_FIX],
    ),
    (
        "loader state with two open iterators",
        _state_of_two_iterators,
        ValueError,
        ["2 iterators", "next steps [1, 1]", "it.state()", "loader.batch_at(step)"],
    ),
    (
        "resume from something that is not a state",
        lambda _: DataLoader.restore({"step": 3}, {"tokens": TOKENS}, mesh=_mesh()),
        ValueError,
        ["format='psdp.loader/2'", "{'step': 3}", "pass what DataLoader.state() returned"],
    ),
    # ------------------------------------------------------------------- processes and knobs
    (
        "process index of another process",  # a KeyError inside JAX at the first batch, once
        lambda _: _loader(process_index=3),
        ValueError,
        [
            "process_index=3",
            "jax.process_index() is 0",
            "numbered 0..0",
            "leave process_index unset",
        ],
    ),
    (
        "more processes than devices",
        lambda _: MeshLayout.contiguous({"data": 4, "model": 2}, num_processes=16),
        ValueError,
        ["num_processes=16", "8 mesh devices", "divisor"],
    ),
    (
        "mesh is not a Mesh",
        lambda _: _loader(mesh="data=4,model=2"),
        TypeError,
        ["jax.sharding.Mesh", "got str"],
    ),
    (
        "seed of 2**64",  # the order hashes 64 bits: it would repeat seed 0's order
        lambda _: _loader(seed=2**64),
        ValueError,
        ["seed must be in [0, 2**64 - 1]", "18446744073709551616", "seed % 2**64"],
    ),
    (
        "negative seed",  # -1 would repeat the order of 2**64 - 1
        lambda _: _loader(seed=-1),
        ValueError,
        ["seed must be in [0, 2**64 - 1]", "got -1"],
    ),
    (
        "mask_key None while padding can occur",
        lambda _: _loader(global_batch_size=6, mask_key=None),
        ValueError,
        [
            "padded rows need a mask leaf",
            "mask_key=None asks for none",
            "pass mask_key='mask'",
            "global_batch_size=6 is not a multiple of the batch shards",
            "padded to 8 rows",
            "that the batch shards divide (e.g. 8)",
        ],  # fmt: skip
    ),
    (
        "mask_key None while an epoch's final batch is short",  # 64 rows, batches of 24
        lambda _: _loader(global_batch_size=24, mask_key=None),
        ValueError,
        [
            "padded rows need a mask leaf",
            "mask_key=None asks for none",
            "drop_last=False: a batch cut short (an epoch's final batch, or a skip)",
            "use drop_last=True",
        ],  # fmt: skip
    ),
    (
        "global batch of zero",
        lambda _: _loader(global_batch_size=0),
        ValueError,
        ["global_batch_size must be >= 1", "got 0"],
    ),
    (
        "global batch as a float",
        lambda _: _loader(global_batch_size=8.0),
        TypeError,
        ["global_batch_size must be an int", "8.0"],
    ),
    (
        "prefetch of zero",
        lambda _: _loader(prefetch=0),
        ValueError,
        ["prefetch must be >= 1", "got 0"],
    ),
    (
        "read_threads of zero",
        lambda _: _loader(read_threads=0),
        ValueError,
        ["read_threads must be >= 1", "got 0"],
    ),
    (
        "negative read timeout",
        lambda _: _loader(read_timeout_s=-1),
        ValueError,
        ["read_timeout_s must be > 0 or None", "-1"],
    ),
    (
        "mask key collides with a leaf",
        lambda _: _loader({"mask": TOKENS}, global_batch_size=6),
        ValueError,
        ["'mask'", "pass another mask_key"],
    ),
    # ------------------------------------------------ option groups (checked before any planning)
    (
        "an unknown loader option",
        lambda _: _loader(batch_size=8),
        TypeError,
        [
            "unknown loader option 'batch_size'",
            "did you mean 'global_batch_size'?",
            "the options are",
        ],
    ),
    (
        "an option given as a keyword and in its group",
        lambda _: _loader(reading=ReadingOptions(prefetch=2), read_threads=2),
        TypeError,
        [
            "read_threads given as keywords and in reading=ReadingOptions(...)",
            "dataclasses.replace",
        ],
    ),
    (
        "a group that is not its options class",
        lambda _: _loader(output={"pad_value": 0}),
        TypeError,
        ["output must be a OutputOptions", "{'pad_value': 0}", "output=OutputOptions(...)"],
    ),
    (
        "no global batch size",
        lambda _: DataLoader({"tokens": TOKENS}, mesh=_mesh(), seed=3),
        TypeError,
        ["needs global_batch_size", "global_batch_size=256", "OrderOptions(global_batch_size=256)"],
    ),
    (
        "seed as a string",
        lambda _: _loader(seed="3"),
        TypeError,
        ["OrderOptions.seed must be an int", "'3' of type str", "seed=0"],
    ),
    (
        "shuffle as a string",  # "false" would be true
        lambda _: _loader(shuffle="false"),
        TypeError,
        ["OrderOptions.shuffle must be True or False", "'false'", "shuffle=True"],
    ),
    (
        "pad_value as a string",
        lambda _: _loader(pad_value="0"),
        TypeError,
        ["OutputOptions.pad_value must be a number", "'0' of type str", "pad_value=0"],
    ),
    (
        "an empty mask key",
        lambda _: _loader(mask_key=""),
        ValueError,
        ["OutputOptions.mask_key must be a non-empty leaf name or None", "mask_key='mask'"],
    ),
    (
        "read timeout as a string",
        lambda _: _loader(read_timeout_s="60"),
        TypeError,
        ["ReadingOptions.read_timeout_s must be > 0 or None", "'60' of type str"],
    ),
    (
        "a batch spec of the wrong type",  # a tuple is not a PartitionSpec
        lambda _: _loader(batch_spec=("data", "model")),
        TypeError,
        ["ShardingOptions.batch_spec must be a strategy", "('data', 'model') of type tuple"],
    ),
    (
        "a spec text that does not parse",
        lambda _: _loader(batch_spec="(data,model"),
        ValueError,
        ["'(data,model'", "neither a strategy", "not closed", "'(replica,data),context'"],
    ),
    (
        "a misspelt strategy",  # not read as a mesh axis named "fully"
        lambda _: _loader(batch_spec="fully"),
        ValueError,
        ["did you mean 'full'?", "'fully'", "write '(fully)'"],
    ),
    (
        "batch axes that a spec would ignore",
        lambda _: _loader(batch_spec=PartitionSpec("data"), batch_axes=("data",)),
        ValueError,
        ["batch_axes ('data',) would be ignored", "P('data',)", "drop batch_axes"],
    ),
    (
        "an axis mapping without named axes",
        lambda _: _loader(axis_mapping={"batch": "data"}),
        ValueError,
        ["axis_mapping {'batch': 'data'} is given without named_axes", "drop axis_mapping"],
    ),
    (
        "a leaf with both a batch spec and named axes",
        lambda _: _loader(
            batch_spec={"tokens": "full"},
            named_axes={"tokens": ("batch", "position")},
            axis_mapping={"batch": "data"},
        ),
        ValueError,
        ["leaf 'tokens' has both a batch_spec entry", "give one of them"],
    ),  # fmt: skip
    (
        "no feeding process",
        lambda _: _loader(feeding_processes=[]),
        ValueError,
        ["feeding_processes must name at least one process", "got []", "None to feed every"],
    ),
    (
        "a negative halo",
        lambda _: _loader(halo=-1),
        ValueError,
        ["ShardingOptions.halo must be >= 0, got -1", "halo=128"],
    ),
    (
        "a config source that is not a path",
        lambda _: LoaderConfig(source=Path("tokens.npy")),  # type: ignore[arg-type]
        TypeError,
        [
            "LoaderConfig.source must be a path (a str)",
            "PosixPath('tokens.npy')",
            "source: data/tokens",
        ],
    ),
    (
        "a config without a global batch size",
        lambda tmp: LoaderConfig.create(source=str(tmp / "t.npy")).build(_mesh()),
        TypeError,
        ["needs global_batch_size", "order.global_batch_size: 256"],
    ),
    (
        "a deprecated flat config field and its group's field both set",
        lambda _: LoaderConfig(global_batch_size=8, order=OrderOptions(global_batch_size=16)),
        TypeError,
        [
            "LoaderConfig.global_batch_size (deprecated) and LoaderConfig.order.global_batch_size",
            "(8 and 16)",
            "give it once, as order.global_batch_size",
        ],
    ),
    (
        "named axes without an axis mapping",
        lambda _: _loader(named_axes={"tokens": ("batch", "position")}),
        ValueError,
        ["named_axes needs an axis_mapping", '{"batch": ("replica", "data")'],
    ),
    # ------------------------------------------------------------------- spatial domains
    (
        "a halo wider than a shard of a spatial dimension",
        lambda _: _field_loader(halo={"field": {3: (7, "periodic")}}),
        ValueError,
        ["leaf 'field'", "halo=7 on dimension 3", "12 entries over 2 shards is 6", "halo <= 6"],
    ),
    (
        "a halo wider than a shard of an uneven dimension",
        lambda _: _field_loader(FIELD[:, :, :7], halo={"field": {2: 5}}),
        ValueError,
        ["halo=5 on dimension 2", "7 entries over 2 shards is 4 per device (padded to 8)"],
    ),
    (
        "a periodic halo on the batch dimension",
        lambda _: _field_loader(halo={"field": {0: (1, "periodic")}}),
        ValueError,
        ["ShardingOptions.halo['field'] gives dimension 0 a halo", "halo={'field': {2: 1"],
    ),
    (
        "a spec that shards one dimension twice over one axis",
        lambda _: _field_loader(batch_spec={"field": PartitionSpec("data", None, ("h", "h"))}),
        ValueError,
        ["mesh axis 'h' appears twice", "('h', 'h')", "at most one dimension once"],
    ),
    (
        "a spec that shards two dimensions over one axis",
        lambda _: _field_loader(batch_spec={"field": PartitionSpec("data", None, "h", "h")}),
        ValueError,
        ["mesh axis 'h' appears twice", "P('data', None, 'h', 'h')", "at most one dimension"],
    ),
    (
        "an unknown halo boundary",
        lambda _: _field_loader(halo={"field": {3: (1, "wrap")}}),
        ValueError,
        [
            "halo['field'][3] has boundary 'wrap' (did you mean 'periodic'?)",
            "('pad', 'periodic', 'continue')",
        ],
    ),
    (
        "a halo on a dimension the leaf lacks",
        lambda _: _field_loader(halo={"field": {4: 1}}),
        ValueError,
        ["leaf 'field' a halo on dimension 4", "4 dimensions", "dimensions 1..3"],
    ),
    (
        "a halo keyed by a mesh axis name",
        lambda _: _field_loader(halo={"field": {"w": 1}}),
        TypeError,
        ["halo['field'] key must be a dimension number", "not a mesh axis name", "got 'w'"],
    ),
    (
        "a halo that is neither a width nor (width, boundary)",
        lambda _: _field_loader(halo={"field": {3: (1, 2)}}),
        TypeError,
        ["halo['field'][3] must be a width or (width, boundary)", "got (1, 2)", "(2, 'periodic')"],
    ),
    (
        "a halo mask of a domain windowed in two dimensions, without the dimension",
        lambda _: _field_loader(halo={"field": {3: 1}}).halo_mask("field"),
        ValueError,
        ["leaf 'field' is windowed in dimensions [2, 3]", "dim=3"],
    ),
    (
        "halos per dimension for a dict source",
        lambda _: _field_loader(halo={3: (1, "periodic")}),
        ValueError,
        [
            "halo={3: AxisHalo(width=1, boundary='periodic')} gives halos per dimension",
            "an array source's single leaf",
            "['field']",
            "halo={'field': {3:",
        ],
    ),
    (
        "pad_value -1 on a uint8 field padded for an uneven domain",
        lambda _: _field_loader(np.zeros((16, 2, 7, 12), np.uint8), pad_value=-1, drop_last=True),
        ValueError,
        ["pad_value=-1", "leaf 'field'", "uint8", "dimension 2 of 7 entries is padded to 8"],
    ),
    (
        "no read attempt at all",
        lambda _: _loader(read_attempts=0),
        ValueError,
        ["ReadingOptions.read_attempts must be >= 1, got 0", "read_attempts=4"],
    ),
    (
        "a retry backoff as a string",
        lambda _: _loader(retry_backoff_s="1"),
        TypeError,
        ["ReadingOptions.retry_backoff_s must be > 0 or None", "'1' of type str"],
    ),
    (
        "a first-batch grace of zero seconds",
        lambda _: _loader(first_read_timeout_s=0),
        ValueError,
        ["ReadingOptions.first_read_timeout_s must be > 0 or None", "got 0"],
    ),
    (
        "an array spec where a dataset's kvstore belongs",  # write_dataset writes datasets only
        lambda _: write_dataset({"driver": "zarr3", "kvstore": "memory://x/"}, TOKENS),
        ValueError,
        [
            "is not a TensorStore kvstore URL or spec",
            '"zarr3"',  # TensorStore's words for it vary by release
            "'s3://bucket/corpus'",
        ],
    ),
    (
        "mixture: a negative weight",
        lambda _: _mix(weights={"web": 1, "code": -0.5}),
        ValueError,
        ["stage 0's weights: the weight of 'code' is -0.5", "finite and >= 0"],
    ),
    (
        "mixture: every weight zero",
        lambda _: _mix(weights={"web": 0, "code": 0}),
        ValueError,
        ["stage 0's weights are all 0 ({'web': 0, 'code': 0})", "some source with a weight > 0"],
    ),
    (
        "mixture: a weight for a source it does not have",
        lambda _: _mix(stages=[(0, {"web": 1}), (8, {"wiki": 1})]),
        ValueError,
        ["stage 1's weights name ['wiki']", "its sources: ['web', 'code']"],
    ),
    (
        "mixture: a weight that is not a number",
        lambda _: _mix(weights={"web": "1"}),
        TypeError,
        ["the weight of 'web' must be a number, got '1'"],
    ),
    (
        "mixture: stages out of order",
        lambda _: _mix(stages=[(0, {"web": 1}), (16, {"code": 1}), (8, {"web": 1})]),
        ValueError,
        ["stage 2 starts at offset 8, not after stage 1 (offset 16)", "increasing order"],
    ),
    (
        "mixture: two stages with the same start",  # which weights would its blocks take?
        lambda _: _mix(stages=[(0, {"web": 1}), (8, {"code": 1}), (8, {"web": 1})]),
        ValueError,
        ["stage 2 starts at offset 8, not after stage 1 (offset 8)", "each once"],
    ),
    (
        "mixture: a stage off a block boundary",
        lambda _: _mix(stages=[(0, {"web": 1}), (12, {"code": 1})]),
        ValueError,
        ["stage 1 starts at offset 12", "block_size=8", "start it at 8 or 16"],
    ),
    (
        "mixture: a first stage after offset 0",
        lambda _: _mix(stages=[(8, {"web": 1})]),
        ValueError,
        ["the first stage starts at offset 8", "start the first stage at 0"],
    ),
    (
        "mixture: both weights and stages",
        lambda _: _mix(weights={"web": 1}, stages=[(0, {"web": 1})]),
        ValueError,
        ["pass weights={name: weight} (one stage) or stages=", "not both"],
    ),
    (
        "mixture: a weight the block rounds to no sample",
        lambda _: _mix(weights={"web": 99, "code": 1}),
        ValueError,
        ["source 'code' has weight 1.0 (a share of 0.01) in stage 0", "block_size >= 100"],
    ),
    (
        "mixture: sources with different leaves",
        lambda _: _mix({"web": {"tokens": TOKENS}, "code": {"ids": TOKENS}}),
        ValueError,
        ["source 'code' has leaves ['ids'], but 'web' has ['tokens']", "same leaves"],
    ),
    (
        "mixture: sources whose rows differ in shape",
        lambda _: _mix({"web": {"tokens": TOKENS}, "code": {"tokens": TOKENS[:, :4]}}),
        ValueError,
        ["source 'code' has leaf 'tokens' with rows of shape (4,) and dtype int32", "(8,) int32"],
    ),
    (
        "mixture: an empty source",
        lambda _: _mix({"web": {"tokens": TOKENS}, "code": {"tokens": TOKENS[:0]}}),
        ValueError,
        ["source 'code' of the mixture is empty (0 rows)", "drop it, or give it data"],
    ),
    (
        "mixture: a source tag on single-array sources",
        lambda _: _mix({"web": TOKENS, "code": TOKENS}, source_leaf="source"),
        ValueError,
        ["source_leaf='source' adds a leaf", "source_leaf=None"],
    ),
    (
        "mixture: a source tag named like a leaf",
        lambda _: _mix(source_leaf="tokens"),
        ValueError,
        ["source_leaf='tokens', but the sources already have a leaf 'tokens'"],
    ),
    (
        # its rows would go through this mixture's epoch permutation over 2**62 offsets,
        # scrambling its stages (and its definition would escape the state's resume check)
        "mixture: a mixture among the mixed sources",
        lambda _: _mix({"web": _mix(), "code": {"tokens": TOKENS}}),
        ValueError,
        ["source 'web' is Mixture(web:", "orders its own rows", "mix its sources directly"],
    ),
    (
        "mixture: a source name that is not a str",  # str(1) == "1" would merge two sources
        lambda _: _mix({1: {"tokens": TOKENS}, "1": {"tokens": TOKENS}}, weights={"1": 1}),
        TypeError,
        ["a mixture's source names must be str, got 1 (int)", "name each source by a str"],
    ),
    (
        "mixture: no source",
        lambda _: _mix({}, weights={}),
        ValueError,
        ["a mixture needs at least one source, got none", "pass {name: source}"],
    ),
    (
        "mixture: a stream among the sources",
        lambda _: _mix(
            {"web": {"tokens": TOKENS}, "code": StreamSource(lambda shard, count: iter(TOKENS))}
        ),
        TypeError,
        ["source 'code' of the mixture is a stream", "StreamSource", "random-access source"],
    ),
    (
        "mixture: shuffle that is not a bool",  # bool("no") is True
        lambda _: _mix(shuffle="no"),
        TypeError,
        ["a mixture's shuffle must be True or False, got 'no'"],
    ),
    (
        "mixture: a stage that starts past every sample offset",
        lambda _: _mix(stages=[(0, {"web": 1}), (1 << 64, {"code": 1})]),
        ValueError,
        ["stage 1 starts at offset 18446744073709551616", "offsets below 2**62"],
    ),
    (
        "mixture: the loader's shuffle",
        lambda _: _loader(_mix(), shuffle=True),
        ValueError,
        ["shuffle=True with Mixture(web:", "orders its own rows", "leave shuffle unset"],
    ),
    (
        "mixture: the loader's block shuffle",
        lambda _: _loader(_mix(), io_block=64),
        ValueError,
        ["io_block=64 with Mixture(", "drop io_block"],
    ),
    # ---------------------------------------------------------------- finite (eval) loaders
    (
        "epochs of 0",
        lambda _: _loader(epochs=0),
        ValueError,
        ["OrderOptions.epochs must be >= 1, got 0 (passes over the source)", "epochs=1"],
    ),
    (
        "epochs that is not an int",  # 1.5 passes would end mid-epoch at no documented step
        lambda _: _loader(epochs=1.5),
        TypeError,
        ["OrderOptions.epochs must be an int, got 1.5 of type float", "epochs=1"],
    ),
    (
        "epochs with a stream",
        lambda _: _loader(StreamSource([{"tokens": row} for row in TOKENS]), epochs=1),
        ValueError,
        ["epochs=1 with a stream", "ends on every host where its shards end", "drop epochs"],
    ),
    (
        "an eval loader over a mixture of eval sets",
        lambda _: eval_loader(_mix(), mesh=_mesh(), global_batch_size=B),
        ValueError,
        ["epochs=1 with Mixture(web:", "no epochs to pass over", "mixture.sources.items()"],
    ),
    (
        "len() of an endless loader",
        lambda _: _length(_loader()),
        TypeError,
        ["an endless DataLoader has no length", "pass epochs=N", "psdp.eval_loader"],
    ),
    # ---------------------------------------------------------------- token documents
    (
        "an empty document",
        lambda _: DocumentStore.from_documents([np.array([1, 2]), np.array([], np.int32)]),
        ValueError,
        ["document 1 is empty", "drop empty documents first"],
    ),
    (
        "a document of float token ids",
        lambda _: DocumentStore.from_documents([np.array([1.0, 2.0])]),
        TypeError,
        ["document 0", "must be integers, got dtype float64", "tokenize first"],
    ),
    (
        "a per-token leaf not aligned with the tokens",
        lambda _: DocumentStore.from_documents(
            [{"input_ids": np.array([1, 2, 3]), "loss_mask": np.array([1, 0])}]
        ),
        ValueError,
        ["document 0", "{'input_ids': 3, 'loss_mask': 2}", "align the per-token leaves"],
    ),
    (
        "documents with different leaves",
        lambda _: DocumentStore.from_documents(
            [{"input_ids": np.array([1])}, {"input_ids": np.array([2]), "w": np.array([1])}]
        ),
        ValueError,
        ["document 1 has leaves ['input_ids', 'w']", "['input_ids']", "the same leaves"],
    ),
    (
        "offsets that decrease",
        lambda _: DocumentStore.from_arrays(
            np.array([0, 3, 2, 4]), {"input_ids": np.zeros(4, int)}
        ),
        ValueError,
        ["non-decreasing", "offsets[1]=3 > offsets[2]=2", "rewrite it"],
    ),
    (
        "offsets that do not end at the token count",
        lambda _: DocumentStore.from_arrays(np.array([0, 3, 5]), {"input_ids": np.zeros(4, int)}),
        ValueError,
        ["has 4 values, but the offsets end at 5 tokens", "offsets belong to these arrays"],
    ),
    (
        "offsets that do not start at 0",
        lambda _: DocumentStore.from_arrays(np.array([1, 4]), {"input_ids": np.zeros(4, int)}),
        ValueError,
        ["must start at 0, got 1", "Levanter's JaggedArrayStore", "offsets[:1 + 1]", "rewrite it"],
    ),
    (
        # offsets allocated 2**54 long (Levanter's) are refused before any pass over them:
        # tested in a child process (tests/test_documents.py)
        "a flat leaf allocated longer than the offsets' tokens",
        lambda _: DocumentStore.from_arrays(np.array([0, 4]), {"input_ids": np.zeros(6, int)}),
        ValueError,
        ["leaf 'input_ids' of arrays has 6 values", "offsets end at 4 tokens", "pass leaf[:4]"],
    ),
    (
        "flat leaves of different lengths",
        lambda _: DocumentStore.from_arrays(
            np.array([0, 4]), {"input_ids": np.zeros(4, int), "loss_mask": np.zeros(3, int)}
        ),
        ValueError,
        ["leaf 'loss_mask'", "has 3 values, but the offsets end at 4 tokens"],
    ),
    (
        "a token range past the end of the store",
        lambda _: DocumentStore.from_documents([np.arange(5)]).read_ranges([2], [9]),
        ValueError,
        ["0 <= start <= stop <= num_tokens=5", "range 0: [2, 9)"],
    ),
    (
        "an offsets range past the offsets' end",
        lambda _: DocumentStore.from_documents([np.arange(5), np.arange(2)]).offsets_range(1, 9),
        ValueError,
        [
            "0 <= start <= stop <= num_documents + 1 = 3",
            "start=1, stop=9",
            "offsets_range(d, d + 2)",
        ],
    ),
    (
        "the document index of other offsets",
        lambda _: DocumentStore.from_arrays(
            np.array([0, 2, 4, 6]),
            {"input_ids": np.zeros(6, int)},
            index=DocumentStore.from_documents([np.arange(2), np.arange(3)]).index,
        ),
        ValueError,
        [
            "index of arrays is of 2 documents and 5 tokens",
            "offsets hold 3 documents and 6 tokens",
            "pass the index of these offsets, or index=None",
        ],
    ),
    (
        "a document index that is not one",
        lambda _: DocumentStore.from_arrays(
            np.array([0, 2]), {"input_ids": np.zeros(2, int)}, index=4096
        ),
        TypeError,
        ["index must be a DocumentIndex, a local file path or None, got int"],
    ),
    (
        "flat offsets whose slices are short",
        lambda _: DocumentStore.from_arrays(
            scale_corpus.LazyArray((4,), np.dtype(np.int64), lambda at: at[:1]),
            {"input_ids": np.zeros(3, int)},  # entry 3 (one value) is 3
        ),
        TypeError,
        ["LazyArray[0:4] returned shape (1,), not (4,)", "slice must hold stop - start values"],
    ),
    (
        "TokenSequences leaves given as one name",
        lambda _: TokenSequences(
            DocumentStore.from_documents([np.arange(9)]), 4, leaves="input_ids"
        ),
        TypeError,
        [
            "leaves must be a tuple of leaf names, got str 'input_ids'",
            "leaves=('input_ids', 'segment_ids')",
        ],
    ),
    (
        "TokenSequences leaves naming a leaf it lacks",
        lambda _: TokenSequences(
            DocumentStore.from_documents([np.arange(9)]), 4, leaves=("input_ids", "position")
        ),
        ValueError,
        [
            "leaves=('input_ids', 'position') names ['position']",
            "it has ['input_ids', 'segment_ids', 'positions']",
            "choose among those",
        ],
    ),
    (
        "TokenSequences leaves naming none",
        lambda _: TokenSequences(DocumentStore.from_documents([np.arange(9)]), 4, leaves=()),
        ValueError,
        [
            "leaves=() must name each leaf TokenSequences delivers once, and at least one",
            "leave it unset for every leaf",
        ],
    ),
    (
        "fixed-length rows of something that is not a document store",
        lambda _: TokenSequences([np.arange(9)], 4),
        TypeError,
        ["store must be a psdp DocumentStore, got list", "DocumentStore.from_documents(docs)"],
    ),
    (
        "a row longer than the whole store",
        lambda _: TokenSequences(DocumentStore.from_documents([np.arange(3)]), 5, eos_id=0),
        ValueError,
        [
            "the store has 4 tokens (EOS included), fewer than one row of seq_len=5",
            "use a shorter seq_len",
        ],
    ),  # fmt: skip
    (
        "an EOS id the token dtype cannot hold",
        lambda _: TokenSequences(
            DocumentStore.from_documents([np.arange(9, dtype=np.uint16)]), 4, eos_id=70_000
        ),
        ValueError,
        ["eos_id=70000 does not fit the store's input_ids dtype uint16 ([0, 65535])", "wider ids"],
    ),
    (
        "a negative pad id for unsigned token ids",
        lambda _: TokenSequences(
            DocumentStore.from_documents([np.arange(9, dtype=np.uint16)]), 4, pad_id=-1
        ),
        ValueError,
        ["pad_id=-1 does not fit the store's input_ids dtype uint16 ([0, 65535])"],
    ),
    (
        "a store leaf that TokenSequences computes itself",
        lambda _: TokenSequences(
            DocumentStore.from_documents([{"input_ids": np.arange(9), "positions": np.arange(9)}]),
            4,
        ),
        ValueError,
        ["the store has leaves ['positions']", "TokenSequences computes", "rename or drop them"],
    ),
    # ---------------------------------------------------------------- packing
    (
        "a packed sequence length below 1",
        lambda _: PackedSequences(DocumentStore.from_documents([np.arange(3)]), 0),
        ValueError,
        ["seq_len must be >= 1, got 0"],
    ),
    (
        "an unknown packing strategy",
        lambda _: PackedSequences(DocumentStore.from_documents([np.arange(3)]), 4, "worst_fit"),
        ValueError,
        ["strategy must be one of ['best_fit', 'first_fit', 'greedy'], got 'worst_fit'"],
    ),
    (
        "an unknown rule for long documents",
        lambda _: plan_packing([3, 9], 4, long_documents="clip"),
        ValueError,
        ["long_documents must be one of ['split', 'drop', 'truncate'], got 'clip'"],
    ),
    (
        "every document dropped for being longer than seq_len",
        lambda _: plan_packing([0, 9, 12], 8, long_documents="drop"),
        ValueError,
        [
            "nothing to pack: of 3 documents, 1 are empty and 2 are longer than seq_len=8",
            "raise seq_len, or use long_documents='split'",
        ],
    ),  # fmt: skip
    (
        "packing something that is not a document store",
        lambda _: PackedSequences([np.arange(3)], 4),
        TypeError,
        ["store must be a psdp DocumentStore, got list", "DocumentStore.from_documents"],
    ),
    (
        "a pad id the token dtype cannot hold",
        lambda _: PackedSequences(
            DocumentStore.from_documents([np.arange(3, dtype=np.uint16)]), 4, pad_id=-1
        ),
        ValueError,
        ["pad_id=-1 does not fit the store's input_ids dtype uint16", "[0, 65535]"],
    ),
    (
        "a store leaf that packing computes itself",
        lambda _: PackedSequences(
            DocumentStore.from_documents([{"input_ids": np.arange(3), "positions": np.arange(3)}]),
            4,
        ),
        ValueError,
        ["the store has leaves ['positions']", "rename or drop them"],
    ),
    (
        "document lengths that are not integers",
        lambda _: plan_packing(np.array([2.5, 3.0]), 4),
        TypeError,
        [
            "document lengths must be a 1-d integer array, got float64[2]",
            "np.diff(store.offsets_range(0, store.num_documents + 1))",
        ],
    ),
    (
        "a negative document length",
        lambda _: plan_packing([3, -1], 4),
        ValueError,
        ["document lengths must be >= 0, got -1 at document 1", "must not decrease"],
    ),
    (
        "psdp simulate with an unknown packing strategy",
        lambda _: Simulation(packing="next_fit"),
        ValueError,
        [
            "Simulation.packing must be one of ['best_fit', 'first_fit', 'greedy'] or None",
            "'next_fit'",
            "--packing best_fit",
        ],
    ),  # fmt: skip
    (
        "psdp simulate packing a source that is no document store",
        lambda tmp: check_simulation(
            Simulation(
                packing="greedy",
                data=LoaderConfig.create(_npy(tmp / "rows.npy"), global_batch_size=8),
            )
        ),
        ValueError,
        [
            "--packing packs documents, but the source",
            "rows.npy' is no document store",
            "drop --packing, or give a document store (psdp write --offsets or --eos-id",
        ],
    ),  # fmt: skip
    (
        "psdp simulate on a document store with fewer tokens than one row",
        lambda tmp: check_simulation(
            Simulation(
                processes=2,
                mesh=MeshConfig(axes={"data": 2}),
                data=LoaderConfig.create(
                    str(write_documents(tmp / "docs", [np.arange(5)], progress=False)),
                    global_batch_size=8,
                ),
                seq_len=16,
            )
        ),
        ValueError,
        [
            "docs' --seq-len 16: the store has 5 tokens",
            "fewer than one row of seq_len=16",
            "use a shorter seq_len or more documents",
        ],
    ),  # fmt: skip
    (
        "a packing seed that is not an int",
        lambda _: plan_packing([3, 1], 4, seed=0.5),
        TypeError,
        ["seed must be an int or None, got float 0.5"],
    ),
    (
        "packed leaves given as one name, not a tuple",
        lambda _: PackedSequences(
            DocumentStore.from_documents([np.arange(3)]), 4, leaves="input_ids"
        ),
        TypeError,
        ["leaves must be a tuple of leaf names, got str 'input_ids'", "e.g. leaves=('input_ids', "],
    ),
    (
        "packed leaves naming a leaf the sequences do not have",
        lambda _: PackedSequences(
            DocumentStore.from_documents([np.arange(3)]), 4, leaves=("input_ids", "labels")
        ),
        ValueError,
        [
            "leaves=('input_ids', 'labels') names ['labels'], which PackedSequences does not have "
            "(it has ['input_ids', 'segment_ids', 'positions', 'loss_mask']); choose among those",
        ],
    ),
    (
        "a packing window below 1 document",
        lambda _: PackedSequences(DocumentStore.from_documents([np.arange(3)]), 4, window=0),
        ValueError,
        ["window must be >= 1, got 0"],
    ),
    (
        "a pack index without a packing window",
        lambda tmp: PackedSequences(
            DocumentStore.from_documents([np.arange(3)]), 4, index=str(tmp / "pack.npz")
        ),
        ValueError,
        ["is the index of a packing in windows, but window=None", "set window (e.g. window=4096)"],
    ),
    (
        "a pack index path that holds another file",
        lambda tmp: (
            (tmp / "notes.npz").write_text("notes"),
            PackedSequences(
                DocumentStore.from_documents([np.arange(3)]), 4, window=2, index=tmp / "notes.npz"
            ),
        ),
        ValueError,
        ["notes.npz is not a psdp pack index", "give another path for the index, or delete"],
    ),
    (
        "a pack index built before the store changed (same size)",
        lambda tmp: (
            PackedSequences(
                DocumentStore.from_documents([np.arange(n) for n in (3, 5, 4, 4, 2, 2, 1)]),
                4,
                window=2,
                index=tmp / "pack.npz",
            ),
            PackedSequences(
                DocumentStore.from_documents([np.arange(n) for n in (3, 5, 4, 3, 3, 2, 1)]),
                4,
                window=2,
                index=tmp / "pack.npz",
            ).read(np.array([2])),  # window 1: a token moved to window 2
        ),
        ValueError,
        [
            "does not match the store: window 1 (documents [2, 4)) packs into {'sequences': 2, "
            "'tokens': 7,",
            "the index says {'sequences': 2, 'tokens': 8,",
            "delete the index to build it again",
        ],
    ),  # fmt: skip
    (
        "a length source that selects no document",
        lambda tmp: _length_source(tmp, min_length=8192, build=True).train_source(),
        ValueError,
        [
            "source 'long': min_length=8192 selects no document of",
            "its documents have 2 to 9 tokens",
            "choose bounds inside that range",
        ],
    ),  # fmt: skip
    (
        "a length source whose length index was never built",
        lambda tmp: _length_source(tmp, min_length=4, build=False).train_source(),
        FileNotFoundError,
        [
            "source 'long': no length index beside",
            "for min_length=4",
            "build it once with `psdp index",
            "--min-length 4`",
        ],
    ),  # fmt: skip
    (
        "token ids too large for the store's dtype",
        lambda tmp: write_documents(
            tmp / "docs", [np.array([1, 70_000])], dtype=np.uint16, progress=False
        ),
        ValueError,
        [
            "document 0",
            "value 70000 at token 1 does not fit the store's dtype uint16",
            "dtype=np.uint32",
        ],
    ),
    (
        "a negative token id",
        lambda tmp: write_documents(
            tmp / "docs", [np.array([4]), np.array([3, -1])], dtype=np.uint16, progress=False
        ),
        ValueError,
        ["document 1", "value -1 at token 1 does not fit the store's dtype uint16"],
    ),
    (
        "a document store with a shard file missing",
        _read_damaged(lambda path: (path / "tokens/input_ids/c/4").unlink()),
        ValueError,
        [
            "tokens/input_ids/c/4",
            "is missing",
            "of leaf 'input_ids' of",
            "The document store is damaged",
            "write_documents(..., overwrite=True)",
        ],
    ),
    (
        "a document store with a corrupted shard file",
        _read_damaged(lambda path: (path / "tokens/input_ids/c/4").write_bytes(b"\0" * 40)),
        ValueError,
        ["tokens/input_ids/c/4", "token ranges ([64, 68)", "The document store is damaged"],
    ),
    (
        "a document store whose metadata disagrees with its offsets",
        lambda tmp: DocumentStore.open(_damaged_store(tmp, _edit_metadata(num_tokens=70))),
        ValueError,
        ["offsets of", "hold 8 documents and 73 tokens", "metadata says 8 and 70", "rewrite it"],
    ),
    (
        "a document store with its offsets cut short",
        lambda tmp: DocumentStore.open(_damaged_store(tmp, _truncate_offsets)),
        ValueError,
        ["hold 7 documents and 62 tokens", "metadata says 8 and 73", "damaged: rewrite it"],
    ),
    (
        "a document store of another format version",
        lambda tmp: DocumentStore.open(_damaged_store(tmp, _edit_metadata(version=2))),
        ValueError,
        [
            "psdp.json is a psdp document store of format version 2",
            "reads version 1",
            "upgrade psdp",
        ],
    ),
    (
        "a dataset's metadata on a document store",
        lambda tmp: DocumentStore.open(_damaged_store(tmp, _edit_metadata(format="psdp.dataset"))),
        ValueError,
        ["is not a psdp document store", "'psdp.dataset'", "opens with TensorStoreSource"],
    ),
    (
        "a document store whose metadata names a leaf it lacks",
        lambda tmp: DocumentStore.open(
            _damaged_store(
                tmp, _edit_metadata(leaves={"input_ids": "uint16", "loss_mask": "uint8"})
            )
        ),
        ValueError,
        ["tokens/loss_mask/", "does not exist", "damaged or incomplete: rewrite it"],
    ),
    (
        "a continue halo on a source that does not continue its rows",
        lambda _: _loader(
            mesh=_mesh(("data", "context")),
            batch_spec=PartitionSpec("data", "context"),
            halo={"tokens": {1: (1, "continue")}},
        ),
        ValueError,
        ["boundary 'continue'", "does not continue its rows", "use 'pad' or 'periodic'"],
    ),
    # ---------------------------------------------------------------- the data config
    (
        "a data source without a store",
        lambda _: SourceConfig(weight=1),
        TypeError,
        [
            "SourceConfig.store must be the path or URL of a document store",
            "got None",
            "store: tokens/code",
        ],
    ),
    (
        "a negative source weight",
        lambda _: SourceConfig(store="tokens/code", weight=-1),
        ValueError,
        [
            "SourceConfig.weight of 'tokens/code' must be a finite number >= 0",
            "got -1",
            "weight: 3",
        ],
    ),
    (
        "a data source's inputs as one string",
        lambda _: SourceConfig(store="tokens/code", inputs="code/*.jsonl", tokenizer="t.json"),  # type: ignore[arg-type]
        TypeError,
        [
            "SourceConfig.inputs of 'tokens/code' must be a non-empty list",
            "'code/*.jsonl'",
            "inputs: [code/*.jsonl]",
        ],
    ),
    (
        "a data source's inputs without its tokenizer",
        lambda _: SourceConfig(store="tokens/code", inputs=["code/*.jsonl"]),
        ValueError,
        [
            "sets inputs but not tokenizer",
            "the prepare command needs both",
            "set tokenizer, or neither",
        ],
    ),
    (
        "a data source's tokenizer that is not a path",
        lambda _: SourceConfig(store="tokens/code", inputs=["a.jsonl"], tokenizer=3),  # type: ignore[arg-type]
        TypeError,
        [
            "SourceConfig.tokenizer of 'tokens/code' must be a non-empty str",
            "got 3",
            "tokenizer: tokenizer.json",
        ],
    ),
    (
        "a data source's eos without its inputs",
        lambda _: SourceConfig(store="tokens/code", eos="</s>"),
        ValueError,
        [
            "sets bos/eos (None, '</s>')",
            "not inputs and tokenizer",
            "set inputs and tokenizer too, or drop them",
        ],
    ),
    (
        "a data source's bos that is neither a token nor an id",
        lambda _: SourceConfig(store="tokens/code", inputs=["a.jsonl"], tokenizer="t.json", bos=-1),  # type: ignore[arg-type]
        TypeError,
        ["SourceConfig.bos of 'tokens/code' must be a token or an id >= 0", "got -1", "bos: </s>"],
    ),
    (
        "a stage at a negative step",
        lambda _: StageConfig(step=-1, weights={"code": 1}),
        ValueError,
        ["StageConfig.step must be an int >= 0", "got -1", "step: 1000"],
    ),
    (
        "a stage with a negative weight",
        lambda _: StageConfig(step=0, weights={"code": -1}),
        ValueError,
        [
            "StageConfig.weights (step 0) must map source names to finite weights >= 0",
            "{'code': -1}",
            "weights: {code: 1, prose: 3}",
        ],
    ),
    (
        "a stage whose weights are all 0",  # refused when made, not at build()
        lambda _: StageConfig(step=4, weights={"code": 0, "prose": 0}),
        ValueError,
        ["StageConfig.weights (step 4) are all 0 ({'code': 0, 'prose': 0})", "weight > 0"],
    ),
    (
        "sources whose weights are all 0",  # refused when made, not at build()
        lambda _: DataConfig(
            sources={
                "code": SourceConfig(store="c", weight=0),
                "prose": SourceConfig(store="p", weight=0.0),
            }
        ),
        ValueError,
        [
            "DataConfig.sources: every weight is 0 ({'code': 0, 'prose': 0.0})",
            "weight > 0 (unset: 1)",
        ],
    ),
    (
        "an unknown packing strategy in the view",
        lambda _: ViewConfig(packing="best"),
        ValueError,
        [
            "ViewConfig.packing must be one of ['best_fit', 'first_fit', 'greedy']",
            "'best'",
            "packing: best_fit",
        ],
    ),
    (
        "a packing window of 0",
        lambda _: ViewConfig(packing="best_fit", window=0),
        ValueError,
        ["ViewConfig.window must be an int >= 1 or unset", "got 0", "window: 4096"],
    ),
    (
        "an unknown long_documents in the view",
        lambda _: ViewConfig(packing="best_fit", long_documents="cut"),
        ValueError,
        [
            "ViewConfig.long_documents must be one of ['split', 'drop', 'truncate']",
            "'cut'",
            "long_documents: split",
        ],
    ),
    (
        "a negative packing seed",
        lambda _: ViewConfig(packing="best_fit", seed=-2),
        ValueError,
        ["ViewConfig.seed must be an int >= 0 or unset", "got -2", "seed: 0"],
    ),
    (
        "the view's targets as a string",
        lambda _: ViewConfig(targets="yes"),  # type: ignore[arg-type]
        TypeError,
        ["ViewConfig.targets must be true or false", "'yes'", "targets: true"],
    ),
    (
        "the view's eos_id as a token string",
        lambda _: ViewConfig(eos_id="</s>"),  # type: ignore[arg-type]
        TypeError,
        ["ViewConfig.eos_id must be a token id (an int)", "'</s>'", "eos_id: 0"],
    ),
    (
        "the view's pad_id as a float",
        lambda _: ViewConfig(pad_id=0.5),  # type: ignore[arg-type]
        TypeError,
        ["ViewConfig.pad_id must be a token id (an int)", "0.5", "pad_id: 0"],
    ),
    (
        "a packing window without packing",
        lambda _: ViewConfig(window=4096),
        ValueError,
        [
            "ViewConfig.window=4096 applies to packing only",
            "packing is unset",
            "set packing (e.g. packing: best_fit) or drop window",
        ],
    ),
    (
        "packed targets as a string",
        lambda _: PackedSequences(DocumentStore.from_documents([np.arange(3)]), 4, targets="yes"),  # type: ignore[arg-type]
        TypeError,
        ["targets must be a bool, got str 'yes'", "pass targets=True or targets=False"],
    ),
    (
        "packed targets over a store with its own targets leaf",
        lambda _: PackedSequences(
            DocumentStore.from_documents([{"input_ids": np.arange(3), "targets": np.arange(3)}]),
            4,
            targets=True,
        ),
        ValueError,
        [
            "the store has a leaf 'targets', which PackedSequences(targets=True) computes itself",
            "rename or drop the store's leaf, or pass targets=False",
        ],
    ),
    (
        "a packed EOS id the token dtype cannot hold",
        lambda _: PackedSequences(
            DocumentStore.from_documents([np.arange(9, dtype=np.uint16)]), 4, eos_id=70_000
        ),
        ValueError,
        ["eos_id=70000 does not fit the store's input_ids dtype uint16 ([0, 65535])", "wider ids"],
    ),
    (
        "a mixture block size of 0",
        lambda _: MixtureConfig(block_size=0),
        ValueError,
        ["MixtureConfig.block_size must be an int >= 1", "got 0", "block_size: 2048"],
    ),
    (
        "a mixture shuffle that is not a bool",
        lambda _: MixtureConfig(shuffle="no"),  # type: ignore[arg-type]
        TypeError,
        ["MixtureConfig.shuffle must be true or false", "got 'no'", "shuffle: false"],
    ),
    (
        "a cap on segments per row of 0",
        lambda _: PackedSequences(DocumentStore.from_documents([np.arange(3)]), 4, max_segments=0),
        ValueError,
        [
            "max_segments must be an int >= 1 (the most documents a packed row holds) or None",
            "got 0",
            "max_segments=64",
        ],
    ),  # fmt: skip
    (
        "a cap on segments per row that is not an int",
        lambda _: plan_packing([3, 2], 4, max_segments=2.5),
        TypeError,
        ["max_segments must be an int >= 1", "got 2.5"],
    ),
    (
        "a view's cap on segments without packing",
        lambda _: ViewConfig(max_segments=4),
        ValueError,
        ["ViewConfig.max_segments=4 applies to packing only", "set packing"],
    ),
    (
        "a view's cap on segments of 0",
        lambda _: ViewConfig(packing="greedy", max_segments=0),
        ValueError,
        ["ViewConfig.max_segments must be an int >= 1", "got 0", "max_segments: 64"],
    ),
    (
        "a negative mixture seed",
        lambda _: MixtureConfig(seed=-1),
        ValueError,
        ["MixtureConfig.seed must be an int in [0, 2**64 - 1]", "got -1", "seed: 0"],
    ),
    (
        "data sources as a list",
        lambda _: DataConfig(sources=["tokens/code"]),  # type: ignore[arg-type]
        TypeError,
        [
            "DataConfig.sources must be a mapping of name -> store",
            "['tokens/code']",
            "sources: {code: {store: tokens/code}}",
        ],
    ),
    (
        "a data config without sources, built",
        lambda tmp: _data(tmp, sources={}).build(_mesh()),
        ValueError,
        [
            "DataConfig.sources is empty",
            "name at least one store",
            "sources: {code: {store: tokens/code}}",
        ],
    ),
    (
        "a seq_len of 0",
        lambda _: DataConfig(seq_len=0),
        ValueError,
        ["DataConfig.seq_len must be an int >= 1, got 0", "seq_len: 2048"],
    ),
    (
        "a data config without seq_len, built",
        lambda tmp: _data(tmp, seq_len=None).build(_mesh()),
        ValueError,
        ["DataConfig.seq_len is unset", "seq_len: 2048"],
    ),
    (
        "stages that do not start at step 0",
        lambda _: DataConfig(stages=[StageConfig(5, {"code": 1})]),
        ValueError,
        [
            "DataConfig.stages start at steps [5]",
            "the first must start at step 0",
            "stages: [{step: 0",
        ],
    ),
    (
        "stages and source weights both",
        lambda _: DataConfig(
            sources={"code": SourceConfig(store="c", weight=2)},
            stages=[StageConfig(0, {"code": 1})],
        ),
        ValueError,
        ["DataConfig has stages and sources['code'].weight=2", "drop the sources' weights"],
    ),
    (
        "a stage weighting a source that is not one",
        lambda _: DataConfig(
            sources={"code": SourceConfig(store="c")}, stages=[StageConfig(0, {"cod": 1})]
        ),
        ValueError,
        ["the stage at step 0 weights 'cod'", "the sources are ['code']", "name sources only"],
    ),
    (
        "a stage that starts inside a mixture block",
        lambda tmp: _data(
            tmp,
            stages=[StageConfig(0, {"code": 1}), StageConfig(3, {"code": 1})],
            mixture=MixtureConfig(block_size=16),
        ).build(_mesh()),
        ValueError,
        [
            "stage at step 3 starts at sample offset 24",
            "not a multiple of mixture.block_size=16",
            "use a block_size that divides 24",
        ],
    ),
    (
        "stages without a global batch size",
        lambda tmp: _data(
            tmp, stages=[StageConfig(0, {"code": 1})], order=OrderOptions()
        ).train_source(),
        ValueError,
        [
            "DataConfig.stages start at steps (step 0)",
            "need order.global_batch_size",
            "global_batch_size: 256",
        ],
    ),
    (
        "an eval set with a weight",
        lambda _: DataConfig(eval={"held_out": SourceConfig(store="e", weight=1)}),
        ValueError,
        ["DataConfig.eval['held_out'] has weight 1", "read whole, once", "drop the weight"],
    ),
    (
        "an eval batch size of 0",
        lambda _: DataConfig(eval_batch_size=0),
        ValueError,
        ["DataConfig.eval_batch_size must be an int >= 1 or unset, got 0", "eval_batch_size: 64"],
    ),
    (
        "eval loaders with neither an eval batch size nor one train batch size",
        lambda tmp: _data(
            tmp, order=OrderOptions(global_batch_size=[(0, 8), (10, 16)])
        ).eval_loaders(_mesh()),
        ValueError,
        ["DataConfig.eval_batch_size is unset", "not one batch size", "set eval_batch_size"],
    ),
    (
        "a data config that shuffles its mixture",
        lambda _: DataConfig(order=OrderOptions(shuffle=True)),
        ValueError,
        [
            "DataConfig.order.shuffle=True",
            "read as a mixture, which shuffles",
            "leave shuffle unset",
        ],
    ),
    (
        "a data config's view as a dict in Python",
        lambda _: DataConfig(view={"packing": "best_fit"}),  # type: ignore[arg-type]
        TypeError,
        ["DataConfig.view must be a ViewConfig", "got dict", "ViewConfig()"],
    ),
    (
        "a data config's order group of the wrong type",
        lambda _: DataConfig(order={"global_batch_size": 8}),  # type: ignore[arg-type]
        TypeError,
        ["DataConfig.order must be a OrderOptions", "got {'global_batch_size': 8}"],
    ),
    (
        "a data config dict with an unknown field",
        lambda _: DataConfig.from_dict({"seq_length": 8}),
        TypeError,
        ["DataConfig has no field 'seq_length'", "its fields are ['sources'"],
    ),
    (
        "a data source whose store is missing",
        lambda tmp: _data(
            tmp,
            sources={
                "web": SourceConfig(
                    store=str(tmp / "web"), inputs=["web.jsonl"], tokenizer="t.json"
                )
            },
        ).build(_mesh()),
        FileNotFoundError,
        [
            "source 'web': there is no document store at",
            "make it with `psdp prepare web.jsonl --output",
            "--tokenizer t.json`",
        ],
    ),
    (
        "a data source format that is neither psdp nor levanter",
        lambda _: SourceConfig(store="cache/train", format="zarr"),
        ValueError,
        ["SourceConfig.format of 'cache/train' must be one of ['psdp', 'levanter']", "'zarr'"],
    ),
    (
        "a Levanter data source with psdp prepare's inputs and tokenizer",
        lambda _: SourceConfig(
            store="cache/train", format="levanter", inputs=["a.jsonl"], tokenizer="t.json"
        ),
        ValueError,
        ["'cache/train' is a Levanter cache (format: levanter)", "drop inputs, tokenizer"],
    ),
    (
        "a Levanter data source at a path with no cache",
        lambda tmp: _levanter_data(tmp, str(tmp / "nope")).build(_mesh()),
        FileNotFoundError,
        [
            "source 'web': there is no Levanter cache at",
            "it has no shard_ledger.json",
            "python -m levanter.main.cache_dataset --config_path <config.yaml>",
        ],
    ),
    (
        "a Levanter data source whose cache is unfinished",
        lambda tmp: _levanter_data(tmp, _levanter_cache(tmp, finished=False)).build(_mesh()),
        ValueError,
        [
            "source 'web': the Levanter cache at",
            "is unfinished: its shard_ledger.json says is_finished=False",
            "1 of 2 shards finished, 2 documents so far",
            "run `python -m levanter.main.cache_dataset",
        ],
    ),
    (
        "a psdp store named as a Levanter cache",
        lambda tmp: _levanter_data(tmp, _data_store(tmp)).build(_mesh()),
        ValueError,
        ["code is a psdp store (psdp.json), not a Levanter cache", "format: psdp, the default"],
    ),
    (
        "a Levanter cache named as a psdp store",
        lambda tmp: _data(tmp, sources={"web": SourceConfig(store=_levanter_cache(tmp))}).build(
            _mesh()
        ),
        ValueError,
        ["source 'web':", "lev' is a Levanter token cache", "set format: levanter"],
    ),
    (
        "a Levanter cache opened as a psdp document store",
        lambda tmp: DocumentStore.open(_levanter_cache(tmp)),
        ValueError,
        [
            "lev' is a Levanter token cache (shard_ledger.json), not a psdp document store",
            "psdp.sources.open_levanter_cache(path)",
            "set format: levanter",
        ],  # fmt: skip
    ),
    (
        "a data source prepared from both a text field and chat messages",
        lambda _: SourceConfig(
            store="s", inputs=["a.jsonl"], tokenizer="t.json", field="text", messages="chat"
        ),  # fmt: skip
        ValueError,
        ["sets field='text' and messages='chat'", "not both; keep one"],
    ),
    (
        "a data source with prepare settings but no inputs",
        lambda _: SourceConfig(store="s", messages="chat"),
        ValueError,
        ["SourceConfig of 's' sets ['messages'] but not inputs and tokenizer"],
    ),
    (
        "a Levanter cache opened with a leaf it does not have",
        lambda tmp: open_levanter_cache(_levanter_cache(tmp), leaves=("input_ids", "loss_mask")),
        ValueError,
        [
            "has no leaf 'loss_mask' (no loss_mask/offsets)",
            "its leaves are ['input_ids', 'sources_len']",
        ],
    ),
    (
        "a Levanter cache opened with a leaf that is not one value per token",
        lambda tmp: open_levanter_cache(_levanter_cache(tmp), leaves=("input_ids", "sources_len")),
        ValueError,
        [
            "leaf 'sources_len' of the Levanter cache at",
            "holds 4 documents ending at 4, but input_ids holds 4 ending at 29",
            "not one value per token",
        ],
    ),
    (
        "a Levanter cache opened with leaves that do not start with input_ids",
        lambda tmp: open_levanter_cache(_levanter_cache(tmp), leaves="input_ids"),
        ValueError,
        ["leaves must be a tuple of distinct leaf names", "'input_ids' first", "got 'input_ids'"],
    ),
    (
        "an eval set whose prepared store is unfinished",
        lambda tmp: _data(
            tmp, eval={"web": SourceConfig(store=_unfinished_store(tmp))}
        ).eval_loaders(_mesh()),
        ValueError,
        [
            "eval set 'web': the store",
            "is unfinished",
            "finish it with `psdp prepare <text files> --output",
        ],
    ),
    (
        "a data store too short for one row",
        lambda tmp: _data(tmp, seq_len=1000).build(_mesh()),
        ValueError,
        ["source 'code' (", "fewer than one row of seq_len=1000", "use a shorter seq_len"],
    ),
    (
        "a data config restored with another seq_len",
        lambda tmp: _data(
            tmp, seq_len=2, stages=[StageConfig(0, {"code": 1}), StageConfig(2, {"code": 1})]
        ).restore(_data_state(tmp), _mesh()),
        ValueError,
        ["DataConfig.seq_len is 2, but the run was saved with 4", "resume with seq_len: 4"],
    ),
    (
        "a data config restored with a stage added before the resume step",
        lambda tmp: _data(
            tmp,
            stages=[
                StageConfig(0, {"code": 1}),
                StageConfig(1, {"code": 1}),
                StageConfig(2, {"code": 1}),
            ],
        ).restore(_data_state(tmp), _mesh()),
        ValueError,
        [
            "the stage at step 2 starts before step 3",
            "the saved run had 2 stage(s) before it",
            "start the stage at step 3 or later",
        ],
    ),
    # ---------------------------------------------------------------- psdp prepare
    (
        "prepare with a tokenizer path that does not exist",
        lambda tmp: _prepare(tmp, tokenizer=tmp / "nope"),
        FileNotFoundError,
        [
            "tokenizer=",
            "nope",
            "is not a tokenizer.json file or a model directory",
            "nothing is downloaded",
        ],
    ),
    (
        "prepare of an input that does not exist",
        lambda tmp: _prepare(tmp, inputs=[str(tmp / "missing.jsonl")]),
        FileNotFoundError,
        ["missing.jsonl", "does not exist", "name a file, glob or directory"],
    ),
    (
        "prepare of a glob that matches nothing",
        lambda tmp: _prepare(tmp, inputs=[str(tmp / "*.parquet")]),
        FileNotFoundError,
        ["no file matches the input", "*.parquet", "check the pattern"],
    ),
    (
        "prepare of a file of an unknown format",
        lambda tmp: _prepare(tmp, inputs=[_jsonl(tmp / "a.csv")]),
        ValueError,
        ["cannot tell the format of", "a.csv", ".jsonl.zst", ".parquet", "rename the file"],
    ),
    (
        "prepare of a directory that is no datasets export",
        lambda tmp: _prepare(tmp, inputs=[str(tmp)]),
        ValueError,
        ["is a directory but not a datasets save_to_disk export", "state.json", "DIR/*.jsonl"],
    ),
    (
        "prepare of a malformed jsonl record",
        lambda tmp: _prepare(tmp, lines=['{"text": "a"}', '{"text": "b"']),
        BadRecordError,
        ["a.jsonl, line 2", "not valid JSON", "skip_bad=True (--skip-bad)"],
    ),
    (
        "prepare of a jsonl line that is not UTF-8",
        lambda tmp: _prepare(tmp, inputs=[_bytes(tmp / "b.jsonl", b'{"text": "a \xff"}\n')]),
        BadRecordError,
        ["b.jsonl, line 1", "not valid UTF-8", "byte 0xff", "skip_bad=True"],
    ),
    (
        "prepare of a text with a lone surrogate",
        lambda tmp: _prepare(tmp, lines=['{"text": "a \\ud83d"}']),
        BadRecordError,
        ["a.jsonl, line 1", "not valid text", "lone surrogate", "skip_bad=True"],
    ),
    (
        "prepare of one file named twice",
        lambda tmp: _prepare(tmp, inputs=[tmp / "a.jsonl", str(tmp / "*.jsonl")]),
        ValueError,
        ["a.jsonl is named more than once", "*.jsonl", "name each file once"],
    ),
    (
        "prepare of records that lack the text field",
        lambda tmp: _prepare(tmp, lines=['{"body": "a"}']),
        BadRecordError,
        ["a.jsonl, line 1", "no field 'text'", "(it has ['body'])", "skip_bad=True"],
    ),
    (
        "prepare of a Parquet file without the text column",
        lambda tmp: _prepare(tmp, inputs=[_parquet(tmp / "t.parquet", {"body": ["a"]})]),
        ValueError,
        ["t.parquet has no column 'text'", "(it has ['body'])", "field= (--field)"],
    ),
    (
        "prepare with a bos token the tokenizer lacks",
        lambda tmp: _prepare(tmp, bos="<s>"),
        ValueError,
        ["bos='<s>' is not a token of the tokenizer", "added_tokens", "or an id"],
    ),
    (
        "prepare with an eos id outside the vocabulary",
        lambda tmp: _prepare(tmp, eos=3),
        ValueError,
        ["eos=3 is not an id of the tokenizer's vocabulary of 3 ids", "[0, 3)"],
    ),
    (
        "prepare of inputs whose every record is empty",
        lambda tmp: _prepare(tmp, lines=['{"text": ""}']),
        ValueError,
        ["every record of the inputs was empty or skipped", "--field"],
    ),
    (
        "prepare of an input file of 0 bytes",
        lambda tmp: _prepare(tmp, inputs=[_file(tmp / "e.jsonl")]),
        ValueError,
        ["the inputs hold no record at all", "e.jsonl (0 bytes)", "name inputs that hold records"],
    ),
    (
        "prepare of a .jsonl.zst cut short",
        lambda tmp: _prepare(tmp, inputs=[_cut_short(tmp / "c.jsonl.zst")], skip_bad=True),
        CorruptFileError,
        [
            "c.jsonl.zst: the zstd data is cut short",
            "inside a zstd frame",
            "in line 1 ",
            "download or write it again",
            "skip_bad skips malformed records, never",
        ],
    ),  # fmt: skip
    (
        "prepare of a .jsonl.gz cut short",
        lambda tmp: _prepare(tmp, inputs=[_cut_short(tmp / "c.jsonl.gz")]),
        CorruptFileError,
        ["c.jsonl.gz: the gzip data is cut short", "inside a gzip member", "download or write"],
    ),
    (
        "prepare of a Parquet file cut short",
        lambda tmp: _prepare(tmp, inputs=[_cut_short(tmp / "c.parquet")]),
        CorruptFileError,
        ["c.parquet cannot be opened as a Parquet file", "truncated or damaged"],
    ),
    (
        "prepare of an Arrow IPC file cut short (no footer)",
        lambda tmp: _prepare(tmp, inputs=[_cut_short(tmp / "c.arrow")]),
        CorruptFileError,
        ["c.arrow cannot be opened as an Arrow IPC file", "truncated or damaged"],
    ),
    (
        "prepare of an Arrow IPC stream cut between its batches",
        lambda tmp: _prepare(tmp, inputs=[_cut_short(tmp / "c-stream.arrow")]),
        CorruptFileError,
        ["c-stream.arrow: cannot read on from row 200", "no end-of-stream marker"],
    ),
    (
        "prepare of a datasets export whose state.json is damaged",
        lambda tmp: _prepare(tmp, inputs=[_damaged_export(tmp)]),
        CorruptFileError,
        ["export/state.json is not valid JSON", "save it again with save_to_disk"],
    ),
    (
        "prepare into a store whose manifest was damaged",
        lambda tmp: _prepare_twice(tmp, {}, lambda t: (t / "store/psdp.json").write_text("{")),
        ValueError,
        ["store/psdp.json, the manifest of the store, is not valid JSON", "restore it from a copy"],
    ),
    (
        "prepare into an output path that is a file",
        lambda tmp: _prepare_into_a_file(tmp),
        FileExistsError,
        ["the output", "must be a directory", "out.txt is a file", "name a new directory"],
    ),
    (
        "prepare into a store made with other settings (another eos)",
        lambda tmp: _prepare_twice(tmp, {"eos": 2}),
        ValueError,
        ["was prepared with other settings", "eos: None there, 2 now", "prepare into a new output"],
    ),
    (
        "prepare into a store without naming one of its inputs",
        lambda tmp: _prepare_twice(tmp, {"inputs": [_jsonl(tmp / "b.jsonl")]}),
        ValueError,
        ["holds the input", "a.jsonl", "which this run does not name", "new inputs are appended"],
    ),
    (
        "prepare into a store after one of its inputs changed",
        lambda tmp: _prepare_twice(tmp, {"lines": ['{"text": "a b a"}']}),
        ValueError,
        ["the input", "a.jsonl changed since it was prepared", "prepare into a new output"],
    ),
    (
        "prepare into a directory that holds other files",
        lambda tmp: _prepare(tmp, inputs=[_jsonl(tmp / "store" / "mine.jsonl")]),
        FileExistsError,
        ["store already holds 1 files and is no psdp prepare store", "choose a new output"],
    ),
    (
        "prepare into an output that another run is writing",
        lambda tmp: _prepare_while_held(tmp),
        FileExistsError,
        ["another psdp prepare (pid", "is writing", "run one prepare per output at a time"],
    ),
    (
        "prepare with an unknown engine",
        lambda tmp: _prepare(tmp, engine="spark"),
        ValueError,
        ["engine='spark' is not one of ['local', 'ray']"],
    ),
    (
        "prepare with 0 workers",
        lambda tmp: _prepare(tmp, workers=0),
        ValueError,
        ["workers must be >= 1, got 0"],
    ),
    (
        "opening the store of a prepare that did not finish",
        lambda tmp: DocumentStore.open(_unfinished_prepare(tmp)),
        ValueError,
        [
            "is an unfinished psdp prepare",
            "0 of 1 parts are committed",
            "run the same psdp prepare again",
        ],
    ),
    # ---------------------------------------------------------------- the local pod
    (
        "a pod with fewer per-process environments than processes",
        lambda _: run_pod(
            "psdp.tools.pod:_describe_host",
            num_processes=2,
            devices_per_process=1,
            env=[{"PYTHONHASHSEED": "0"}],
        ),  # fmt: skip
        ValueError,
        ["env is a list of 1 environments for 2 processes", "one dict per process"],
    ),
    (
        "a pod's echo that is not a text stream",
        lambda _: run_pod(
            "psdp.tools.pod:_describe_host", num_processes=2, devices_per_process=1, echo=True
        ),
        TypeError,
        ["echo must be a text stream", "got bool True", "pass echo=sys.stdout"],
    ),
    (
        "a pod's log_dir that is a file",
        lambda tmp: run_pod(
            "psdp.tools.pod:_describe_host",
            num_processes=2,
            devices_per_process=1,
            log_dir=_file(tmp / "logs.txt"),
        ),
        ValueError,
        ["log_dir must be a folder", "logs.txt' is a file", "name a folder"],
    ),
    # ---------------------------------------------------------------- prepare: chat records
    (
        "chat records with a tokenizer whose template has no generation markers",
        lambda tmp: render_chat(
            chat_tokenizer.save_chat_tokenizer(tmp, template=_UNMARKED_TEMPLATE), _CHATS
        ),
        ValueError,
        [
            "has no such marker",
            'it begins "{{ bos_token }}',
            "wrap each assistant turn",
            "{% generation %}",
        ],
    ),
    (
        "chat records with a tokenizer that has no chat template",
        lambda tmp: render_chat(chat_tokenizer.save_chat_tokenizer(tmp, template=None), _CHATS),
        ValueError,
        ["has none (chat_template is None)", "set tokenizer.chat_template"],
    ),
    (
        "chat records with a tokenizer path that holds no tokenizer.json",
        lambda tmp: render_chat(tmp, _CHATS),
        ValueError,
        ["has no tokenizer.json", "the directory that the tokenizer's save_pretrained() wrote"],
    ),
    (
        "a chat record whose message has no content",
        lambda tmp: render_chat(
            chat_tokenizer.save_chat_tokenizer(tmp), [*_CHATS, [{"role": "user", "text": "hi"}]]
        ),
        ValueError,
        [
            "string 'role' and a string 'content'",
            "record 1 of the batch is [{'role': 'user', 'text': 'hi'}]",
            "skip_bad=True",
        ],
    ),
    (
        "a Ray engine given both a running cluster's address and a local cluster's num_cpus",
        lambda _: RayEngine(address="127.0.0.1:6379", num_cpus=4),
        ValueError,
        ["address='127.0.0.1:6379'", "num_cpus=4 given", "pass address to use a running cluster"],
    ),
    (
        "an S3 endpoint in the environment without its scheme",
        lambda _: environment_endpoint({"driver": "s3"}, {"AWS_ENDPOINT_URL": "127.0.0.1:9000"}),
        ValueError,
        ["AWS_ENDPOINT_URL='127.0.0.1:9000' is not an S3 endpoint URL", "http://127.0.0.1:9000"],
    ),
    (
        "an S3 endpoint that does not answer (a closed port)",
        lambda _: TensorStoreSource(
            {
                "driver": "s3",
                "bucket": "psdp",
                "path": "x/",
                "aws_credentials": {"type": "anonymous"},
                "endpoint": f"http://127.0.0.1:{_CLOSED_PORT}",
            }
        ),
        ValueError,
        [
            f"cannot reach s3://psdp/x/ (endpoint http://127.0.0.1:{_CLOSED_PORT})",
            "AWS_ENDPOINT_URL",
        ],
    ),
    (
        "a GCS endpoint in the environment without its scheme",
        lambda _: gcs_endpoint({GCS_ENDPOINT_VARIABLE: "127.0.0.1:4443"}),
        ValueError,
        [
            "TENSORSTORE_GCS_HTTP_URL='127.0.0.1:4443' is not a GCS endpoint URL",
            "http://127.0.0.1:9000",
        ],
    ),
    (
        "a GCS endpoint that does not answer (a closed port)",
        lambda _: _open_gs_at(f"http://127.0.0.1:{_CLOSED_PORT}"),
        ValueError,
        [
            f"cannot reach gs://psdp/x/ (endpoint http://127.0.0.1:{_CLOSED_PORT})",
            "--endpoint URL, or the environment (TENSORSTORE_GCS_HTTP_URL)",
        ],
    ),
]


def _no_hang(action: Callable[[], Any]) -> BaseException | None:
    """Runs ``action`` on a thread; returns what it raised. Fails if it runs HANG_GUARD_S."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run, name="bad-input-case", daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"the case hung for {HANG_GUARD_S} s"
    return raised[0] if raised else None


@pytest.mark.parametrize(
    ("action", "exception", "fragments"),
    [pytest.param(*row[1:], id=row[0]) for row in CASES],
)
def test_bad_input_is_a_clear_error(tmp_path, action, exception, fragments):
    error = _no_hang(lambda: action(tmp_path))
    assert error is not None, "no error: the mistake went through"
    if isinstance(error, AssertionError):
        raise error  # a wrong batch was delivered before the error
    assert type(error) is exception, f"{type(error).__name__}: {error}"
    message = " ".join(str(error).split())
    missing = [f for f in fragments if f not in message]
    assert not missing, f"message lacks {missing}: {message}"


def test_the_reliability_doc_counts_this_table():
    text = (Path(__file__).parents[1] / "docs" / "reference" / "reliability.md").read_text()
    assert f"| {len(CASES)} user mistakes each raise" in text
