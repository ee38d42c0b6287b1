"""Chat records to token ids and an assistant-only loss mask, through the tokenizer's own template.

A chat record is a list of messages (``{"role": ..., "content": ...}``). The tokenizer's chat
template renders it, and transformers' own template machinery (``apply_chat_template`` with
``return_assistant_tokens_mask``) marks the tokens that the template wraps in
``{% generation %}...{% endgeneration %}``: those, and only those, count in the loss. psdp writes
no template engine of its own. The tokenizer comes from a local directory (``save_pretrained``);
nothing is downloaded. ``docs/guides/prepare.md``, "Chat data".
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np

from psdp._imports import import_optional
from psdp.prepare.tokenize import id_dtype, tokenizer_digest

# transformers' own test for the markers (it only logs a warning and returns an all-zero mask)
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def render_chat(
    tokenizer_path: str | Path,
    conversations: list[list[dict[str, Any]]],
    digest: str | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids and a loss mask (uint8, 1 on the assistant's tokens) for each conversation.

    The ids are in the smallest dtype that holds the tokenizer's vocabulary, as text's are.

    Arguments:
        tokenizer_path: a tokenizer directory saved by transformers (``tokenizer.json`` and its
            chat template), whose template marks the assistant's turns with ``{% generation %}``.
        conversations: one list of ``{"role": str, "content": str}`` messages per record.
        digest: the directory's `tokenizer_digest`, if known (a task computes it once).

    Example (a word-level tokenizer; the template marks the assistant's words, not its <|end|>):
        >>> import tempfile
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import PreTrainedTokenizerFast
        >>> words = "<|user|> <|assistant|> <|end|> hi the fox".split()
        >>> core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="hi"))
        >>> core.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, additional_special_tokens=
        ...     words[:3], clean_up_tokenization_spaces=False)  # unset, transformers 4.45 warns
        >>> tokenizer.chat_template = (
        ...     "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'user' %}{{ m.content }}"
        ...     "{% else %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}<|end|>{% endfor %}")
        >>> tmp = tempfile.TemporaryDirectory()
        >>> _ = tokenizer.save_pretrained(tmp.name)
        >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the fox"}]
        >>> [(ids, mask)] = render_chat(tmp.name, [chat])
        >>> ids.dtype.name, ids.tolist(), mask.tolist()
        ('uint8', [0, 3, 2, 1, 4, 5, 2], [0, 0, 0, 0, 1, 1, 0])
        >>> tmp.cleanup()
    """
    for index, conversation in enumerate(conversations):
        _check_conversation(index, conversation)
    if not conversations:
        return []
    if digest is None and (Path(tokenizer_path) / "tokenizer.json").is_file():
        digest = tokenizer_digest(tokenizer_path)
    tokenizer = chat_tokenizer(tokenizer_path, digest or "")  # "": refused there, never cached
    encoded = tokenizer.apply_chat_template(
        conversations, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    dtype = id_dtype(len(tokenizer))  # len: the vocabulary with its added tokens
    return [
        (np.asarray(ids, dtype=dtype), np.asarray(mask, dtype=np.uint8))
        for ids, mask in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True)
    ]


@functools.lru_cache(maxsize=4)
def chat_tokenizer(tokenizer_path: str | Path, digest: str) -> Any:
    """The fast tokenizer saved in ``tokenizer_path``, checked to have a usable chat template.

    Cached by ``digest`` (the directory's `tokenizer_digest`), not the path alone: a prepare
    task renders many batches with one tokenizer, and one saved again at the same path (another
    template, say) is another tokenizer.
    """
    transformers = import_optional(
        "transformers", extra="chat", needed_for="chat records (messages_field=)"
    )
    path = Path(tokenizer_path)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(
            f"chat records need a tokenizer directory holding tokenizer.json and a chat template; "
            f"{str(path)!r} has no tokenizer.json: give the directory that the tokenizer's "
            "save_pretrained() wrote"
        )
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(path))
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError(
            f"chat records are rendered with the tokenizer's chat template, and the tokenizer in "
            f"{str(path)!r} has none (chat_template is {template!r}): set tokenizer.chat_template "
            "and save_pretrained() it again"
        )
    if not _GENERATION.search(template):
        raise ValueError(
            f"the loss mask covers the tokens that the chat template marks with "
            f"{{% generation %}}...{{% endgeneration %}}, and the template in {str(path)!r} has no "
            f"such marker (it begins {template[:60]!r}): wrap each assistant turn of the template "
            "in {% generation %}...{% endgeneration %}"
        )
    return tokenizer


def _check_conversation(index: int, conversation: Any) -> None:
    """A clear error for a record that is not a list of role/content messages."""
    messages = conversation if isinstance(conversation, list) else None
    if not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError(
            f"a chat record is a non-empty list of messages, each a dict with a string 'role' and "
            f"a string 'content'; record {index} of the batch is {conversation!r:.200}: fix the "
            "record, or pass skip_bad=True to count and skip such records"
        )
