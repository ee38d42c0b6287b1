"""Chat records: ids from the tokenizer's own template, and a loss mask on the assistant's tokens only.

Oracles: the template's rule written out in Python (`tests.chat_tokenizer.rendered`) tokenized by
the `tokenizers` library directly gives the ids; decoding each run of masked tokens gives back
each assistant message (and its closing ``<|end|>``, which the template marks), in order.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from psdp.prepare.chat import render_chat
from tests.chat_tokenizer import conversations, rendered, save_chat_tokenizer


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return save_chat_tokenizer(tmp_path_factory.mktemp("chat-tokenizer"))


def masked_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, stop) of every run of ones in a 0/1 mask."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def test_ids_are_the_template_text_tokenized_and_the_mask_is_the_assistant_turns(chat_dir):
    from tokenizers import Tokenizer

    direct = Tokenizer.from_file(str(chat_dir / "tokenizer.json"))
    chats = conversations(50, seed=1)
    results = render_chat(chat_dir, chats)  # 400 ids: uint16, as text's ids would be
    assert len(results) == len(chats)
    for chat, (ids, mask) in zip(chats, results, strict=True):
        assert ids.dtype == np.uint16 and mask.dtype == np.uint8 and ids.shape == mask.shape
        assert ids.tolist() == direct.encode(rendered(chat), add_special_tokens=False).ids
        spans = [
            direct.decode(ids[a:b].tolist(), skip_special_tokens=False)
            for a, b in masked_runs(mask)
        ]
        # consecutive turns never merge: a user turn (never masked) separates any two assistant turns
        assert spans == [f"{m['content']}<|end|>" for m in chat if m["role"] == "assistant"]


def test_an_empty_batch_renders_nothing(chat_dir):
    assert render_chat(chat_dir, []) == []


def test_without_transformers_the_error_names_the_chat_extra(chat_dir, monkeypatch):
    from psdp.prepare import chat

    chat.chat_tokenizer.cache_clear()
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"chat records .* pip install 'psdp\[chat\]'"):
        render_chat(chat_dir, conversations(1, seed=2))


def test_prepare_stores_chat_records_with_their_loss_mask(chat_dir, tmp_path):
    from tokenizers import Tokenizer

    from psdp import DocumentStore
    from psdp.prepare import prepare
    from tests import prepare_corpus

    chats = conversations(120, seed=3)
    prepare_corpus.write_jsonl(tmp_path / "a.jsonl", chats[:70], field="messages")
    prepare_corpus.write_jsonl(tmp_path / "b.jsonl", chats[70:], field="messages")
    prepare(str(tmp_path / "*.jsonl"), tmp_path / "store", tokenizer=chat_dir,
            messages_field="messages", workers=2, progress=False)  # fmt: skip
    store = DocumentStore.open(tmp_path / "store")
    offsets = store.offsets_range(0, store.num_documents + 1)
    leaves = store.read_ranges([0], [store.num_tokens])
    direct = Tokenizer.from_file(str(chat_dir / "tokenizer.json"))
    assert store.num_documents == len(chats)
    assert leaves["input_ids"].dtype == np.uint16 and leaves["loss_mask"].dtype == np.uint8
    for chat, a, b in zip(chats, offsets[:-1], offsets[1:], strict=True):
        ids, mask = leaves["input_ids"][a:b], leaves["loss_mask"][a:b]
        assert ids.tolist() == direct.encode(rendered(chat), add_special_tokens=False).ids
        spans = [
            direct.decode(ids[s:e].tolist(), skip_special_tokens=False)
            for s, e in masked_runs(mask)
        ]
        assert spans == [f"{m['content']}<|end|>" for m in chat if m["role"] == "assistant"]
