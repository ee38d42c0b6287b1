"""Indicative figures for `psdp prepare` on this machine (the full benchmark is `psdp bench`'s).

Makes a seeded jsonl corpus in 8 shards and a byte-level BPE (8,000 ids) trained on it, then
prints: the tokenizer's own ``encode_batch`` tokens/s on every core (the physical limit),
`prepare` with 1 and 2 workers (tokens/s, and as a ratio of that limit), whether the two stores
are byte-identical, and the peak RSS of a `prepare` (1 worker, its own process) of the corpus
and of 10x the corpus.

Usage::

    python scripts/measure/prepare_quick.py            # 40,000 documents of ~150 words
    python scripts/measure/prepare_quick.py --docs 4000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(1 + i % 9))
    for i in range(5000)
]


def write_corpus(directory: Path, docs: int, shards: int = 8) -> list[str]:
    rng = random.Random(0)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(50, 250))) for _ in range(docs)]
    directory.mkdir(parents=True)
    per = -(-docs // shards)
    for s in range(shards):
        with open(directory / f"shard-{s:02d}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[s * per : (s + 1) * per])
    return texts


def tree_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + file.read_bytes())
    return digest.hexdigest()


def peak_rss_mib(inputs: str, out: Path, tokenizer: Path) -> float:
    code = (
        "import sys, resource; from psdp.prepare import prepare; "
        "prepare(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], workers=1, progress=False); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    run = subprocess.run([sys.executable, "-c", code, inputs, str(out), str(tokenizer)],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return int(run.stdout.split()[-1]) / 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=40_000)
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from psdp.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = write_corpus(root / "corpus", args.docs)
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=8000, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
        tokenizer.train_from_iterator(texts[:5000], trainer)
        tokenizer.save(str(root / "tokenizer.json"))
        start = time.perf_counter()
        tokens = sum(len(e.ids) for i in range(0, len(texts), 1024)
                     for e in tokenizer.encode_batch_fast(texts[i : i + 1024]))  # fmt: skip
        limit = tokens / (time.perf_counter() - start)
        print(f"corpus: {len(texts):,} documents, {tokens:,} tokens")
        print(f"tokenizer encode_batch, every core: {limit / 1e6:.2f} Mtokens/s")
        inputs = str(root / "corpus" / "*.jsonl")
        for workers in (1, 2):
            start = time.perf_counter()
            prepare(inputs, root / f"w{workers}", tokenizer=root / "tokenizer.json",
                    workers=workers, progress=False)  # fmt: skip
            rate = tokens / (time.perf_counter() - start)
            print(f"prepare, {workers} worker(s): {rate / 1e6:.2f} Mtokens/s = {rate / limit:.2f}x "
                  "the tokenizer's encode_batch")  # fmt: skip
        print(f"1 and 2 workers byte-identical: {tree_hash(root / 'w1') == tree_hash(root / 'w2')}")
        big = root / "big"
        big.mkdir()
        for copy in range(10):
            for shard in sorted((root / "corpus").glob("*.jsonl")):
                (big / f"{copy}-{shard.name}").write_bytes(shard.read_bytes())
        small_rss = peak_rss_mib(inputs, root / "rss1", root / "tokenizer.json")
        big_rss = peak_rss_mib(str(big / "*.jsonl"), root / "rss10", root / "tokenizer.json")
        print(f"peak RSS, 1 worker: corpus {small_rss:.0f} MiB, 10x the corpus {big_rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
