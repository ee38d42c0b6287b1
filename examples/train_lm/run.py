"""Train a language model on a local pod, kill it, and resume it on half the hosts.

    python examples/train_lm/run.py [RUN_FOLDER]

1. Text: seeded "code" and "prose" jsonl files and a held-out eval set (`corpus.py`), and a
   byte-level BPE trained on them in-process.
2. `psdp prepare`: one document store per source and for the eval set, by the commands that
   `train_lm.yaml`'s data config names.
3. Training (`train.py`) on 4 local processes of 2 fake CPU devices each (data=8), global batch 16:
   a checkpoint every 4 steps (the first after step 3, Orbax's 4), then every process is
   SIGKILLed after step 6.
4. The resume on 2 processes (data=4) with global batch 8: from the checkpoint at step 4 (steps
   4-6 are trained again: the loader continues at sample offset 64) to step 16.

Before each pod starts, its picture (`psdp plan` of the mesh the trainer builds): which host owns
which device and which rows of the batch each host reads. Every step, every host checks each
device's part of the batch against an oracle that rebuilds the batch from the stores without
psdp (`batch_oracle.py`); process 0 prints the loss and the verdict. Each process's output is
shown live, prefixed by its process index, and kept in the run folder's logs/; process 0's
steps.jsonl holds every step (docs/guides/trainer.md).
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import draccus

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # corpus.py, model.py and train.py sit beside this file

from corpus import train_tokenizer, write_text  # noqa: E402
from train import CONFIG, TrainConfig  # noqa: E402

from psdp.tools.cli import main as psdp_cli  # noqa: E402
from psdp.tools.pod import PodError, run_pod  # noqa: E402

#: (processes, devices per process, flags) of the killed run and of its resume.
KILLED = (4, 2, ["--kill_at", "6"])
RESUMED = (2, 2, ["--data.order.global_batch_size", "8"])


def prepare(run_dir: Path) -> None:
    """Text, tokenizer and stores under ``run_dir``: `psdp prepare` as the config names it."""
    files = write_text(run_dir)
    train_tokenizer([f for name in ("code", "prose") for f in files[name]],
                    run_dir / "tokenizer.json")  # fmt: skip
    data = draccus.parse(TrainConfig, config_path=str(CONFIG), args=[]).data
    for source in [*data.sources.values(), *data.eval.values()]:
        command = source.prepare_command()
        print(command)
        words = shlex.split(command)[1:]  # the same command, run in this process
        with _working_directory(run_dir):
            assert psdp_cli([*words, "--workers", "1", "--no-progress"]) == 0, command


def train(run_dir: Path, processes: int, devices: int, flags: list[str], **pod: Any) -> list:
    """``train.py`` on a local pod of ``processes`` x ``devices``; its output shown live."""
    return run_pod(
        f"{HERE / 'train.py'}:main",
        num_processes=processes,
        devices_per_process=devices,
        args={"run_dir": str(run_dir), "args": flags},
        log_dir=run_dir / "logs" / f"{processes}-processes",
        **{"timeout_s": 300, "echo": sys.stdout, **pod},
    )


def show_pod(run_dir: Path, processes: int, devices: int, flags: list[str]) -> None:
    """Prints the picture of the pod ``train`` starts: the mesh its config builds on
    ``processes`` hosts of ``devices`` devices, and the rows of the first batch each host reads."""
    config = draccus.parse(TrainConfig, config_path=str(CONFIG), args=flags)
    layout = config.mesh.layout_for(processes, processes * devices)
    path = run_dir / f"mesh-{processes}-processes.json"
    path.write_text(json.dumps({"axis_names": list(layout.axis_names),
                                "process_index": layout.process_index.tolist()}))  # fmt: skip
    batch_size = config.data.order.global_batch_size
    if not isinstance(batch_size, int):  # a schedule: its first stage's size
        batch_size = batch_size[0][1]
    print(f"\nthe pod: {processes} processes x {devices} CPU devices, global batch {batch_size}")
    command = ["plan", "--layout", str(path), "--batch-size", str(batch_size),
               "--seq-len", str(config.data.seq_len),
               "--batch-axes", ",".join(config.mesh.resolved_batch_axes())]  # fmt: skip
    assert psdp_cli(command) == 0, command
    print(flush=True)


def killed_then_resumed(run_dir: Path, **pod: Any) -> list:
    """The killed run, then its resume, each after its pod's picture; returns the resumed pod's
    results."""
    show_pod(run_dir, *KILLED)
    try:
        train(run_dir, *KILLED, **pod)
    except PodError as error:
        print(f"the pod was killed as planned: {str(error).splitlines()[0]}")
    else:
        raise AssertionError("the run was to be killed after step 6, but it finished")
    show_pod(run_dir, *RESUMED)
    return train(run_dir, *RESUMED, **pod)


class _working_directory:
    def __init__(self, path: Path):
        self.path, self.before = path, Path.cwd()

    def __enter__(self) -> None:
        import os

        os.chdir(self.path)

    def __exit__(self, *exc: object) -> None:
        import os

        os.chdir(self.before)


if __name__ == "__main__":
    run_dir = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="train_lm-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    prepare(run_dir.resolve())
    results = killed_then_resumed(run_dir.resolve())
    losses = {int(step): loss for step, loss in results[0]["losses"].items()}
    first, last = min(losses), max(losses)
    print(f"resumed on 2 processes: loss {losses[first]:.4f} at step {first} -> "
          f"{losses[last]:.4f} at step {last}; every device's batch matched the oracle at "
          f"{len(results[0]['checked'])} of {len(losses)} steps")  # fmt: skip
    print(f"run folder: {run_dir} (steps.jsonl, logs/, checkpoints/)")
