"""Inputs for the `prepare` tests, made in the test: seeded texts, a small BPE tokenizer trained on
them in-process (nothing downloaded), and the same texts as jsonl (plain, gz, zst), Parquet, Arrow
and a `datasets` save_to_disk export."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

WORDS = "the a quick brown fox jumps over lazy dog data mesh shard token host é 世界 ✓".split()


def texts(count: int, seed: int = 0) -> list[str]:
    """``count`` seeded texts of 1-40 words (some with newlines and non-ASCII)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))).replace("fox", "fox\n")
        for _ in range(count)
    ]


def train_tokenizer(
    path: Path,
    vocab_size: int = 300,
    corpus: list[str] | None = None,
    specials: tuple[str, ...] | list[str] = ("<|bos|>", "<|eos|>"),
) -> Path:
    """A byte-level BPE trained on ``corpus`` (default `texts(200)`), its first ids the
    ``specials``, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or texts(200), trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def write_jsonl(path: Path, values: list[str], field: str = "text") -> Path:
    body = "".join(json.dumps({field: v, "id": i}) + "\n" for i, v in enumerate(values))
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(body.encode()))
    elif path.name.endswith(".zst"):
        import zstandard

        path.write_bytes(zstandard.ZstdCompressor().compress(body.encode()))
    else:
        path.write_text(body)
    return path


def write_parquet(path: Path, values: list[str], row_group_size: int = 16) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": values}), path, row_group_size=row_group_size)
    return path


def write_arrow(path: Path, values: list[str], batch_rows: int = 16) -> Path:
    """An Arrow IPC file (with a footer) in record batches of ``batch_rows``."""
    import pyarrow as pa

    table = pa.table({"text": values})
    with pa.ipc.new_file(path, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return path


def write_datasets_export(path: Path, values: list[str], shards: int = 2) -> Path:
    import datasets

    datasets.Dataset.from_dict({"text": values}).save_to_disk(
        str(path), num_shards=shards, num_proc=None
    )
    return path
