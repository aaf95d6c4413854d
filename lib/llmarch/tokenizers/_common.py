"""Helpers shared by the tokenizer modules: argument checks that raise ``TypeError``/``ValueError`` naming the
problem, the random generator behind every ``seed`` argument, and the readable JSON files of ``save``/``load``."""

from __future__ import annotations

import json
import operator
import os
import random
from collections.abc import Iterable, Mapping


# --------------------------------------------------------------------------------------------------------------
# argument checks


def _type_name(value) -> str:
    return type(value).__name__


def _check_int(name: str, value, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {_type_name(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_type_name(value)}")
    return value


def _check_str(name: str, value, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {_type_name(value)}")
    if non_empty and not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _check_probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1], got {_type_name(value)}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return float(value)


def _check_choice(name: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_word_counts(word_counts, name: str = "word_counts") -> dict[str, int]:
    """A ``{word: count}`` mapping with non-empty string words and positive int counts."""
    if not isinstance(word_counts, Mapping):
        raise TypeError(f"{name} must be a dict {{word: count}}, got {_type_name(word_counts)}")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word:
            raise ValueError(f"{name} has the key {word!r}; words must be non-empty strings")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"{name}[{word!r}] must be an int count, got {_type_name(count)}")
        if count < 1:
            raise ValueError(f"{name}[{word!r}] = {count}; counts must be positive")
    return dict(word_counts)


def _check_special_tokens(special_tokens, name: str = "special_tokens") -> list[str]:
    if isinstance(special_tokens, str) or not isinstance(special_tokens, Iterable):
        raise TypeError(f"{name} must be a list of strings, got {_type_name(special_tokens)}")
    tokens = list(special_tokens)
    for tok in tokens:
        _check_str(f"each of {name}", tok, non_empty=True)
    duplicates = sorted({t for t in tokens if tokens.count(t) > 1})
    if duplicates:
        raise ValueError(f"{name} lists {duplicates} more than once")
    return tokens


def _check_ids(ids, vocab_size: int) -> list[int]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be a sequence of ints, got {_type_name(ids)}")
    out = []
    for k, i in enumerate(ids):
        if isinstance(i, bool):
            raise TypeError(f"ids[{k}] must be an int, got bool")
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"ids[{k}] must be an int, got {_type_name(i)}") from None
        if not 0 <= i < vocab_size:
            raise ValueError(f"ids[{k}] = {i} is not a token id: the vocabulary has ids 0..{vocab_size - 1}")
        out.append(i)
    return out


def _make_rng(seed) -> random.Random:
    """``None`` -> fresh randomness, an int -> a seeded generator, a ``random.Random`` -> used as is."""
    if seed is None:
        return random.Random()
    if isinstance(seed, random.Random):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be None, an int or a random.Random, got {_type_name(seed)}")
    return random.Random(seed)


def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {_type_name(path)}")
    return os.fspath(path)


def _read_json(path, kind: str) -> dict:
    path = _check_path(path)
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a JSON tokenizer file: {err}") from None
    if not isinstance(data, dict) or data.get("type") != kind:
        found = data.get("type") if isinstance(data, dict) else _type_name(data)
        raise ValueError(f"{path} holds {found!r}, not a {kind!r} file")
    if data.get("version") != 1:
        raise ValueError(f"{path} has format version {data.get('version')!r}; this code reads version 1")
    return data


def _write_json_lines(path, header: dict, list_key: str, rows: list) -> None:
    """JSON with the header keys first and one row of ``list_key`` per line, so the file reads well and diffs well."""
    path = _check_path(path)
    lines = ["{"]
    for key, value in header.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    lines.append(f"  {json.dumps(list_key)}: [")
    for k, row in enumerate(rows):
        lines.append("    " + json.dumps(row, ensure_ascii=False) + ("," if k < len(rows) - 1 else ""))
    lines += ["  ]", "}"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
