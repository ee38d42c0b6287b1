"""The example's own verification, apart from the trainer: every step, every host checks each
device's part of the batch against the batch `batch_oracle.py` rebuilds from the stores without
psdp (`psdp.check_consistency`), and process 0 logs the step (its sample offset, loss, loss per
source, the delivered tokens and where each row's segments come from) as a line of JSON, which
``tests/test_example.py`` compares across runs. A trainer of your own needs none of this.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from batch_oracle import expected_batch, store_documents
from jax.experimental import multihost_utils

from psdp import DataConfig, check_consistency


class Checks:
    """The oracle check and process 0's JSON lines, for a run of ``data`` logging to ``log``."""

    def __init__(self, data: DataConfig, log: str, check: bool = True):
        self.data, self.path, self.check = data, Path(log), check
        self.documents = {name: store_documents(s.store) for name, s in data.sources.items()}
        self.checked: list[int] = []

    def step(self, loader, step: int, batch, loss: float, by_source: dict[str, float]) -> str:
        """Checks and logs ``step`` (collective: every host calls it); returns the verdict."""
        info = loader.step_info(step)
        rows = provenance(loader.source, np.arange(info.offset, info.offset + info.rows))
        verdict = "not checked"
        if self.check:  # every host checks, every host gets the verdict
            report = check_consistency(batch, self.oracle(batch, rows))
            verdict = str(report)
            self.checked += [step] if report.exact else []
        tokens = multihost_utils.process_allgather(batch["input_ids"], tiled=True)
        self.write({
            "processes": jax.process_count(), "step": step, "offset": info.offset,
            "rows": info.rows, "loss": loss, "loss_by_source": by_source,
            "input_ids": np.asarray(tokens)[: info.rows].tolist(), "provenance": rows,
        })  # fmt: skip
        return verdict

    def oracle(self, batch, rows: list[list]) -> dict[str, np.ndarray]:
        """The step's global batch as the oracle rebuilds it, in the delivered leaves' dtypes;
        rows past ``rows`` (a padded batch's) are padding, and ``mask`` says which are real."""
        size = batch["input_ids"].shape[0]
        padded = rows + [[] for _ in range(size - len(rows))]
        expected = expected_batch(padded, self.documents, self.data.seq_len, self.data.view.pad_id)
        expected["mask"] = np.arange(size) < len(rows)
        if self.data.mixture.source_leaf in batch:  # each row's source, by its segments'
            tags = {name: i for i, name in enumerate(sorted(self.data.sources))}
            expected[self.data.mixture.source_leaf] = np.array(
                [tags[row[0][0]] if row else 0 for row in padded]
            )
        return {k: v.astype(batch[k].dtype) for k, v in expected.items() if k in batch}

    def write(self, record: dict[str, Any]) -> None:
        if jax.process_index() == 0:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def provenance(mixture, offsets: np.ndarray) -> list[list]:
    """Each row's segments as ``[source, document, start, stop, column]``: the document's tokens
    ``[start, stop)`` sit from ``column`` on (`Mixture.provenance`: reads no token)."""
    out: list[list] = [[] for _ in offsets]
    for segment in mixture.provenance(offsets):
        fields = ("document", "start", "stop", "column")
        out[segment["row"]].append([str(segment["source"]), *(int(segment[k]) for k in fields)])
    return out
