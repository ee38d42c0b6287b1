"""A tiny BPE tokenizer with a chat template, trained in-process and saved to a directory.

Nothing is downloaded: the BPE is trained on seeded words in about a second. The template marks
each assistant turn, its closing ``<|end|>`` included, with ``{% generation %}``, so the loss mask
must cover exactly ``content + "<|end|>"`` of every assistant message (`rendered` is the same rule
in plain Python, the tests' oracle for the ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
WORDS = (
    "the quick brown fox jumps over lazy dog hello there how are you fine thanks and what".split()
)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
)


def rendered(conversation: list[dict[str, str]]) -> str:
    """`TEMPLATE`'s text for a conversation, written out in Python."""
    return "<s>" + "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in conversation)


def conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    """Seeded chats: an optional system turn, then 1-3 user/assistant pairs of 1-8 words."""
    rng = np.random.default_rng(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS, size=int(rng.integers(1, 9))))

    chats = []
    for _ in range(count):
        chat = [{"role": "system", "content": text()}] if rng.random() < 0.5 else []
        for _ in range(int(rng.integers(1, 4))):
            chat += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        chats.append(chat)
    return chats


def save_chat_tokenizer(path: Path, template: str | None = TEMPLATE) -> Path:
    """Trains the BPE, wraps it for transformers with ``template`` and saves it in ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts: Any = [" ".join(c["content"] for c in chat) for chat in conversations(200, seed=0)]
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,  # transformers 4.45 warns when it is not set
    )
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(path))
    return path
