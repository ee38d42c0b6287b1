"""`psdp.levanter.data_config` on Levanter data sections given as plain objects (Levanter is not
installed in this venv; tests/test_levanter.py checks against Levanter itself): a component's
``pack`` becomes a packed view with a cap on documents per row whose rows are Levanter's packed
rows (its rule, tests/packing_oracle.py), and ``shuffle: false`` a mixture read in store order,
on every device shard; bad ``pack`` values name the fix."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from psdp.levanter import LEVANTER_MAX_SEGMENTS, data_config
from tests.batch_checks import assert_batch_exact
from tests.levanter_cache import write_levanter_cache
from tests.meshes import mesh_of
from tests.packing_oracle import levanter_pack_ranges

SEQ_LEN, BATCH, EOS = 16, 8, 1
#: document lengths (ids then EOS), a few longer than SEQ_LEN (Levanter cuts them to SEQ_LEN)
LENGTHS = [5, 3, 17, 2, 6, 4, 8, 1, 9, 25, 3, 7, 2, 2, 2, 2, 11, 4] * 3


def _documents() -> list[np.ndarray]:
    """Document ``d``: ids ``d * 100 + 2 ...`` (never EOS), then EOS; int64 as Levanter's."""
    return [
        np.append(d * 100 + 2 + np.arange(n - 1), EOS).astype(np.int64)
        for d, n in enumerate(LENGTHS)
    ]


def _component(root, pack=None) -> SimpleNamespace:
    return SimpleNamespace(cache_dir=str(root), flat_cache=False, pack=pack, format=None, tags=None)


def _data(components, shuffle=False) -> SimpleNamespace:
    return SimpleNamespace(
        cache_dir=None, mixture_block_size=BATCH, shuffle=shuffle, components=components,
        train_weights=None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("levanter") / "web"
    write_levanter_cache(root / "train", [{"input_ids": d} for d in _documents()])
    return str(root)


def _levanter_rows(cap: int) -> np.ndarray:
    """Levanter's packed rows of the cache: each pack's documents side by side, cut to SEQ_LEN
    (a long document alone), zeros after (``GreedyPrepackedDataset(pad_with_zeros=True)``)."""
    docs = _documents()
    rows = []
    for pack in levanter_pack_ranges(LENGTHS, SEQ_LEN, cap):
        tokens = np.concatenate([docs[d] for d in pack])[:SEQ_LEN]
        rows.append(np.pad(tokens, (0, SEQ_LEN - len(tokens))))
    return np.array(rows, np.int32)


@pytest.mark.parametrize(("pack", "cap"), [(True, LEVANTER_MAX_SEGMENTS), (3, 3), (1, 1)])
def test_a_packed_component_reads_levanters_packed_rows_in_store_order_on_every_shard(
    cache, pack, cap
):
    config = data_config(_data({"web": _component(cache, pack)}), seq_len=SEQ_LEN,
                         batch_size=BATCH)  # fmt: skip
    view = config.view
    assert (view.packing, view.long_documents, view.max_segments) == ("greedy", "truncate", cap)
    assert config.mixture.shuffle is False
    rows = _levanter_rows(cap)
    source = config.train_source()
    np.testing.assert_array_equal(source.sources["web"].read(np.arange(len(rows)))["input_ids"],
                                  rows)  # fmt: skip
    with config.build(mesh_of(("data", "model"), (4, 2))) as loader:
        for step in range(2 * len(rows) // BATCH + 1):  # two epochs and more
            ids = (step * BATCH + np.arange(BATCH)) % len(rows)
            got = {"input_ids": loader.batch_at(step)["input_ids"]}
            assert_batch_exact(got, {"input_ids": rows[ids]})


def test_shuffle_maps_to_the_mixtures_shuffle(cache):
    for shuffle, want in [(False, False), (True, True), (SimpleNamespace(io_block_size=256), True)]:
        config = data_config(_data({"web": _component(cache)}, shuffle), seq_len=SEQ_LEN)
        assert config.mixture.shuffle is want and config.view.packing is None


@pytest.mark.parametrize(
    ("packs", "words"),
    [
        (
            {"web": "pad"},
            "component 'web' has pack: 'pad'; psdp packs a component with pack: "
            "true (64 documents a row, Levanter's default) or pack: N",
        ),
        ({"web": 0}, "component 'web' has pack: 0; psdp packs"),
        (
            {"web": True, "code": None},
            "components pack differently: web (64 documents a row), "
            "code (no pack); psdp makes every source's rows with one view (DataConfig.view), so "
            "give every component the same pack",
        ),
    ],  # fmt: skip
    ids=["pad", "zero", "mixed"],
)
def test_a_pack_psdp_cannot_make_names_the_fix(cache, packs, words):
    components = {name: _component(cache, pack) for name, pack in packs.items()}
    with pytest.raises(ValueError, match="Levanter's data comp") as error:
        data_config(_data(components), seq_len=SEQ_LEN)
    assert words in str(error.value)
