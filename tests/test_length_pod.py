"""Issue 38's "Exact" goal on real pods: a `DataConfig` of three length stages (8 -> 32 -> 64
tokens, a mixture of a store and its long documents, ``min_length``) read by the trainer guide's
resumable loop, every host SIGKILLed while its loader reads ahead once inside each stage, and
resumed each time on another host count and batch size from the state process 0 saved. The
delivered batches (every shard of every leaf, on every host) are, batch for batch, those of an
uninterrupted single-process run, and tests/length_oracle.py's rows; every token of each source
is delivered once in each epoch, across the stages (tests/pod_targets_length.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from psdp.prepare import build_indexes
from psdp.sources import LengthBounds
from psdp.sources.documents.writer import write_documents
from psdp.tools.pod import PodError, run_pod
from tests import pod_targets_length as target

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

#: Each run: (hosts, devices per host, mesh, new batch size, killed at step, its first step and
#: offset). Saves come after every second step, so each resume starts at the last even step.
RUNS = [
    # the config's own batches of 16 in stage 0 (offsets 0-63); killed at step 3 (offset 48)
    (2, 2, [4], None, 3, 0, 0),
    # from step 2 (offset 32): batches of 8, stage 1 at step 6; killed at 13 (offset 120)
    (4, 2, [4, 2], 8, 13, 2, 32),
    # from step 12 (offset 112), a host holding devices of two data rows (data=2 x model=3):
    # batches of 4, stage 2 at step 16; killed at 17 (offset 132)
    (3, 2, [2, 3], 4, 17, 12, 112),
]
#: the last resume, in this process (one host, data=8), from step 16 (offset 128) to 28
LAST = (None, None, [8], 8, None, 16, 128)
END = 28
#: the uninterrupted run's batch sizes: each run's where it is kept (up to the next resume)
SCHEDULE = [[0, 16], [2, 8], [12, 4], [16, 8]]
END_OFFSET = 128 + (END - 16) * 8
#: the run read twice, by one pod: concatenate-then-split and packed (``view.packing: greedy``)
VIEWS = ["tokens", "packed"]


def records(run_dir: Path, record: str) -> dict[int, dict[int, dict]]:
    """``{process: {step: {leaf: {box: values}}}}`` of one run."""
    out: dict[int, dict[int, dict]] = {}
    for path in sorted(run_dir.glob(f"{record}.p*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        out[int(path.name.split(".p")[1].split(".")[0])] = {e["step"]: e["shards"] for e in lines}
    return out


def slices(box: str) -> tuple[slice, ...]:
    return tuple(slice(*map(int, part.split(":"))) for part in box.split(","))


def expected(table: dict[str, np.ndarray], offset: int, batch: int, width: int) -> dict:
    """The global batch of ``batch`` rows from sample ``offset``: the oracle's rows."""
    out = {k: v[offset : offset + batch, :width] for k, v in table.items()}
    return out | {"mask": np.ones(batch, bool)}


def assert_every_shard(run: dict, table, first_step: int, first_offset: int, batch: int,
                       packed: bool) -> dict[int, dict[str, np.ndarray]]:  # fmt: skip
    """Every shard of every host equals the oracle's rows at the step's offset, and the
    hosts' shards cover each leaf; the steps' global batches, assembled from the shards."""
    steps = sorted({s for by_step in run.values() for s in by_step})
    assert steps == list(range(first_step, steps[-1] + 1))
    assembled = {}
    for step in steps:
        offset = first_offset + (step - first_step) * batch
        width = target.seq_len(offset) + (not packed)
        want = expected(table, offset, batch, width)
        got = {k: np.zeros(v.shape, v.dtype) for k, v in want.items()}
        covered = {k: np.zeros(v.shape, bool) for k, v in want.items()}
        for process, by_step in run.items():
            assert step in by_step, (process, step)  # every host recorded every step
            assert sorted(by_step[step]) == sorted(want), (process, step)
            for leaf, boxes in by_step[step].items():
                for box, values in boxes.items():
                    values, where = np.asarray(values), slices(box)
                    assert np.array_equal(values, want[leaf][where]), (process, step, leaf, box)
                    got[leaf][where], covered[leaf][where] = values, True
        assert all(c.all() for c in covered.values()), step
        assembled[step] = got
    return assembled


def assert_once_per_epoch(rows, lanes, epochs, tokens: list[np.ndarray]) -> None:
    """Each source's delivered tokens (the rows' first ``seq_len``, the shifted target left out;
    packed, the rows' pieces), tagged with the oracle's epochs: no token of the store's stream
    twice in an epoch, every epoch that each lane has left delivered whole (one at least, read
    by rows of two lengths or more), nothing else."""
    stream = target.streams()
    by_epoch: dict[tuple[int, int], Counter] = {}
    lengths: dict[tuple[int, int], set[int]] = {}  # the seq_lens that read each epoch
    reached: dict[tuple[int, int], int] = {}  # (source, lane): the last epoch it read
    for row, lane, tagged, delivered in zip(rows, lanes, epochs, tokens, strict=True):
        source = row[0]
        for epoch, token in zip(tagged, delivered, strict=True):
            by_epoch.setdefault((source, epoch), Counter())[int(token)] += 1
            lengths.setdefault((source, epoch), set()).add(row[-1])
        reached[(source, lane)] = max(reached.get((source, lane), 0), *tagged)
    for s, name in enumerate(target.NAMES):
        whole = Counter(stream[name]["input_ids"].tolist())
        left = min(reached[(s, lane)] for lane in range(target.LANES))
        assert left >= 1, name  # every lane went past the source's first epoch
        assert any(len(lengths[(s, e)]) > 1 for e in range(left)), name  # across stages
        for epoch in sorted(e for source, e in by_epoch if source == s):
            got = by_epoch[(s, epoch)]
            assert not got - whole, (name, epoch, got - whole)  # nothing twice, nothing foreign
            if epoch < left:
                assert got == whole, (name, epoch, whole - got)  # nothing skipped


@pytest.fixture(scope="module")
def killed_three_times(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The run's directory after the three killed pods, and the two views' configs (one pod
    runs both, so the pods are started once)."""
    root = tmp_path_factory.mktemp("length_pod")
    store = str(write_documents(root / "store", [{"input_ids": d} for d in target.documents()],
                                progress=False))  # fmt: skip
    build_indexes(store, lengths=[LengthBounds(min_length=target.MIN_LENGTH)], progress=False)
    configs = {view: target.config_text(store, view == "packed") for view in VIEWS}
    run_dir = root / "run"
    run_dir.mkdir()
    for k, (hosts, devices, mesh, batch, kill_at, _, _) in enumerate(RUNS):
        args = {"run_dir": str(run_dir), "configs": configs, "batch": batch, "mesh_shape": mesh,
                "steps": END, "kill_at": kill_at, "record": f"run{k}"}  # fmt: skip
        with pytest.raises(PodError) as killed:
            run_pod(target.train, num_processes=hosts, devices_per_process=devices, args=args,
                    timeout_s=240)  # fmt: skip
        assert "killed by signal SIGKILL" in killed.value.reason, killed.value
        for p in range(hosts):  # each loader had read a step ahead when its host was killed
            ahead = json.loads((run_dir / f"run{k}.p{p}.killed").read_text())
            assert sorted(ahead) == sorted(VIEWS) and min(ahead.values()) >= 1, (k, p, ahead)
    *_, mesh, batch, _, first, _ = LAST
    result = target.train(str(run_dir), configs, batch, mesh, END, None, "last")
    assert result == {"process": 0, "first_step": first}
    return run_dir, configs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("view", VIEWS)
def test_three_length_stages_killed_in_each_and_resumed_on_other_hosts_are_exact(
    killed_three_times, mesh_2d, view
):
    """Every host's every shard of the three killed runs and the last resume is the oracle's;
    the steps each run kept (up to the state it left) are an uninterrupted run's, batch for
    batch; every token once per epoch across the stages."""
    run_dir, configs = killed_three_times
    packed = view == "packed"
    table, rows, lanes = target.oracle_rows(END_OFFSET, packed)
    kept: dict[int, dict[str, np.ndarray]] = {}
    for k, (hosts, _, _, batch, kill_at, first, offset) in enumerate([*RUNS, LAST]):
        run = records(run_dir, f"run{k}-{view}" if k < len(RUNS) else f"last-{view}")
        assert sorted(run) == list(range(hosts or 1))
        assembled = assert_every_shard(run, table, first, offset, batch or 16, packed)
        assert max(assembled) == (kill_at if kill_at is not None else END - 1)
        # what the run delivered up to the state saved before its kill (it began the next run)
        until = ([*RUNS, LAST][k + 1][5]) if k < len(RUNS) else END
        kept |= {s: v for s, v in assembled.items() if s < until}
    assert sorted(kept) == list(range(END))
    # the last saved state: the last run's, after step 27 (every second step, as the guide's)
    assert json.loads((run_dir / f"loader-{view}.json").read_text())["step"] == END

    # an uninterrupted run in one process, with the batch sizes the runs kept
    config = target.load_config(configs[view], SCHEDULE)
    with config.build(mesh_2d) as loader:
        for step, got in zip(range(END), loader, strict=False):
            assert sorted(got) == sorted(kept[step]), step
            for leaf, value in got.items():
                assert np.array_equal(np.asarray(value), kept[step][leaf]), (step, leaf)

    # every token once per epoch: the delivered rows in offset order, tagged by the oracle
    delivered = [row for step in range(END) for row in kept[step]["input_ids"]]
    assert len(delivered) == len(rows) == END_OFFSET
    if packed:
        epochs = [np.repeat(e, [size for *_, size in pieces]).tolist()
                  for e, (_, pieces, _) in zip(target.packed_epochs(rows), rows, strict=True)]  # fmt: skip
    else:
        epochs = [tagged[:seq_len] for _, _, tagged, seq_len in rows]
    tokens = [row[: len(e)] for row, e in zip(delivered, epochs, strict=True)]
    assert_once_per_epoch(rows, lanes, epochs, tokens)
