"""The Ray engine on a local Ray cluster started by the test: every task once, errors as themselves,
and `prepare` on Ray writes the very store that local workers write (a hash of every file)."""

from __future__ import annotations

import math

import pytest

from psdp.prepare import prepare
from tests import chat_tokenizer
from tests import prepare_corpus as corpus
from tests.ray_cluster import requires_ray
from tests.test_prepare import tree_hash

pytestmark = [requires_ray, pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_task_runs_once_and_its_result_comes_back(ray_engine):
    results = list(ray_engine.map_unordered(math.factorial, range(12)))
    assert sorted(results) == [math.factorial(n) for n in range(12)]
    assert list(ray_engine.map_unordered(math.factorial, [])) == []


def test_a_task_error_is_raised_as_itself_not_wrapped(ray_engine):
    with pytest.raises(
        ValueError, match=r"^invalid literal for int\(\) with base 10: 'x'$"
    ) as info:
        list(ray_engine.map_unordered(int, ["1", "x", "2"]))
    assert type(info.value) is ValueError


def test_prepare_on_ray_writes_the_local_engines_store(ray_engine, tmp_path):
    """Text (jsonl shards and a Parquet file cut into row ranges) and chat records."""
    tokenizer = corpus.train_tokenizer(tmp_path / "tok" / "tokenizer.json")
    for kind in ("text", "chat"):
        (tmp_path / kind).mkdir()
    texts = corpus.texts(400, seed=21)
    corpus.write_jsonl(tmp_path / "text" / "a.jsonl", texts[:150])
    corpus.write_jsonl(tmp_path / "text" / "b.jsonl", texts[150:250])
    corpus.write_parquet(tmp_path / "text" / "c.parquet", texts[250:], row_group_size=16)
    chat_dir = chat_tokenizer.save_chat_tokenizer(tmp_path / "chat-tok")
    chats = chat_tokenizer.conversations(60, seed=22)
    corpus.write_jsonl(tmp_path / "chat" / "a.jsonl", chats[:30], field="messages")
    corpus.write_jsonl(tmp_path / "chat" / "b.jsonl", chats[30:], field="messages")
    runs = {
        "text": dict(tokenizer=tokenizer, eos=1, rows_per_part=50),
        "chat": dict(tokenizer=chat_dir, messages_field="messages"),
    }
    for kind, settings in runs.items():
        inputs = str(tmp_path / kind / "*")
        local = prepare(inputs, tmp_path / f"{kind}-local", workers=1, progress=False, **settings)
        on_ray = prepare(inputs, tmp_path / f"{kind}-ray", engine="ray", progress=False, **settings)
        assert on_ray.parts == local.parts > 1 and on_ray.documents == local.documents > 0
        assert tree_hash(tmp_path / f"{kind}-ray") == tree_hash(tmp_path / f"{kind}-local")


@pytest.mark.parametrize(
    ("have", "refused"), [("0.1.72", True), ("0.1.85", True), ("0.1.86", False)]
)
def test_a_local_ray_is_refused_where_tensorstore_would_abort_its_fork(monkeypatch, have, refused):
    """tensorstore 0.1.72 aborts the whole process when `ray.init` forks after it ran (seen by
    hand: "fork() is not allowed"); the engine says so before, naming the two ways out."""
    import ray

    from psdp.prepare import ray_engine as module

    started = []
    monkeypatch.setattr(module, "version", lambda name: have)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the session fixture's is open
    monkeypatch.setattr(ray, "init", lambda **options: started.append(options))
    if refused:
        with pytest.raises(RuntimeError, match=f"tensorstore {have} aborts") as info:
            module.RayEngine(num_cpus=1)
        assert "ray start --head" in str(info.value) and ">= 0.1.86" in str(info.value)
        assert started == []
    else:
        module.RayEngine(num_cpus=1)
        assert started == [{"address": None, "num_cpus": 1, "include_dashboard": False}]


ON_TWO_NODES = """
import json, sys, time
import ray
from psdp.prepare import prepare

address, inputs, output, tokenizer = sys.argv[1:]
ray.init(address=address)  # the engine uses this session, and leaves it open
deadline = time.monotonic() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2:  # the second node registers
    assert time.monotonic() < deadline, ray.nodes()
    time.sleep(0.2)
summary = prepare(inputs, output, tokenizer=tokenizer, eos=1, engine="ray", ray_address=address,
                  rows_per_part=100, bytes_per_part=4096)
nodes = [n for n in ray.nodes() if n["Alive"]]
print(json.dumps({"parts": summary.parts, "documents": summary.documents,
                  "cpus": sorted(n["Resources"].get("CPU", 0) for n in nodes),
                  "second": [n["Resources"].get("second_node", 0) for n in nodes]}))
"""


def test_a_two_node_cluster_prepares_the_store_of_one_process(tmp_path):
    """``ray start --head`` (no CPU: it runs no task) and a second ``ray start --address`` with
    2 CPUs and a resource of its own, both on 127.0.0.1: every task runs on the second node, and
    the store (a jsonl file in byte ranges, a Parquet file in row groups) equals, file for file,
    the one a single process writes. The nodes are stopped before the test ends."""
    import json
    import os
    import subprocess
    import sys

    from tests.ray_cluster import TWO_NODES_ENVIRONMENT, two_nodes
    from tests.test_prepare import stored

    tokenizer = corpus.train_tokenizer(tmp_path / "tok" / "tokenizer.json")
    texts = corpus.texts(900, seed=23)
    (tmp_path / "in").mkdir()
    corpus.write_jsonl(tmp_path / "in" / "a.jsonl", texts[:500])
    corpus.write_parquet(tmp_path / "in" / "b.parquet", texts[500:], row_group_size=50)
    inputs = str(tmp_path / "in" / "*")
    local = prepare(inputs, tmp_path / "local", tokenizer=tokenizer, eos=1, workers=1,
                    rows_per_part=100, bytes_per_part=4096, progress=False)  # fmt: skip
    (tmp_path / "ray").mkdir()
    with two_nodes(tmp_path / "ray") as address:
        run = subprocess.run(
            [sys.executable, "-c", ON_TWO_NODES, address, inputs, str(tmp_path / "on-ray"),
             str(tokenizer)], env={**os.environ, **TWO_NODES_ENVIRONMENT}, capture_output=True,
            text=True, timeout=240,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["cpus"] == [0, 2] and sorted(report["second"]) == [0, 1], report
    assert report["parts"] == local.parts > 8 and report["documents"] == local.documents
    assert "records" in run.stderr  # the progress bar, moved by the second node's tasks
    assert stored(tmp_path / "on-ray")[1] == stored(tmp_path / "local")[1]
    assert tree_hash(tmp_path / "on-ray") == tree_hash(tmp_path / "local")
