"""psdp as Levanter's data loader (`psdp.levanter`), checked against Levanter itself.

Runs in the Levanter venv (`make test-levanter`: marin-levanter from requirements/
levanter-py311.lock); elsewhere every test skips, as Levanter is not installed. The cache is
written by Levanter's own `SerialCacheWriter`; Levanter's side is its own `DataLoader` over its
own unshuffled datasets (`TokenSeqDataset` -> `CausalLmDataset` -> `NamedLmDataset`), the
semantics psdp's `TokenSequences` shares (concatenate, then split).
"""

from __future__ import annotations

import json
import socket
from itertools import islice
from unittest import mock

import jax
import numpy as np
import pytest

levanter = pytest.importorskip(
    "levanter", reason="Levanter is not installed here: `make test-levanter` runs these tests"
)

import haliax as hax  # noqa: E402  (marin-haliax, installed with Levanter)
from levanter.data.loader import DataLoader as LevanterDataLoader  # noqa: E402
from levanter.data.text.datasets import (  # noqa: E402
    CausalLmDataset,
    NamedLmDataset,
    TokenSeqDataset,
)
from levanter.store.cache import SerialCacheWriter, TreeCache  # noqa: E402

import psdp  # noqa: E402
import psdp.levanter  # noqa: E402
from psdp.levanter import LevanterLoader, data_config  # noqa: E402
from psdp.tools.pod import PodError, run_pod  # noqa: E402
from tests.meshes import mesh_of  # noqa: E402
from tests.pod_targets_levanter import BATCH, EOS, SAVE_EVERY, SEQ_LEN, VOCAB, train  # noqa: E402

# Levanter and its haliax call jax APIs that jax 0.10 deprecates: their business, not psdp's
pytestmark = pytest.mark.filterwarnings("ignore:jax[.].* is deprecated:DeprecationWarning")

STEPS = 20  # the training steps compared (the cache holds 36 whole steps)
MAPPING = {"batch": "data"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """200 documents of 3..40 ids (int64, each ending in EOS), written by Levanter: 20 steps
    and more of rows."""
    root = str(tmp_path_factory.mktemp("levanter") / "train")
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(200):
        ids = rng.integers(2, VOCAB, size=int(rng.integers(2, 40)), dtype=np.int64)
        docs.append({"input_ids": np.append(ids, EOS).astype(np.int64)})
    exemplar = {"input_ids": np.zeros((0,), dtype=np.int64)}
    with SerialCacheWriter(root, exemplar) as writer:
        for start in range(0, len(docs), 64):  # several appended batches, as a builder writes
            writer.write_batch(docs[start : start + 64])
    return root


def _rows(cache: str, seq_len: int) -> TokenSeqDataset:
    return TokenSeqDataset(TreeCache.load(cache, {"input_ids": np.zeros((0,), np.int64)}), seq_len)


def _levanter_loader(cache: str, mesh, Pos, mapping=MAPPING) -> LevanterDataLoader:
    dataset = NamedLmDataset(CausalLmDataset(_rows(cache, Pos.size), Pos, eos_id=EOS), Pos)
    return LevanterDataLoader(dataset, BATCH, mesh=mesh, axis_resources=mapping)


def _assert_same_batch(ours, theirs) -> None:
    """Leaf by leaf (structure, names, dtype, sharding) and shard by shard (index, data)."""
    our_leaves, our_tree = jax.tree.flatten(ours, is_leaf=hax.is_named_array)
    their_leaves, their_tree = jax.tree.flatten(theirs, is_leaf=hax.is_named_array)
    assert our_tree == their_tree
    for mine, other in zip(our_leaves, their_leaves, strict=True):
        if hax.is_named_array(other):
            assert mine.axes == other.axes
            mine, other = mine.array, other.array
        assert mine.dtype == other.dtype and mine.shape == other.shape
        assert mine.sharding.is_equivalent_to(other.sharding, mine.ndim)
        shards = {s.device: s for s in other.addressable_shards}
        for shard in mine.addressable_shards:
            assert shard.index == shards[shard.device].index
            np.testing.assert_array_equal(
                np.asarray(shard.data), np.asarray(shards[shard.device].data)
            )


def test_batches_equal_levanters_loader(cache: str) -> None:
    mesh = mesh_of(("data",), (8,))
    Pos = hax.Axis("position", SEQ_LEN)
    theirs = _levanter_loader(cache, mesh, Pos)
    with LevanterLoader.from_cache(
        cache, mesh=mesh, Pos=Pos, batch_size=BATCH, axis_resources=MAPPING, eos_id=EOS
    ) as ours:
        # Levanter's loader makes one pass, its last batch padded with zero rows; psdp's training
        # loader drops that short step (Levanter's batches carry no mask) and goes on
        rows = len(_rows(cache, SEQ_LEN).as_sync_dataset())
        assert rows % BATCH and len(theirs) == rows // BATCH + 1
        steps = list(zip(ours, theirs, strict=False))[: rows // BATCH]
        assert len(steps) >= 20
        for mine, other in steps:
            _assert_same_batch(mine, other)
        # a segment starts after each EOS, as Levanter's: the rows do cross documents
        assert any(int(m.attn_mask.segment_ids[0].array.max()) > 0 for m, _ in steps)


def test_resume_at_a_step_on_other_devices_equals_the_uninterrupted_run(cache: str) -> None:
    """In one process: an iterator closed after step 2, and a new loader on a mesh whose
    devices are in another order started at step 3: steps 3.. are the uninterrupted run's,
    row for row (the real kill on a pod is the test below)."""
    Pos = hax.Axis("position", SEQ_LEN)
    kwargs = dict(Pos=Pos, batch_size=BATCH, axis_resources=MAPPING, eos_id=EOS)
    with LevanterLoader.from_cache(cache, mesh=mesh_of(("data",), (8,)), **kwargs) as whole:
        uninterrupted = [np.asarray(b.tokens.array) for b in islice(whole, STEPS)]
    with LevanterLoader.from_cache(cache, mesh=mesh_of(("data",), (8,)), **kwargs) as first:
        run = first.iter_from_step(0)
        seen = [np.asarray(next(run).tokens.array) for _ in range(3)]
        run.close()
    devices = np.array(jax.devices()[::-1])
    other = jax.sharding.Mesh(devices, ("data",))
    with LevanterLoader.from_cache(cache, mesh=other, **kwargs) as resumed:
        seen += [np.asarray(b.tokens.array) for b in islice(resumed.iter_from_step(3), STEPS - 3)]
    assert len(seen) == len(uninterrupted)
    for got, want in zip(seen, uninterrupted, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(420)  # three pods of at most 120 s, and a minute
def test_resume_on_another_host_counts_as_uninterrupted(cache: str, tmp_path) -> None:
    """A 2-process pod (2 CPU devices each) trains on psdp's `LevanterLoader` and saves its
    state with Levanter's checkpointer after step 4; every host is then SIGKILLed, its loader
    reading ahead. One process with 4 devices resumes as `train_lm` does (Levanter's latest
    checkpoint, the loader from its step): every step's rows, on either side of the kill, and
    the trained state at the end are the uninterrupted run's (one process, 4 devices)."""
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    killed.mkdir(), whole.mkdir()
    run = dict(cache=cache, steps=STEPS)
    with pytest.raises(PodError, match="killed by signal SIGKILL"):
        run_pod(train, num_processes=2, devices_per_process=2, timeout_s=120,
                args=dict(run, run_dir=str(killed), record="before", kill_after_save=True))  # fmt: skip
    (resumed,) = run_pod(train, num_processes=1, devices_per_process=4, timeout_s=120,
                         args=dict(run, run_dir=str(killed), record="after",
                                   kill_after_save=False))  # fmt: skip
    (uninterrupted,) = run_pod(train, num_processes=1, devices_per_process=4, timeout_s=120,
                               args=dict(run, run_dir=str(whole), record="whole",
                                         kill_after_save=False))  # fmt: skip
    assert resumed["first_step"] == SAVE_EVERY + 1  # the checkpoint after step 4: 5 steps done
    assert resumed["seen"] == uninterrupted["seen"]
    before, after = _trained(killed, "before", 2), _trained(killed, "after", 1)
    whole_run = _trained(whole, "whole", 1)
    # the pod trained steps 0..4 and the restore took up at 5: no step lost or trained twice
    assert sorted(before) == list(range(SAVE_EVERY + 1))
    assert sorted(after) == list(range(SAVE_EVERY + 1, STEPS))
    assert sorted(whole_run) == list(range(STEPS))
    for step in range(STEPS):
        assert ({**before, **after}[step][0], step) == (whole_run[step][0], step)
        np.testing.assert_array_equal(
            {**before, **after}[step][1], whole_run[step][1], err_msg=f"step {step}")  # fmt: skip


def _trained(run_dir, record: str, processes: int) -> dict[int, tuple[int, np.ndarray]]:
    """Step -> (the state's ``seen`` after it, the step's rows) from the records of `train`'s
    hosts: each host wrote the rows on its devices, and every row comes from exactly one."""
    seen: dict[int, set[int]] = {}
    rows: dict[int, dict[int, list]] = {}
    for process in range(processes):
        for line in (run_dir / f"{record}.p{process}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            seen.setdefault(entry["step"], set()).add(entry["seen"])
            rows.setdefault(entry["step"], {}).update(
                {int(k): v for k, v in entry["rows"].items()})  # fmt: skip
    out = {}
    for step, by_start in rows.items():
        (value,) = seen[step]  # every host holds the same state
        batch = np.concatenate([np.asarray(by_start[k]) for k in sorted(by_start)])
        assert batch.shape == (BATCH, SEQ_LEN), (step, batch.shape)
        out[step] = (value, batch)
    return out


def test_eval_loader_weights_padding_rows_zero(cache: str) -> None:
    mesh = mesh_of(("data",), (8,))
    Pos = hax.Axis("position", SEQ_LEN)
    with LevanterLoader.from_cache(
        cache, mesh=mesh, Pos=Pos, batch_size=BATCH, axis_resources=MAPPING, eos_id=EOS,
        evaluation=True,
    ) as ours:  # fmt: skip
        batches = list(ours)
    theirs = list(_levanter_loader(cache, mesh, Pos))
    assert len(batches) == len(theirs)  # every row once, the last batch padded
    rows = sum(int((np.asarray(b.loss_weight.array).sum(axis=1) > 0).sum()) for b in batches)
    assert rows == len(_rows(cache, SEQ_LEN).as_sync_dataset())
    for mine, other in zip(batches[:-1], theirs[:-1], strict=True):
        _assert_same_batch(mine, other)


@pytest.mark.timeout(
    300
)  # two Llama compiles under Levanter's Trainer: 120 s cut it on 2 busy cores
def test_losses_equal_levanters_for_20_steps(cache: str, tmp_path, monkeypatch) -> None:
    """A tiny Llama trained by Levanter's `Trainer` on its own loader, then on psdp's."""
    monkeypatch.chdir(tmp_path)  # Levanter writes logs/ into the working directory
    import jax.random as jrandom
    from levanter.checkpoint import CheckpointerConfig
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer, TrainerConfig

    steps = STEPS
    model_config = LlamaConfig(
        max_seq_len=SEQ_LEN, hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2,
        num_kv_heads=2,
    )  # fmt: skip
    trainer_config = TrainerConfig(
        num_train_steps=steps, train_batch_size=BATCH, tracker=NoopConfig(),
        require_accelerator=False, id="psdp-levanter-test",
        checkpointer=CheckpointerConfig(base_path=str(tmp_path / "ckpt"), save_interval=None),
    )  # fmt: skip

    levanter.initialize(trainer_config)  # as train_lm does: logging, the tracker

    def losses(make_loader) -> list[float]:
        optimizer = AdamConfig(learning_rate=1e-2).build(steps)

        def loss_fn(model, example, *, key=None):
            return model.compute_next_token_loss(example, key=key)

        with Trainer(trainer_config, optimizer, loss_fn, add_default_hooks=False) as trainer:
            Vocab = hax.Axis("vocab", VOCAB)
            state = trainer.initial_state(
                jrandom.PRNGKey(0),
                model_init=lambda: model_config.build(Vocab, key=jrandom.PRNGKey(1)),
            )
            loader = make_loader(trainer)
            return [
                float(info.loss) for info in trainer.training_steps(state, loader.iter_from_step(0))
            ]

    Pos = model_config.max_Pos
    theirs = losses(lambda t: _levanter_loader(cache, t.device_mesh, Pos, t.compute_axis_mapping))
    ours = losses(
        lambda t: LevanterLoader.from_cache(
            cache,
            mesh=t.device_mesh,
            Pos=Pos,
            batch_size=BATCH,
            axis_resources=t.compute_axis_mapping,
            eos_id=EOS,
        )  # fmt: skip
    )
    assert len(ours) == len(theirs) == steps
    np.testing.assert_array_equal(ours, theirs)


def test_data_config_reads_levanters_data_section(cache: str) -> None:
    from levanter.data.text.datasets import DatasetComponent, LmDataConfig

    root = cache.rsplit("/", 1)[0]
    levanter_data = LmDataConfig(
        tokenizer="passthrough", vocab_size=VOCAB, cache_dir=None,
        components={"web": DatasetComponent(cache_dir=root)},
        train_weights=[(0, {"web": 1.0}), (8, {"web": 1.0})], mixture_block_size=64,
    )  # fmt: skip
    config = data_config(levanter_data, seq_len=SEQ_LEN, batch_size=BATCH)
    assert config.sources["web"].store == cache and config.sources["web"].format == "levanter"
    assert [s.step for s in config.stages] == [0, 8]
    source = config.train_source()
    # Levanter's int64 ids read as int32 with no option given, as Levanter's batches hold them
    assert source.read(np.arange(3))["input_ids"].dtype == np.int32


@pytest.mark.timeout(900)
def test_the_levanter_guide_runs(tmp_path, monkeypatch) -> None:
    """docs/guides/levanter.md's blocks (its recipe: `train_lm` on a 2-process pod, fed by
    psdp), which tests/test_docs.py leaves to this venv."""
    from tests.test_docs import run_blocks

    monkeypatch.chdir(tmp_path)
    run_blocks("guides/levanter.md")


def test_train_loader_mixes_levanters_components(cache: str) -> None:
    """Two components, Levanter's default shuffle: psdp's `Mixture` of both, the same on every
    build (its seed), each row `SEQ_LEN` ids of the caches."""
    from types import SimpleNamespace

    from levanter.data.text.datasets import DatasetComponent, LmDataConfig

    from psdp.levanter import train_loader

    root = cache.rsplit("/", 1)[0]
    levanter_data = LmDataConfig(
        tokenizer="passthrough", vocab_size=VOCAB, cache_dir=None, mixture_block_size=64,
        components={"a": DatasetComponent(cache_dir=root), "b": DatasetComponent(cache_dir=root)},
        train_weights={"a": 3.0, "b": 1.0},
    )  # fmt: skip
    trainer = SimpleNamespace(
        device_mesh=mesh_of(("data",), (8,)), compute_axis_mapping=MAPPING,
        config=SimpleNamespace(train_batch_size=BATCH, batch_axis_name="batch"),
    )  # fmt: skip
    Pos = hax.Axis("position", SEQ_LEN)
    with train_loader(levanter_data, trainer, Pos, seed=3) as one:
        first = [np.asarray(b.tokens.array) for b in islice(one, 3)]
    with train_loader(levanter_data, trainer, Pos, seed=3) as two:
        again = [np.asarray(b.tokens.array) for b in islice(two, 3)]
    assert all(b.shape == (BATCH, SEQ_LEN) and b.max() < VOCAB for b in first)
    for got, want in zip(again, first, strict=True):
        np.testing.assert_array_equal(got, want)
    assert one.loader.source.names == ("a", "b")


def test_bad_input_names_the_fix(cache: str) -> None:
    from types import SimpleNamespace

    mesh = mesh_of(("data",), (8,))
    with pytest.raises(ValueError, match=r"rows hold 17 tokens but Pos has size 16"):
        LevanterLoader(
            psdp.TokenSequences(psdp.levanter.open_levanter_cache(cache), 16, targets=True),
            mesh=mesh, Pos=hax.Axis("position", 16), batch_size=BATCH,
        )  # fmt: skip
    with pytest.raises(TypeError, match=r"Pos must be Levanter's position axis"):
        LevanterLoader.from_cache(cache, mesh=mesh, Pos=16, batch_size=BATCH)
    padded = SimpleNamespace(cache_dir="c", flat_cache=False, pack="pad")
    levanter_data = SimpleNamespace(cache_dir=None, components={"web": padded})
    with pytest.raises(ValueError, match=r"has pack: 'pad'; psdp packs a component with pack: "):
        data_config(levanter_data, seq_len=SEQ_LEN)


@pytest.mark.slow  # an emulator in a process of its own
@pytest.mark.parametrize("emulator", ["S3Server", "GcsServer"])
def test_the_object_store_figures_levanter_cache_is_the_stores_documents_read_via_the_proxy(
    emulator: str,
) -> None:
    """Figure 9's Levanter rows: the cache it writes to S3 or GCS holds the psdp store's
    documents, in order, and Levanter reads its arrays (TensorStore) and its ledger (s3fs,
    gcsfs) through the figure's proxy, where the requests are counted."""
    from psdp.tools.benchmarks import object_store
    from psdp.tools.benchmarks import object_tokens_levanter as figure

    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 60_000, n).astype(np.uint16) for n in rng.integers(1, 50, 30)]
    server_class = getattr(object_store, emulator)
    resolve, hosts = socket.getaddrinfo, []  # every name looked up in this process

    def recording(host, *args, **kwargs):
        hosts.append(host)
        return resolve(host, *args, **kwargs)

    with (
        server_class() as server,
        object_store.FaultProxy(server.endpoint) as proxy,
        mock.patch("socket.getaddrinfo", recording),
    ):
        root = figure.write_remote_cache(psdp.DocumentStore.from_documents(docs), server)
        assert proxy.requests == {}  # written straight to the server
        proxy.fail("503", 1, where="shard_ledger.json")  # the ledger: its reads tried again
        with figure.endpoint(root, proxy.endpoint):
            cache = TreeCache.load(f"{root}/train", {"input_ids": np.zeros((0,), np.int64)})
            got = cache.get_batch_sync(list(range(len(docs))))
        assert proxy.faults["503"] > 0 and proxy.requests["GET"] > proxy.faults["503"]
    # nothing beyond this machine: not even the metadata server's name (Levanter's gs://
    # filesystem asks it for the VM's region, `endpoint` says there is none)
    assert hosts and set(hosts) <= {"127.0.0.1", "localhost"}, hosts
    assert [g["input_ids"].tolist() for g in got] == [d.tolist() for d in docs]
