"""Chat records: ids from the tokenizer's own template, and a loss mask on the assistant's tokens only.

Oracles: the template's rule written out in Python (`tests.chat_tokenizer.rendered`) tokenized by
the `tokenizers` library directly gives the ids; decoding each run of masked tokens gives back
each assistant message (and its closing ``<|end|>``, which the template marks), in order.
"""

from __future__ import annotations

import itertools
import json
import sys

import numpy as np
import pytest

from psdp.prepare.chat import render_chat
from tests.chat_tokenizer import TEMPLATE, conversations, rendered, save_chat_tokenizer


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


def _prepare_chats(chat_dir, inputs, output):
    from psdp.prepare import prepare

    return prepare(inputs, output, tokenizer=chat_dir, messages_field="messages", workers=1,
                   progress=False)  # fmt: skip


def _stored_ids(path):
    from psdp import DocumentStore

    store = DocumentStore.open(path)
    offsets = store.offsets_range(0, store.num_documents + 1)
    ids = store.read_ranges([0], [store.num_tokens])["input_ids"].tolist()
    return [ids[a:b] for a, b in itertools.pairwise(offsets)]


#: The test template without its leading BOS: another rendering of the same conversations.
NO_BOS = TEMPLATE.replace("{{ bos_token }}", "")


def test_a_chat_template_saved_again_at_the_same_path_renders_with_the_new_one(tmp_path):
    """Two templates saved in turn to one directory, in one process: each store holds its own
    template's rendering (a tokenizer cached by its path rendered the first one twice)."""
    from tokenizers import Tokenizer

    from tests import prepare_corpus

    chats = conversations(20, seed=5)
    prepare_corpus.write_jsonl(tmp_path / "a.jsonl", chats, field="messages")
    chat_dir = tmp_path / "tok"
    for name, template, text in (("first", TEMPLATE, rendered), ("second", NO_BOS, None)):
        save_chat_tokenizer(chat_dir, template=template)
        _prepare_chats(chat_dir, tmp_path / "a.jsonl", tmp_path / name)
        direct = Tokenizer.from_file(str(chat_dir / "tokenizer.json"))
        texts = [rendered(c) if text else rendered(c).removeprefix("<s>") for c in chats]
        assert _stored_ids(tmp_path / name) == [
            direct.encode(t, add_special_tokens=False).ids for t in texts
        ]


def test_an_edited_chat_template_file_is_another_key_and_its_append_is_refused(tmp_path):
    """transformers 5 keeps the template in chat_template.jinja beside the tokenizer (written
    here by hand, whatever transformers is installed): editing it changes the store's key."""
    from tests import prepare_corpus

    chats = conversations(40, seed=6)
    prepare_corpus.write_jsonl(tmp_path / "a.jsonl", chats[:20], field="messages")
    prepare_corpus.write_jsonl(tmp_path / "b.jsonl", chats[20:], field="messages")
    chat_dir = save_chat_tokenizer(tmp_path / "tok")
    (chat_dir / "chat_template.jinja").write_text(TEMPLATE)
    config = json.loads((chat_dir / "tokenizer_config.json").read_text())
    kept = config.pop("chat_template", None)  # the file beside the tokenizer is the template
    (chat_dir / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import PreTrainedTokenizerFast

    if PreTrainedTokenizerFast.from_pretrained(str(chat_dir)).chat_template is None:
        config["chat_template"] = kept  # transformers 4 reads no .jinja: the file is in the key
        (chat_dir / "tokenizer_config.json").write_text(json.dumps(config))  # all the same
    _prepare_chats(chat_dir, tmp_path / "a.jsonl", tmp_path / "store")
    before = _stored_ids(tmp_path / "store")
    (chat_dir / "chat_template.jinja").write_text(NO_BOS)
    with pytest.raises(ValueError, match="was prepared with other settings .*tokenizer_sha256"):
        _prepare_chats(chat_dir, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "store")
    assert _stored_ids(tmp_path / "store") == before


def test_chat_template_tokens_above_a_256_id_vocabulary_are_stored_exactly(tmp_path):
    """256 words (ids 0-255) and the template's three tokens added above them (256-258): the ids
    need uint16, and each template token is stored as its own id, not cut to 8 bits."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests import prepare_corpus

    words = ["hi", "the", "fox", *(f"w{i}" for i in range(253))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="hi"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|end|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = NO_BOS
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    chats = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the fox w252"}],
        [{"role": "user", "content": "w7 fox"}, {"role": "assistant", "content": "hi"}],
    ]
    prepare_corpus.write_jsonl(tmp_path / "a.jsonl", chats, field="messages")
    _prepare_chats(tmp_path / "tok", tmp_path / "a.jsonl", tmp_path / "store")
    direct = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    want = [direct.encode(rendered(c).removeprefix("<s>"), add_special_tokens=False).ids
            for c in chats]  # fmt: skip
    assert want[0] == [256, 0, 258, 257, 1, 2, 255, 258]  # the template's tokens: 256, 257, 258
    assert _stored_ids(tmp_path / "store") == want
    from psdp import DocumentStore

    assert (
        DocumentStore.open(tmp_path / "store").read_ranges([0], [1])["input_ids"].dtype == np.uint16
    )
