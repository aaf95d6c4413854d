"""SentencePiece's Unigram encoding, exactly: its text normalisation, its float32 best path and its ``.model`` files.

Book: Tokenizers, "Unigram".

:class:`~llmarch.tokenizers.UnigramTokenizer` encodes with :func:`best_path_ids` and reads SentencePiece's
model files with :func:`read_model_file`, which parses the serialized ``ModelProto`` (protocol buffers' wire
format) itself, so that neither ``sentencepiece`` nor ``protobuf`` is needed. The field numbers are those of
``sentencepiece_model.proto`` (google/sentencepiece, Apache-2.0).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

SPACE_SYMBOL = "\u2581"  # ▁, SentencePiece's meta symbol for a space
UNK_PENALTY = 10.0  # SentencePiece's kUnkPenalty: an unknown character scores min(log p) - 10
UNK_SURFACE = " \u2047 "  # " ⁇ ", what SentencePiece decodes an unknown id to
_FLOAT32 = struct.Struct("<f")
_SPACE_RUN = re.compile(" {2,}")

# SentencePiece.Type in sentencepiece_model.proto
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_TYPE_NAMES = {NORMAL: "normal", UNKNOWN: "unknown", CONTROL: "control", USER_DEFINED: "user-defined",
               UNUSED: "unused", BYTE: "byte"}
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def float32(x: float) -> float:
    """``x`` rounded to the nearest float32. SentencePiece adds its scores in float32; the sum of two float32
    values computed in float64 and then rounded this way is exactly their float32 sum."""
    return _FLOAT32.unpack(_FLOAT32.pack(x))[0]


def normalise(text: str, add_dummy_prefix: bool = True, remove_extra_whitespaces: bool = False) -> str:
    """SentencePiece's ``identity`` normalisation: write every space as ``▁`` and, unless the text is empty,
    put one ``▁`` in front. With ``remove_extra_whitespaces`` (SentencePiece's default), first drop the spaces
    (U+0020) at the start and collapse each run of them into one, and at the end drop every trailing ``▁``
    (a ``▁`` typed in the text included), as SentencePiece's ``Normalizer`` does.
    ``normalise("a  b") -> "▁a▁▁b"``; with ``remove_extra_whitespaces``: ``"▁a▁b"``."""
    if remove_extra_whitespaces:
        text = _SPACE_RUN.sub(" ", text.lstrip(" "))
    if not text:
        return ""
    s = (SPACE_SYMBOL if add_dummy_prefix else "") + text.replace(" ", SPACE_SYMBOL)
    return s.rstrip(SPACE_SYMBOL) if remove_extra_whitespaces else s


def best_path_ids(s: str, scores32: dict[str, float], ids: dict[str, int], max_len: int, unk_score: float,
                  unk_id: int = 0) -> list[int]:
    """The ids of the best segmentation of the normalised text ``s``, as SentencePiece's Unigram ``Encode``.

    ``best[e] = max over pieces s[b:e] of best[b] + score(s[b:e])``, over the whole text (pieces may hold
    ``▁`` anywhere), with every sum rounded to float32 as SentencePiece computes it (``scores32``: the
    scores already in float32). A character that is not a piece on its own is also an edge of score
    ``unk_score`` with id ``unk_id``. Starts are tried from the left and only a strictly better sum replaces
    the best, so among equal sums the last piece that starts earliest wins. A run of unknown ids becomes one,
    as SentencePiece's processor merges them.
    """
    n = len(s)
    best: list[float | None] = [0.0] + [None] * n
    back, chosen = [0] * (n + 1), [unk_id] * (n + 1)
    for start in range(n):
        here, single = best[start], False
        for end in range(start + 1, min(n, start + max_len) + 1):
            score = scores32.get(s[start:end])
            if score is None:
                continue
            single = single or end == start + 1
            total = float32(here + score)
            if best[end] is None or total > best[end]:
                best[end], back[end], chosen[end] = total, start, ids[s[start:end]]
        if not single:
            total = float32(here + unk_score)
            if best[start + 1] is None or total > best[start + 1]:
                best[start + 1], back[start + 1], chosen[start + 1] = total, start, unk_id
    path, end = [], n
    while end > 0:
        path.append(chosen[end])
        end = back[end]
    return merge_unknown_runs(path[::-1], unk_id)


def merge_unknown_runs(ids: list[int], unk_id: int = 0) -> list[int]:
    """Each run of ``unk_id`` as one, as SentencePiece's processor merges them: ``[5, 0, 0, 7] -> [5, 0, 7]``."""
    return [i for k, i in enumerate(ids) if not (i == unk_id and k > 0 and ids[k - 1] == unk_id)]


# ---- model files


@dataclass
class SentencePieceModel:
    """What :func:`read_model_file` reads from a ``ModelProto``: the pieces in id order as ``(piece, score,
    type)``, the model type and the normaliser's settings (proto2 defaults where a field is absent)."""

    pieces: list[tuple[str, float, int]] = field(default_factory=list)
    model_type: str = "unigram"
    byte_fallback: bool = False
    normalizer: str = ""
    has_charsmap: bool = False
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    treat_whitespace_as_suffix: bool = False


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """``(field number, value)`` of each field of one message: an int (varint, fixed32 as float), or bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = _FLOAT32.unpack(data[pos:pos + 4])[0], pos + 4
        else:
            raise ValueError(f"wire type {wire} (field {number}) is not used by ModelProto")
        if pos > len(data):
            raise ValueError(f"field {number} runs past the end of the data")
        yield number, value


def read_model_file(path_or_bytes) -> SentencePieceModel:
    """Parse a SentencePiece ``.model`` file (or its bytes). ``ValueError`` naming the file if it is not a
    ``ModelProto``. Fields read: ``pieces`` (1: piece 1, score 2, type 3), ``trainer_spec`` (2: model_type 3,
    treat_whitespace_as_suffix 24, byte_fallback 35), ``normalizer_spec`` (3: name 1, precompiled_charsmap 2,
    add_dummy_prefix 3, remove_extra_whitespaces 4, escape_whitespaces 5)."""
    if isinstance(path_or_bytes, (bytes, bytearray)):
        data, where = bytes(path_or_bytes), "the model bytes"
    elif not isinstance(path_or_bytes, (str, os.PathLike)):
        raise TypeError(f"a SentencePiece model is a path or bytes, got {type(path_or_bytes).__name__}")
    else:
        where = str(path_or_bytes)
        if not Path(where).is_file():
            raise FileNotFoundError(f"no SentencePiece model file at {where}")
        data = Path(where).read_bytes()
    model = SentencePieceModel()
    try:
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                piece = dict(_fields(value))
                model.pieces.append((piece.get(1, b"").decode("utf-8"), float(piece.get(2, 0.0)), piece.get(3, NORMAL)))
            elif number == 2 and isinstance(value, bytes):
                spec = dict(_fields(value))
                model.model_type = _MODEL_TYPES.get(spec.get(3, 1), f"type {spec.get(3)}")
                model.treat_whitespace_as_suffix = bool(spec.get(24, 0))
                model.byte_fallback = bool(spec.get(35, 0))
            elif number == 3 and isinstance(value, bytes):
                spec = dict(_fields(value))
                model.normalizer = spec.get(1, b"").decode("utf-8")
                model.has_charsmap = bool(spec.get(2, b""))
                model.add_dummy_prefix = bool(spec.get(3, 1))
                model.remove_extra_whitespaces = bool(spec.get(4, 1))
                model.escape_whitespaces = bool(spec.get(5, 1))
    except (ValueError, UnicodeDecodeError, struct.error) as err:
        raise ValueError(f"{where} is not a SentencePiece model (ModelProto): {err}") from None
    if not model.pieces:
        raise ValueError(f"{where} is not a SentencePiece model (ModelProto): it has no pieces")
    return model


def check_supported(model: SentencePieceModel, where: str) -> None:
    """``ValueError`` naming the setting, for a model llmarch's Unigram cannot encode exactly as SentencePiece."""
    problems = []
    if model.model_type != "unigram":
        problems.append(f"it is a {model.model_type} model, not unigram")
    if model.has_charsmap or model.normalizer not in ("identity", ""):
        problems.append(f"its normaliser is {model.normalizer!r} (only 'identity' is implemented: train with "
                        "normalization_rule_name='identity')")
    if not model.escape_whitespaces or model.treat_whitespace_as_suffix:
        problems.append("spaces are not written as a '▁' prefix (escape_whitespaces / "
                        "treat_whitespace_as_suffix)")
    if model.byte_fallback:
        problems.append("it uses byte fallback")
    odd = sorted({_TYPE_NAMES.get(t, str(t)) for _, _, t in model.pieces} - {"normal", "unknown", "control"})
    if odd:
        problems.append(f"it has {', '.join(odd)} pieces")
    if problems:
        raise ValueError(f"{where}: cannot encode as SentencePiece does: " + "; ".join(problems))
