"""The example's text: two seeded sources, "code" and "prose", a held-out eval set, and a small
byte-level BPE trained on them in-process (nothing is downloaded).

Every document comes from `random.Random(seed)`, so the same seed writes the same files, and the
stores `psdp prepare` makes from them are the same, run after run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

EOS = "<|endoftext|>"
NAMES = "data mesh shard host token batch step loss row seed block offset".split()
NOUNS = "river garden window morning letter village music winter forest harbour".split()
VERBS = "follows remembers carries watches opens crosses finds keeps".split()
ADJECTIVES = "quiet old bright narrow distant gentle cold golden".split()


def code_document(rng: random.Random) -> str:
    """A small Python function: a loop, a condition, a return (8-60 lines long)."""
    name, arg, acc = rng.sample(NAMES, 3)
    lines = [f"def {name}_{rng.randint(0, 99)}({arg}):", f"    {acc} = {rng.randint(0, 9)}"]
    for _ in range(rng.randint(2, 20)):
        value = rng.choice(NAMES)
        lines += [
            f"    for {value} in range({arg}):",
            f"        if {value} % {rng.randint(2, 7)} == 0:",
            f"            {acc} += {value} * {rng.randint(1, 9)}",
        ]
    lines.append(f"    return {acc}")
    return "\n".join(lines) + "\n"


def prose_document(rng: random.Random) -> str:
    """A paragraph of 1-30 simple sentences."""
    sentences = []
    for _ in range(rng.randint(1, 30)):
        subject, other = rng.sample(NOUNS, 2)
        sentences.append(f"The {rng.choice(ADJECTIVES)} {subject} {rng.choice(VERBS)} the {other}.")
    return " ".join(sentences)


def write_text(root: Path, seed: int = 0) -> dict[str, list[Path]]:
    """Writes the sources' jsonl files under ``root/raw`` and returns them by name: code (2
    files of 150 documents), prose (2 files of 300) and held_out (40 of each kind)."""
    rng = random.Random(seed)
    files: dict[str, list[Path]] = {}
    plan = {"code": [(code_document, 150)] * 2, "prose": [(prose_document, 300)] * 2,
            "held_out": [(code_document, 40), (prose_document, 40)]}  # fmt: skip
    for name, parts in plan.items():
        folder = root / "raw" / name
        folder.mkdir(parents=True, exist_ok=True)
        files[name] = []
        for i, (make, count) in enumerate(parts):
            path = folder / f"{i}.jsonl"
            rows = (json.dumps({"text": make(rng)}) + "\n" for _ in range(count))
            path.write_text("".join(rows))
            files[name].append(path)
    return files


def train_tokenizer(files: list[Path], path: Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE of ``vocab_size`` ids trained on ``files``' texts, EOS its id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [json.loads(line)["text"] for f in files for line in f.read_text().splitlines()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return path
