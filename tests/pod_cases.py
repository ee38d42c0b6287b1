"""The configurations of the pod matrix, one list per layout (tests/test_pod_matrix.py runs each
list on a real pod; tests/test_hosts.py on the same layouts simulated in one process)."""

from __future__ import annotations

from tests.matrix import Case

SEED_LIKE = [[0, 1], [2, 3], [0, 1], [2, 3]]  # hosts in data rows 0 and 2, or 1 and 3
ALTERNATE_COLUMNS = [[0, 1, 0, 1], [0, 1, 0, 1]]  # each host: column shards 0 and 2, or 1 and 3
TWISTED_3D = [[[0, 1], [2, 3]], [[3, 2], [1, 0]]]  # each host in two (replica, data) rows

ON_DATA_MODEL = [
    Case({"tokens": [3], "weight": []}, {"tokens": "full", "weight": "batch"}, 16, 64,
         float_leaves=["weight"], name="full beside batch"),
    Case({"tokens": [3], "weight": [], "doc": [2]}, {"tokens": "replicated", "doc": "full"}, 10,
         23, source="read", name="replicated, batch and full; read only; batch 10 of 12"),
    Case({"tokens": [4], "weight": []}, {}, 10, 23, source="getitem", steps=[0, 2],
         name="a __getitem__ table, batch 10, the epoch's short end"),
    Case({"x3": [3, 4], "x4": [2, 3, 4]},
         {"x3": ["data", None, "model"], "x4": ["data", None, None, "model"]}, 8, 20,
         name="3-D and 4-D leaves sharded on their last dimension"),
    Case({"x3": [3, 4], "x4": [2, 3, 4]},
         {"x3": ["data", None, "model"], "x4": ["data", None, None, "model"]}, 8, 20,
         source="grain", name="the same from Grain-style records"),
    Case({"tokens": [8], "w": []}, {"tokens": ["data", "model"]}, 8, 30, halo={"tokens": 2},
         name="sequence over model with halo 2"),
    Case({"tokens": [8], "w": []}, {"tokens": ["data", "model"]}, 8, 30, halo={"tokens": 2},
         source="read", name="the same, read only"),
    Case({"tokens": [8], "weight": []}, {}, 8, 40, feeding=[0], steps=[0, 1, 2],
         name="only host 0 fed: hosts 2 and 3 read nothing"),
    Case({"tokens": [8], "weight": []}, {}, 7, 40, feeding=[1, 2], source="getitem",
         name="hosts 1 and 2 fed, batch 7"),
    Case({"tokens": [2]}, {"tokens": "full"}, 12, 30, drop_last=True, shuffle=False,
         steps=[1, 2], name="drop_last, unshuffled"),
]  # fmt: skip

ON_ALTERNATE_COLUMNS = [
    Case({"tokens": [16], "w": []}, {"tokens": ["data", "context"]}, 4, 11, halo={"tokens": h},
         source=source, name=f"two windows per host, halo {h}, {source}")
    for h, source in [(0, "window"), (1, "window"), (2, "read"), (3, "window"), (1, "getitem")]
] + [
    Case({"tokens": [16, 3], "x3": [2, 8]},
         {"tokens": ["data", "context"], "x3": ["data", None, "context"]}, 6, 14,
         halo={"tokens": 1}, source="grain", name="3-D sequence leaf and a 3-D leaf on dim 2"),
    Case({"tokens": [16], "w": []}, {"tokens": ["data", "context"]}, 5, 14, halo={"tokens": 1},
         feeding=[1], name="only host 1 fed, batch 5"),
    Case({"tokens": [16], "doc": [2], "w": []},
         {"tokens": ["data", "context"], "doc": "full", "w": "replicated"}, 8, 20,
         halo={"tokens": 4}, name="sequence, full and replicated side by side"),
]  # fmt: skip

BATCH = ["replica", "data"]
ON_3D = [
    Case({"tokens": [4], "weight": []}, {}, 8, 20, name="two batch axes"),
    Case({"a": [2], "b": [2]}, {"a": [["data", "replica"]], "b": [BATCH]}, 8, 20,
         source="read", name="batch axes in both orders side by side"),
    Case({"tokens": [8], "w": []}, {"tokens": [BATCH, "context"], "w": [BATCH]}, 6, 15,
         halo={"tokens": 1}, source="read", name="sequence with halo 1, batch 6 of 8"),
    Case({"x4": [2, 3, 4], "x3": [4, 2]},
         {"x4": [BATCH, None, None, "context"], "x3": ["replica", "context", "data"]}, 4, 9,
         name="4-D on dim 3, 3-D on dims 1 and 2"),
    Case({"tokens": [8], "doc": [3], "r": []},
         {"tokens": [BATCH, "context"], "doc": "full", "r": "replicated"}, 8, 24,
         halo={"tokens": 2}, name="sequence, full and replicated side by side"),
    Case({"tokens": [8], "w": []}, {"tokens": [BATCH, "context"], "w": [BATCH]}, 6, 15,
         halo={"tokens": 1}, feeding=[0, 3], source="grain", name="hosts 0 and 3 fed"),
]  # fmt: skip

PODS = {
    "data=4 x model=2, seed-like": (SEED_LIKE, ["data", "model"], [4, 2], 4, ON_DATA_MODEL),
    "data=2 x context=4, alternate columns": (
        ALTERNATE_COLUMNS, ["data", "context"], [2, 4], 2, ON_ALTERNATE_COLUMNS),
    "replica=2 x data=2 x context=2, twisted": (
        TWISTED_3D, ["replica", "data", "context"], [2, 2, 2], 4, ON_3D),
}  # fmt: skip
