"""`psdp prepare` against the goals of its issue, measured in one run on this machine.

Seeded text and a BPE tokenizer trained here (nothing downloaded), as jsonl shards; then:

- throughput: `prepare` (every core) against the tokenizer's own ``encode_batch`` on the same
  texts with the same cores (its own thread pool), in tokens/s;
- 1 vs 2 workers: the speedup of `prepare`;
- peak RSS of the driver and of its largest worker, for the corpus and for 10x the corpus (each
  run in a fresh process), which must not grow with the corpus;
- the same store (a hash of every file) from 1 worker, 2 workers and Ray (a local Ray instance);
- a `prepare` killed (SIGKILL) 3 times at seeded points, then resumed: the uninterrupted store.

    python scripts/measure/prepare_bench.py            # about 2-4 minutes on 2 cores
    python scripts/measure/prepare_bench.py --docs 2000  # a quick check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# a local Ray instance on 127.0.0.1 only (Ray takes the machine's interface address otherwise)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

SHARDS = 8
RUN = """
import json, os, sys, threading, time
from psdp.prepare import prepare

def peak_kib(pid):  # the process's own peak RSS since its exec (VmHWM), 0 once it is gone
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0

def children():
    pids = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as listed:
                pids += listed.read().split()
        except OSError:
            pass
    return pids

workers = {}
done = threading.Event()

def watch():  # every 10 ms, each worker's VmHWM (it only grows, so the last reading is its peak)
    while not done.wait(0.01):
        for pid in children():
            workers[pid] = max(workers.get(pid, 0), peak_kib(pid))

threading.Thread(target=watch, daemon=True).start()
inputs, output, tokenizer, count, engine = sys.argv[1:6]
started = time.perf_counter()
summary = prepare(inputs, output, tokenizer=tokenizer, eos="<|eos|>", workers=int(count),
                  engine=engine, progress=False)
seconds = time.perf_counter() - started
done.set()
print(json.dumps({"tokens": summary.tokens, "documents": summary.documents, "seconds": seconds,
                  "driver_rss_mib": peak_kib(os.getpid()) / 1024,
                  "worker_rss_mib": max(workers.values(), default=0) / 1024}))
"""


def texts(count: int, seed: int) -> list[str]:
    """Seeded documents of 20-400 words drawn (Zipf-like) from 5,000 made-up words."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=int(n))) for n in rng.integers(2, 10, size=5000)]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    lengths = rng.integers(20, 400, size=count)
    picks = rng.choice(len(words), size=int(lengths.sum()), p=weights)
    cuts = np.cumsum(lengths)[:-1]
    return [" ".join(words[i] for i in doc) for doc in np.split(picks, cuts)]


def write_corpus(directory: Path, docs: list[str]) -> str:
    directory.mkdir(parents=True)
    for shard, chunk in enumerate(np.array_split(np.arange(len(docs)), SHARDS)):
        with (directory / f"s{shard:03d}.jsonl").open("w") as f:
            f.writelines(json.dumps({"text": docs[i]}) + "\n" for i in chunk)
    return str(directory / "*.jsonl")


def train_tokenizer(path: Path, sample: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tokenizer.train_from_iterator(sample, trainer)
    tokenizer.save(str(path))
    return str(path)


def encode_batch_rate(tokenizer: str, docs: list[str]) -> float:
    """Tokens/s of the tokenizer's own batch encoding of ``docs`` (its thread pool, every core)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    best = 0.0
    for _ in range(2):  # the better of two: the first warms the page cache and thread pool
        started = time.perf_counter()
        tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
        best = max(best, tokens / (time.perf_counter() - started))
    return best


def run(inputs: str, output: Path, tokenizer: str, workers: int, engine: str = "local") -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, inputs, str(output), tokenizer, str(workers),
                          engine], check=True, capture_output=True, text=True)  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def tree_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def committed(output: Path) -> int:
    try:
        meta = json.loads((output / "psdp.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return sum(part is not None for part in meta["parts"].values())


def killed_three_times(inputs: str, output: Path, tokenizer: str) -> None:
    """Three runs, each SIGKILLed (with its workers) after a seeded number of committed parts."""
    for point in sorted(random.Random(30).sample(range(1, SHARDS), 3)):
        command = [sys.executable, "-c", RUN, inputs, str(output), tokenizer, "2", "local"]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
        while committed(output) < point and proc.poll() is None:
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000, help="documents of the 1x corpus")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray run")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="psdp-prepare-bench-"))
    docs = texts(args.docs, seed=0)
    tokenizer = train_tokenizer(tmp / "tokenizer.json", docs[:2000])
    small = write_corpus(tmp / "x1", docs)
    large = write_corpus(tmp / "x10", [d for _ in range(10) for d in docs])
    print(f"corpus: {len(docs):,} documents in {SHARDS} jsonl shards; 10x: {10 * len(docs):,}")

    baseline = encode_batch_rate(tokenizer, docs)
    one = run(small, tmp / "w1", tokenizer, 1)
    two = run(small, tmp / "w2", tokenizer, 2)
    big = run(large, tmp / "w10x", tokenizer, 2)
    hashes = {"1 worker": tree_hash(tmp / "w1"), "2 workers": tree_hash(tmp / "w2")}
    if not args.no_ray:
        run(small, tmp / "ray", tokenizer, 2, engine="ray")
        hashes["ray"] = tree_hash(tmp / "ray")
    killed_three_times(small, tmp / "killed", tokenizer)
    run(small, tmp / "killed", tokenizer, 2)  # the resume
    resumed = tree_hash(tmp / "killed") == hashes["1 worker"]

    rate = {n: r["tokens"] / r["seconds"] for n, r in (("1", one), ("2", two))}
    rss = {n: max(r["driver_rss_mib"], r["worker_rss_mib"]) for n, r in (("1x", two), ("10x", big))}
    print(
        f"tokens: {one['tokens']:,}; encode_batch {baseline / 1e6:.2f} Mtok/s; prepare 1 worker "
        f"{rate['1'] / 1e6:.2f}, 2 workers {rate['2'] / 1e6:.2f} Mtok/s (incl. start-up)"
    )
    print(f"peak RSS (driver / largest worker, MiB): 1x {two['driver_rss_mib']:.0f} / "
          f"{two['worker_rss_mib']:.0f}, 10x {big['driver_rss_mib']:.0f} / "
          f"{big['worker_rss_mib']:.0f}")  # fmt: skip
    goals = [
        ("throughput >= 0.8x encode_batch", rate["2"] / baseline, rate["2"] / baseline >= 0.8),
        ("1 -> 2 workers >= 1.7x", rate["2"] / rate["1"], rate["2"] / rate["1"] >= 1.7),
        ("peak RSS 10x / 1x corpus <= 1.15", rss["10x"] / rss["1x"], rss["10x"] / rss["1x"] <= 1.15),
        (f"same store hash: {', '.join(hashes)}", len(set(hashes.values())), len(set(hashes.values())) == 1),
        ("killed 3 times + resumed = uninterrupted", int(resumed), resumed),
    ]  # fmt: skip
    print("\n| goal | value | met |\n|---|---|---|")
    for goal, value, met in goals:
        print(f"| {goal} | {value:.2f} | {'met' if met else 'not met'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
