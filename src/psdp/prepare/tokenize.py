"""Tokenization for `prepare`: a Hugging Face ``tokenizers`` tokenizer, texts encoded a batch at a
time, the BOS/EOS ids the user chose around each document, in the smallest unsigned dtype that
holds every id of the vocabulary. ``docs/guides/prepare.md``, "Tokenizer".

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
#: The file a model directory keeps its special tokens (and, before transformers 4.43, its chat
#: template) in.
CONFIG_FILE = "tokenizer_config.json"
#: The other files of a model directory that transformers reads into a tokenizer and that can
#: change a chat record's ids (transformers 5 saves the chat template to ``chat_template.jinja``),
#: and the folder of its named templates: all part of a store's key.
MORE_FILES = ("chat_template.jinja", "chat_template.json", "special_tokens_map.json",
              "added_tokens.json")  # fmt: skip
TEMPLATES_DIRECTORY = "additional_chat_templates"


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


def tokenizer_files(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """The bytes of every file of the tokenizer at ``path`` that can change its ids, by name
    (``tokenizer.json`` first): the file itself, or those of a model directory."""
    files = {TOKENIZER_FILE: tokenizer_file(path).read_bytes()}
    given = Path(path)
    if given.is_dir():
        names = [CONFIG_FILE, *MORE_FILES]
        names += sorted(
            f"{TEMPLATES_DIRECTORY}/{p.name}" for p in (given / TEMPLATES_DIRECTORY).glob("*")
        )
        files |= {name: (given / name).read_bytes() for name in names if (given / name).is_file()}
    return files


def files_digest(files: dict[str, bytes]) -> str:
    """The sha256 a store records of its tokenizer's `tokenizer_files` (a lone tokenizer.json:
    its own sha256, as ``sha256sum`` gives)."""
    digest = hashlib.sha256(files[TOKENIZER_FILE])
    if CONFIG_FILE in files:  # as stores written before MORE_FILES were keyed: still the same
        digest.update(files[CONFIG_FILE])
    for name, body in files.items():
        if name not in (TOKENIZER_FILE, CONFIG_FILE):  # named and sized: no two sets collide
            digest.update(f"\0{name}\0{len(body)}\0".encode() + body)
    return digest.hexdigest()


def tokenizer_digest(path: str | os.PathLike[str]) -> str:
    """What a store records of its tokenizer: the sha256 of its ``tokenizer.json`` and, in a
    model directory, of every other file that can change its ids (`files_digest`)."""
    return files_digest(tokenizer_files(path))


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The ``tokenizers.Tokenizer`` of a ``tokenizer.json`` or a model directory."""
    return tokenizer_from(tokenizer_file(path).read_bytes(), tokenizer_file(path))


def tokenizer_from(body: bytes, file: str | os.PathLike[str]) -> Any:
    """The ``tokenizers.Tokenizer`` whose ``tokenizer.json`` is ``body`` (read from ``file``)."""
    tokenizers = import_optional("tokenizers", extra="prepare", needed_for="psdp prepare")
    try:
        return tokenizers.Tokenizer.from_str(body.decode())
    except Exception as error:  # tokenizers raises its own Exception subclass
        raise ValueError(f"cannot load the tokenizer {file}: {error}") from error


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds ids ``0 .. vocab_size - 1``.

    Examples:
        >>> [id_dtype(n).name for n in (256, 257, 65_536, 65_537)]
        ['uint8', 'uint16', 'uint16', 'uint32']
    """
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def special_id(tokenizer: Any, name: str, token: str | int | None) -> int | None:
    """The id of ``token`` for the option ``name`` (``bos`` or ``eos``); ``None`` for none.

    One rule for the API, the command line and a data config: an int, or a string of digits
    (``3``, ``"3"``, ``--eos 3``), is an id; any other string is a token (``"<|endoftext|>"``).
    A token made of digits is given by its id.
    """
    if token is None:
        return None
    if isinstance(token, str) and token.isascii() and token.isdigit():
        token = int(token)
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

    Examples:
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
