"""The four option groups: what each normalises, every bad value's exception and message, the
combinations refused up front, and `LoaderOptions.create`'s routing of flat keywords."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from psdp import (
    DataLoader,
    LoaderOptions,
    OrderOptions,
    OutputOptions,
    ReadingOptions,
    ShardingOptions,
)
from psdp._plan.options import GROUPS
from psdp._plan.spec_text import parse_spec, spec_text
from tests.batch_checks import assert_shards_exact, token_table

Sharding = ShardingOptions  # the tables below are wide


# ----------------------------------------------------------------------- good values, normalised
@pytest.mark.parametrize(
    ("group", "given", "field", "held"),
    [
        (OrderOptions, {"global_batch_size": np.int64(8)}, "global_batch_size", 8),
        (OrderOptions, {"seed": np.uint64(2**64 - 1)}, "seed", 2**64 - 1),
        (OrderOptions, {"shuffle": np.bool_(False)}, "shuffle", False),
        # strategies stay names (spaces trimmed); spec texts become specs
        (Sharding, {"batch_spec": " full "}, "batch_spec", "full"),
        (Sharding, {"batch_spec": "(replica,data),context"}, "batch_spec", P(("replica", "data"), "context")),
        (Sharding, {"batch_spec": "data+fsdp,-"}, "batch_spec", P(("data", "fsdp"), None)),
        (Sharding, {"batch_spec": "(batch)"}, "batch_spec", P("batch")),  # a mesh axis named batch
        (Sharding, {"batch_spec": "replica"}, "batch_spec", P("replica")),  # an axis, not a typo
        (Sharding, {"batch_spec": P()}, "batch_spec", "replicated"),  # one value per meaning
        (Sharding, {"batch_spec": P("data")}, "batch_spec", P("data")),
        (Sharding, {"batch_spec": {"x": "data,model", "y": P("data")}}, "batch_spec",
         {"x": P("data", "model"), "y": P("data")}),
        # sequences become tuples, one name a 1-tuple
        (Sharding, {"batch_spec": {}}, "batch_spec", {}),  # no leaf overridden: all "batch"
        (Sharding, {"batch_axes": "data"}, "batch_axes", ("data",)),
        (Sharding, {"batch_axes": ["replica", "data"]}, "batch_axes", ("replica", "data")),
        (Sharding, {"named_axes": ["batch", "pos"], "axis_mapping": {"batch": ["data"], "pos": None}},
         "axis_mapping", {"batch": ("data",), "pos": None}),
        (Sharding, {"named_axes": {"x": ["batch"]}, "axis_mapping": {"batch": "data"}},
         "named_axes", {"x": ("batch",)}),
        (Sharding, {"halo": np.int32(2)}, "halo", 2),
        (Sharding, {"halo": {"x": np.int64(1)}}, "halo", {"x": 1}),
        (Sharding, {"feeding_processes": np.array([1, 0])}, "feeding_processes", (1, 0)),
        (OutputOptions, {"pad_value": np.float32(-1.5)}, "pad_value", -1.5),
        (OutputOptions, {"mask_key": None}, "mask_key", None),
        (OutputOptions, {"dtypes": {"x": np.int32, "y": "float16"}}, "dtypes", {"x": np.int32, "y": "float16"}),
        (OutputOptions, {"dtypes": {}}, "dtypes", {}),
        (ReadingOptions, {"read_timeout_s": 30}, "read_timeout_s", 30.0),
        (ReadingOptions, {"stall_warning_s": None}, "stall_warning_s", None),
        (ReadingOptions, {"prefetch": np.int8(3)}, "prefetch", 3),
        (ReadingOptions, {"read_attempts": np.int64(1)}, "read_attempts", 1),
        (ReadingOptions, {"retry_backoff_s": None}, "retry_backoff_s", None),
        (ReadingOptions, {"first_read_timeout_s": 600}, "first_read_timeout_s", 600.0),
    ],
)  # fmt: skip
def test_good_values_are_normalised(group, given, field, held):
    made = group(**given)
    value = getattr(made, field)
    assert value == held and type(value) is type(held)
    assert group(**{f.name: getattr(made, f.name) for f in dataclasses.fields(group)}) == made


def test_every_group_has_its_defaults_and_prints_them():
    assert repr(OrderOptions()) == (
        "OrderOptions(global_batch_size=None, shuffle=None, seed=0, drop_last=False, "
        "skip_steps=(), skip_offsets=(), start_at=None, io_block=None, window_blocks=16, epochs=None)"
    )
    assert repr(ReadingOptions()) == (
        "ReadingOptions(prefetch=2, read_threads=None, read_timeout_s=None, stall_warning_s=1.0, "
        "read_attempts=4, retry_backoff_s=0.5, first_read_timeout_s=None)"
    )
    assert repr(OutputOptions()) == "OutputOptions(pad_value=0, mask_key='mask', dtypes=None)"
    assert repr(ShardingOptions()) == (
        "ShardingOptions(batch_spec=None, batch_axes=None, named_axes=None, axis_mapping=None, "
        "halo=0, feeding_processes=None)"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        OrderOptions().seed = 1  # type: ignore[misc]


# ------------------------------------------------------------------------------- bad values
# (group, kwargs, exception, fragments: the field, the value, the rule, the fix)
BAD = [
    # ----- order
    (OrderOptions, {"global_batch_size": 0}, ValueError,
     ["OrderOptions.global_batch_size must be >= 1, got 0", "global_batch_size=256"]),
    (OrderOptions, {"global_batch_size": 8.0}, TypeError,
     ["OrderOptions.global_batch_size must be an int or a schedule", "got 8.0 of type float",
      "global_batch_size=256"]),
    (OrderOptions, {"global_batch_size": []}, ValueError, ["empty schedule", "[(0, 256), (1000, 512)]"]),
    (OrderOptions, {"global_batch_size": [(10, 64)]}, ValueError,
     ["stage 0 (10, 64) starts at step 10", "must start at step 0"]),
    (OrderOptions, {"global_batch_size": [(0, 64), (0, 128)]}, ValueError,
     ["stage 1 (0, 128) starts at step 0, not after stage 0", "increasing start step"]),
    (OrderOptions, {"global_batch_size": [(0, 64), (100, 0)]}, ValueError,
     ["stage 1 (100, 0): rows must be >= 1, got 0"]),
    (OrderOptions, {"global_batch_size": [(0, 64, 2)]}, TypeError, ["pairs of ints; (0, 64, 2) is not one"]),
    (OrderOptions, {"global_batch_size": "64"}, TypeError, ["got '64' of type str"]),
    (OrderOptions, {"skip_steps": [(5, 5)]}, ValueError,
     ["OrderOptions.skip_steps range (5, 5) must have 0 <= first < end", "skip_steps=[(12000, 12500)]"]),
    (OrderOptions, {"skip_steps": [(10, 20), (15, 30)]}, ValueError,
     ["ranges (10, 20) and (15, 30) overlap", "merge them into (10, 30)"]),
    (OrderOptions, {"skip_offsets": [(-1, 5)]}, ValueError, ["OrderOptions.skip_offsets range (-1, 5)"]),
    (OrderOptions, {"skip_offsets": 5}, TypeError, ["a list of (first, end) ranges of sample offsets"]),
    (OrderOptions, {"start_at": (3, -1)}, ValueError, ["OrderOptions.start_at must be >= 0", "(3, -1)"]),
    (OrderOptions, {"start_at": 3}, TypeError, ["OrderOptions.start_at must be a (step, sample offset) pair"]),
    (OrderOptions, {"io_block": 0}, ValueError, ["OrderOptions.io_block must be >= 1, got 0", "io_block=32"]),
    (OrderOptions, {"io_block": 8, "shuffle": False}, ValueError,
     ["io_block=8 asks for a block shuffle, but shuffle=False", "drop io_block, or set shuffle=True"]),
    (OrderOptions, {"window_blocks": 0}, ValueError, ["OrderOptions.window_blocks must be >= 1, got 0"]),
    (OrderOptions, {"global_batch_size": True}, TypeError, ["got True of type bool"]),
    (OrderOptions, {"seed": "7"}, TypeError, ["OrderOptions.seed must be an int, got '7'", "seed=0"]),
    (OrderOptions, {"seed": -1}, ValueError,
     ["OrderOptions.seed must be in [0, 2**64 - 1]", "got -1", "seed % 2**64"]),
    (OrderOptions, {"shuffle": "yes"}, TypeError,
     ["OrderOptions.shuffle must be True or False, got 'yes' of type str", "shuffle=True"]),
    (OrderOptions, {"drop_last": 1}, TypeError, ["OrderOptions.drop_last must be True or False, got 1"]),
    # ----- sharding: specs
    (Sharding, {"batch_spec": 3}, TypeError,
     ["ShardingOptions.batch_spec must be a strategy ('batch', 'full', 'replicated'), a spec text or a PartitionSpec",
      "got 3 of type int", "batch_spec='(replica,data),context'"]),
    (Sharding, {"batch_spec": ("data", "model")}, TypeError, ["got ('data', 'model') of type tuple", "PartitionSpec"]),
    (Sharding, {"batch_spec": "(data,model"}, ValueError,
     ["ShardingOptions.batch_spec '(data,model'", "neither a strategy", "not closed"]),
    (Sharding, {"batch_spec": "data-parallel"}, ValueError,
     ["'data-parallel'", "('batch', 'full', 'replicated')", "'(replica,data),context'"]),
    (Sharding, {"batch_spec": "fully"}, ValueError,
     ["did you mean 'full'?", "got 'fully'", "write '(fully)' to mean the mesh axis"]),
    (Sharding, {"batch_spec": {"x": "da ta"}}, ValueError, ["ShardingOptions.batch_spec['x'] 'da ta'"]),
    (Sharding, {"batch_spec": {"x": None}}, TypeError, ["ShardingOptions.batch_spec['x']", "got None"]),
    (Sharding, {"batch_spec": {1: "batch"}}, TypeError, ["ShardingOptions.batch_spec key", "got 1 of type int"]),
    # ----- sharding: axes and names
    (Sharding, {"batch_axes": 3}, TypeError, ["ShardingOptions.batch_axes must be a name or a sequence of names", "got 3"]),
    (Sharding, {"batch_axes": ()}, ValueError, ["ShardingOptions.batch_axes must name at least one axis", "got ()"]),
    (Sharding, {"batch_axes": ("data", "data")}, ValueError, ["each once", "('data', 'data')"]),
    (Sharding, {"named_axes": "batch", "axis_mapping": {}}, TypeError,
     ["ShardingOptions.named_axes must be a sequence of axis names", "got 'batch' of type str",
      "named_axes={'tokens': ('batch', 'position')}"]),
    (Sharding, {"named_axes": {"x": []}, "axis_mapping": {}}, ValueError,
     ["ShardingOptions.named_axes['x'] must name every dimension", "got []"]),
    (Sharding, {"named_axes": {"x": [1]}, "axis_mapping": {}}, TypeError, ["ShardingOptions.named_axes['x']", "got [1]"]),
    (Sharding, {"named_axes": ("b",), "axis_mapping": ["data"]}, TypeError,
     ["ShardingOptions.axis_mapping must be a dict axis name -> mesh axis or axes", "got ['data']"]),
    (Sharding, {"named_axes": ("b",), "axis_mapping": {"b": 3}}, TypeError, ["ShardingOptions.axis_mapping['b']", "got 3"]),
    # ----- sharding: halo and feeding
    (Sharding, {"halo": -1}, ValueError, ["ShardingOptions.halo must be >= 0, got -1", "halo=128"]),
    (Sharding, {"halo": 1.5}, TypeError, ["ShardingOptions.halo must be an int >= 0", "got 1.5 of type float"]),
    (Sharding, {"halo": {"x": -2}}, ValueError, ["ShardingOptions.halo['x'] must be >= 0, got -2", "halo={'tokens': 128}"]),
    (Sharding, {"feeding_processes": []}, ValueError,
     ["ShardingOptions.feeding_processes must name at least one process", "got []", "feeding_processes=(0, 1)"]),
    (Sharding, {"feeding_processes": [0, -1]}, ValueError, ["each >= 0, got [0, -1]"]),
    (Sharding, {"feeding_processes": 0}, TypeError, ["a sequence of process indices, got 0 of type int"]),
    (Sharding, {"feeding_processes": [0.0]}, TypeError, ["got [0.0] of type list"]),
    # ----- output
    (OutputOptions, {"pad_value": "0"}, TypeError,
     ["OutputOptions.pad_value must be a number (it fills padding rows and halo columns), got '0' of type str", "pad_value=0"]),
    (OutputOptions, {"pad_value": True}, TypeError, ["OutputOptions.pad_value", "got True of type bool"]),
    (OutputOptions, {"mask_key": ""}, ValueError, ["OutputOptions.mask_key must be a non-empty leaf name or None", "mask_key='mask'"]),
    (OutputOptions, {"mask_key": 3}, TypeError, ["OutputOptions.mask_key must be a leaf name or None, got 3"]),
    (OutputOptions, {"dtypes": "int33"}, TypeError,
     ["OutputOptions.dtypes must be a numpy dtype or dtype name, got 'int33' of type str", "dtypes=np.int32"]),
    (OutputOptions, {"dtypes": {"x": None}}, TypeError, ["OutputOptions.dtypes['x']", "got None"]),  # np.dtype(None) is float64
    # ----- reading
    (ReadingOptions, {"prefetch": 0}, ValueError, ["ReadingOptions.prefetch must be >= 1, got 0", "prefetch=2"]),
    (ReadingOptions, {"read_threads": "2"}, TypeError, ["ReadingOptions.read_threads must be an int, got '2'"]),
    (ReadingOptions, {"read_timeout_s": 0}, ValueError,
     ["ReadingOptions.read_timeout_s must be > 0 or None (a number of seconds, or no limit), got 0", "read_timeout_s=60"]),
    (ReadingOptions, {"read_timeout_s": float("nan")}, ValueError, ["read_timeout_s must be > 0 or None", "got nan"]),
    (ReadingOptions, {"read_timeout_s": True}, TypeError, ["ReadingOptions.read_timeout_s", "got True of type bool"]),
    (ReadingOptions, {"stall_warning_s": -1}, ValueError,
     ["ReadingOptions.stall_warning_s must be a positive number of seconds or None (no warning), got -1", "stall_warning_s=1"]),
    (ReadingOptions, {"stall_warning_s": "1"}, TypeError, ["ReadingOptions.stall_warning_s", "got '1' of type str"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("group", "kwargs", "error", "fragments"),
    [pytest.param(*row, id=f"{row[0].__name__}-{row[1]}") for row in BAD],
)
def test_bad_values_name_field_value_rule_and_fix(group, kwargs, error, fragments):
    with pytest.raises(error) as info:
        group(**kwargs)
    assert type(info.value) is error
    missing = [f for f in fragments if f not in str(info.value)]
    assert not missing, f"message lacks {missing}: {info.value}"


# ------------------------------------------------------------------------------- conflicts
CONFLICTS = [
    # batch_axes reach only the "batch" strategy: with a spec or another strategy they are ignored
    ({"batch_spec": P("data", "model"), "batch_axes": "data"},
     ["ShardingOptions.batch_axes ('data',) would be ignored", "P('data', 'model')", "drop batch_axes"]),
    ({"batch_spec": "(replica,data)", "batch_axes": ["replica"]}, ["would be ignored"]),
    ({"batch_spec": "full", "batch_axes": "data"}, ["would be ignored", "'full'"]),
    ({"batch_spec": "replicated", "batch_axes": "data"}, ["would be ignored", "'replicated'"]),
    # named_axes and axis_mapping go together
    ({"named_axes": {"x": ["batch"]}}, ["named_axes needs an axis_mapping", '{"batch": ("replica", "data")']),
    ({"axis_mapping": {"batch": "data"}}, ["axis_mapping {'batch': 'data'} is given without named_axes", "drop axis_mapping"]),
    # a leaf takes its spec from batch_spec or from named_axes, not both
    ({"named_axes": {"x": ["batch"], "y": ["batch"]}, "axis_mapping": {"batch": "data"},
      "batch_spec": {"x": "full", "y": "batch", "z": "batch"}},
     ["leaf 'x', leaf 'y' has both a batch_spec entry", "give one of them"]),
    ({"named_axes": ["batch"], "axis_mapping": {"batch": "data"}, "batch_spec": "full"},
     ["the array source has both a batch_spec entry"]),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "fragments"), CONFLICTS)
def test_conflicting_combinations_are_refused_with_the_fix(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        ShardingOptions(**kwargs)
    missing = [f for f in fragments if f not in str(info.value)]
    assert not missing, f"message lacks {missing}: {info.value}"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_spec": "batch", "batch_axes": "data"},
        {"batch_spec": {"x": P("data", "model")}, "batch_axes": "data"},  # other leaves: batch
        {"named_axes": {"x": ["b"]}, "axis_mapping": {"b": "data"}, "batch_spec": {"y": "full"}},
        {"named_axes": {"x": ["b"]}, "axis_mapping": {"b": "data"}, "batch_spec": "full"},
    ],
)
def test_combinations_that_mean_something_are_kept(kwargs):
    assert ShardingOptions(**kwargs).batch_spec is not None


def test_batch_axes_reach_the_leaves_a_dict_spec_leaves_out():
    """Why a dict spec with batch_axes is no conflict: its missing leaves take the batch strategy."""
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("replica", "data", "model"))
    data = {"x": token_table(16, width=4), "y": token_table(16)}
    sharding = ShardingOptions(batch_spec={"x": P("data", "model")}, batch_axes="replica")
    with DataLoader(data, mesh=mesh, global_batch_size=8, shuffle=False, sharding=sharding) as ld:
        batch = ld.batch_at(1)
    assert batch["y"].sharding.spec == P("replica") and batch["x"].sharding.spec == P(
        "data", "model"
    )
    assert_shards_exact(batch["y"], data["y"][8:16])
    assert_shards_exact(batch["x"], data["x"][8:16])


# ----------------------------------------------------------------------------- create()
def test_create_routes_each_flat_keyword_to_its_group():
    options = LoaderOptions.create(
        global_batch_size=8, batch_spec="data,model", pad_value=-1, read_threads=2, seed=5
    )
    assert options.order == OrderOptions(global_batch_size=8, seed=5)
    assert options.sharding == ShardingOptions(batch_spec=P("data", "model"))
    assert options.output == OutputOptions(pad_value=-1)
    assert options.reading == ReadingOptions(read_threads=2)
    reading = ReadingOptions(prefetch=7)
    assert LoaderOptions.create(reading=reading, global_batch_size=8).reading is reading


def test_the_groups_fields_are_disjoint():
    names = [f.name for kind in GROUPS.values() for f in dataclasses.fields(kind)]
    assert len(names) == len(set(names)) == 26


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"global_batch_size": 8, "batch_size": 8},
         ["unknown loader option 'batch_size' (did you mean 'global_batch_size'?)", "read_threads, read_timeout_s"]),
        ({"global_batch_size": 8, "partition": "batch"}, ["'partition' (did you mean 'batch_spec'?)"]),
        ({"global_batch_size": 8, "workers": 2}, ["'workers' (did you mean 'read_threads'?)"]),
        ({"global_batch_size": 8, "num_thread": 2}, ["'num_thread' (did you mean 'read_threads'?)"]),
        ({"global_batch_size": 8, "zzz": 1, "qqq": 2}, ["unknown loader option 'qqq', 'zzz';", "the options are"]),
        ({"order": OrderOptions(global_batch_size=8), "seed": 3},
         ["seed given as keywords and in order=OrderOptions(...)", "dataclasses.replace(order, seed=...)"]),
        ({"global_batch_size": 8, "reading": {"prefetch": 2}},
         ["reading must be a ReadingOptions, got {'prefetch': 2} of type dict", "reading=ReadingOptions(...)"]),
        ({"global_batch_size": 8, "order": ReadingOptions()}, ["order must be a OrderOptions"]),
        ({}, ["the loader needs global_batch_size", "order=OrderOptions(global_batch_size=256)",
              "order.global_batch_size: 256"]),
        ({"order": OrderOptions(seed=3)}, ["the loader needs global_batch_size"]),
    ],
)  # fmt: skip
def test_create_errors_are_type_errors_naming_the_fix(kwargs, fragments):
    with pytest.raises(TypeError) as info:
        LoaderOptions.create(**kwargs)
    missing = [f for f in fragments if f not in str(info.value)]
    assert not missing, f"message lacks {missing}: {info.value}"


def test_loader_options_checks_its_groups_too():
    with pytest.raises(TypeError, match=r"LoaderOptions.output must be a OutputOptions, got None"):
        LoaderOptions(OrderOptions(global_batch_size=8), output=None)  # type: ignore[arg-type]


# ------------------------------------------------------------- flat keywords == the groups
NAMES = st.sampled_from(["replica", "data", "model", "context"])
SPEC_ENTRY = st.one_of(
    st.none(), NAMES, st.lists(NAMES, min_size=2, max_size=3, unique=True).map(tuple)
)
SPECS = st.lists(SPEC_ENTRY, min_size=1, max_size=3).map(lambda entries: P(*entries))
SPEC_VALUES = st.one_of(
    st.sampled_from(["batch", "full", "replicated"]), SPECS, SPECS.map(spec_text)
)
AXES = st.one_of(NAMES, st.lists(NAMES, min_size=1, max_size=3, unique=True))


@st.composite
def sharding_keywords(draw):
    kwargs = {}
    spec = draw(
        st.one_of(
            st.none(),
            SPEC_VALUES,
            st.dictionaries(st.sampled_from(["x", "y"]), SPEC_VALUES, min_size=1),
        )
    )
    if spec is not None:
        kwargs["batch_spec"] = spec
    if draw(st.booleans()) and ShardingOptions(batch_spec=spec).uses_batch_axes():
        kwargs["batch_axes"] = draw(AXES)
    if draw(st.booleans()) and not isinstance(spec, str | P):
        named = draw(st.sampled_from(["z", "w"]))  # never a leaf of the dict spec
        kwargs["named_axes"] = {
            named: draw(st.lists(st.sampled_from(["b", "p"]), min_size=1, max_size=2))
        }
        kwargs["axis_mapping"] = draw(
            st.dictionaries(st.sampled_from(["b", "p"]), st.one_of(st.none(), AXES))
        )
    kwargs["halo"] = draw(
        st.one_of(
            st.integers(0, 4), st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 4))
        )
    )
    if draw(st.booleans()):
        kwargs["feeding_processes"] = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4))
    return kwargs


FLAT = st.fixed_dictionaries(
    {"global_batch_size": st.integers(1, 1024)},
    optional={
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**64 - 1),
        "drop_last": st.booleans(),
        "pad_value": st.one_of(st.integers(-5, 5), st.floats(allow_nan=False)),
        "mask_key": st.one_of(st.none(), st.sampled_from(["mask", "valid"])),
        "dtypes": st.one_of(st.sampled_from(["int32", np.float16]), st.just({"x": "int8"})),
        "prefetch": st.integers(1, 8),
        "read_threads": st.integers(1, 8),
        "read_timeout_s": st.one_of(st.none(), st.floats(0.1, 1e3), st.integers(1, 100)),
        "stall_warning_s": st.one_of(st.none(), st.floats(0.01, 10)),
    },
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(FLAT, sharding_keywords())
def test_flat_keywords_give_the_same_options_as_the_groups(flat, sharding):
    flat = flat | sharding
    split = {
        name: {f.name: flat[f.name] for f in dataclasses.fields(kind) if f.name in flat}
        for name, kind in GROUPS.items()
    }
    groups = {name: GROUPS[name](**split[name]) for name in GROUPS}
    options = LoaderOptions.create(**flat)
    assert options == LoaderOptions(**groups) == LoaderOptions.create(**groups)
    rest = {k: v for k, v in flat.items() if k not in split["order"]}
    assert LoaderOptions.create(order=groups["order"], **rest) == options
    for name in GROUPS:  # a group made of a group's normalised fields is that group
        group = getattr(options, name)
        assert type(group)(**vars(group)) == group


@settings(max_examples=200, deadline=None)
@given(SPECS)
def test_spec_text_reads_back_as_the_same_spec(spec):
    assert P(*parse_spec(spec_text(spec))) == spec
    assert ShardingOptions(batch_spec=spec_text(spec)).batch_spec == spec


# ---------------------------------------------------------------- the loader takes either form
def test_a_loader_from_groups_and_one_from_flat_keywords_deliver_the_same_exact_rows():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    rows = token_table(40, width=4)
    flat = DataLoader({"t": rows}, mesh=mesh, global_batch_size=8, shuffle=False,
                      batch_spec={"t": "data,model"}, prefetch=3)  # fmt: skip
    grouped = DataLoader(
        {"t": rows},
        mesh=mesh,
        order=OrderOptions(global_batch_size=8, shuffle=False),
        sharding=ShardingOptions(batch_spec={"t": "data,model"}),
        reading=ReadingOptions(prefetch=3),
    )
    with flat, grouped:
        for step in range(6):  # through the end of epoch 0 (40 rows = 5 steps) into epoch 1
            want = rows[(step % 5) * 8 : (step % 5 + 1) * 8]
            for loader in (flat, grouped):
                batch = loader.batch_at(step)
                assert batch["t"].sharding.spec == P("data", "model")
                assert_shards_exact(batch["t"], want)
