"""Tokenization for `prepare`: a Hugging Face ``tokenizers`` tokenizer, texts encoded a batch at a
time, the BOS/EOS ids the user chose around each document, in the smallest unsigned dtype that
holds every id of the vocabulary. ``docs/prepare.md``, "Tokenizer".

The tokenizer's own special tokens (its post-processor) are not added: BOS and EOS are what the
user asks for, nothing else, so the ids are exactly ``encode(text, add_special_tokens=False)``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from psdp._imports import import_optional

#: The file a model directory keeps its tokenizer in.
TOKENIZER_FILE = "tokenizer.json"
#: The file a model directory keeps its chat template in (read by transformers, not here).
CONFIG_FILE = "tokenizer_config.json"


def tokenizer_file(path: str | os.PathLike[str]) -> Path:
    """The ``tokenizer.json`` that ``path`` names: the file itself, or the one in a model
    directory."""
    given = Path(path)
    found = given / TOKENIZER_FILE if given.is_dir() else given
    if not found.is_file():
        raise FileNotFoundError(
            f"tokenizer={os.fspath(path)!r} is not a tokenizer.json file or a model directory "
            f"holding one; give the path of a Hugging Face tokenizers file (nothing is downloaded)"
        )
    return found


def tokenizer_digest(path: str | os.PathLike[str]) -> str:
    """What a store records of its tokenizer: the sha256 of its ``tokenizer.json``, and of a
    model directory's ``tokenizer_config.json`` too (it holds the chat template)."""
    digest = hashlib.sha256(tokenizer_file(path).read_bytes())
    config = Path(path) / CONFIG_FILE
    if config.is_file():
        digest.update(config.read_bytes())
    return digest.hexdigest()


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The ``tokenizers.Tokenizer`` of a ``tokenizer.json`` or a model directory."""
    tokenizers = import_optional("tokenizers", extra="prepare", needed_for="psdp prepare")
    file = tokenizer_file(path)
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises its own Exception subclass
        raise ValueError(f"cannot load the tokenizer {file}: {error}") from error


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds ids ``0 .. vocab_size - 1``.

    Example:
        >>> [id_dtype(n).name for n in (256, 257, 65_536, 65_537)]
        ['uint8', 'uint16', 'uint16', 'uint32']
    """
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def special_id(tokenizer: Any, name: str, token: str | int | None) -> int | None:
    """The id of ``token`` (a token string such as ``"<|endoftext|>"``, or an id) for the
    option ``name`` (``bos`` or ``eos``); ``None`` for none."""
    if token is None:
        return None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if isinstance(token, int | np.integer) and not isinstance(token, bool):
        if not 0 <= token < size:
            raise ValueError(
                f"{name}={token} is not an id of the tokenizer's vocabulary of {size} ids; give "
                f"an id in [0, {size}) or a token string such as '<|endoftext|>'"
            )
        return int(token)
    if not isinstance(token, str):
        raise TypeError(f"{name} must be a token string, an id or None, got {type(token).__name__}")
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(
            f"{name}={token!r} is not a token of the tokenizer; give one of its tokens (its "
            "special tokens are listed in tokenizer.json's added_tokens) or an id"
        )
    return int(found)


class Encoder:
    """Texts -> one id array per document (``bos`` first, ``eos`` last when given), in `dtype`.

    Example:
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<eos>": 2}, unk_token="a"))
        >>> tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> encoder = Encoder(tokenizer, bos=None, eos="<eos>")
        >>> [ids.tolist() for ids in encoder.encode(["a b", "b"])], encoder.dtype
        ([[0, 1, 2], [1, 2]], dtype('uint8'))
    """

    def __init__(self, tokenizer: Any, *, bos: str | int | None, eos: str | int | None):
        self.tokenizer = tokenizer
        self.bos = special_id(tokenizer, "bos", bos)
        self.eos = special_id(tokenizer, "eos", eos)
        self.dtype = id_dtype(tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, texts: list[str]) -> list[np.ndarray | None]:
        """One batch, which the tokenizer's own threads encode; ``None`` for a text that gives
        no token (an empty document, which a store does not hold)."""
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        head = [] if self.bos is None else [self.bos]
        tail = [] if self.eos is None else [self.eos]
        return [np.array(head + e.ids + tail, self.dtype) if e.ids else None for e in encodings]
