"""tiktoken's interface over llmarch's byte-level BPE: :class:`Encoding`, :func:`get_encoding`,
:func:`encoding_for_model`.

Book: Tokenizers, "Real vocabularies".

Code written for tiktoken runs unchanged with ``import llmarch.tokenizers as tiktoken``: the names, arguments,
results and exceptions are tiktoken 0.14's (``KeyError`` for an unknown id or a text that is not one token,
``ValueError`` for a disallowed special token), and tiktoken's own test suite passes against this module
(``tests/tiktoken_suite/``). The work is done by :class:`~llmarch.tokenizers.BPETokenizer`, loaded with
:meth:`~llmarch.tokenizers.BPETokenizer.from_tiktoken`; nothing of tiktoken is used.

Two differences remain. The batch methods run on one thread (``num_threads`` is accepted and ignored: the
work is Python, which holds the GIL). And the ``regex`` module classifies characters with a newer Unicode
than tiktoken's Rust engine (16.0), so text with letters or digits added since splits differently, unless
the pattern is pinned to Unicode 16.0 (:func:`~llmarch.tokenizers.pin_unicode`, about 3 times slower).
"""

from __future__ import annotations

import bisect
import operator
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence

import regex

from .bpe import BPETokenizer, _replace_lone_surrogates
from .merging import merge_bytes_by_rank
from .openai import ENCODING_NAMES, encoding_spec

_WHITE_SPACE = regex.compile(r"\s")  # Unicode White_Space: the same 25 characters as tiktoken's engine


class _TokenBytes(dict):
    """``{id: bytes}`` whose misses raise as tiktoken's Rust decoder does: ``OverflowError`` for an id that is not
    an unsigned 32-bit integer, ``KeyError`` for one that no token has."""

    def __missing__(self, token):
        if isinstance(token, int) and not 0 <= token < 2**32:
            raise OverflowError(f"token id {token} does not fit an unsigned 32-bit integer")
        raise KeyError(token)


def _check_allowed(allowed_special):
    """tiktoken's rule: ``allowed_special`` is ``"all"`` or a ``set``/``frozenset`` (a list raises there too)."""
    if allowed_special != "all" and not isinstance(allowed_special, (set, frozenset)):
        raise TypeError(f"allowed_special must be 'all' or a set, got {type(allowed_special).__name__}")
    return allowed_special


def _as_ids(tokens) -> Sequence[int]:
    """``tokens`` as ids, read as tiktoken's Rust side reads them (through ``__index__``): a float or a str
    raises ``TypeError``; a numpy integer or a bool is accepted."""
    tokens = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
    if all(type(t) is int for t in tokens):
        return tokens
    return [operator.index(t) for t in tokens]


class Encoding:
    """A tiktoken ``Encoding``: ``Encoding(name, pat_str=..., mergeable_ranks=..., special_tokens=...)``.

    Book: Tokenizers, "Real vocabularies".

    ``mergeable_ranks``: ``{token bytes: rank}``, the rank is the id and the merge priority;
    ``special_tokens``: ``{text: id}``; ``pat_str``: the pre-tokenisation regex. ``explicit_n_vocab``, when
    given, must equal the number of tokens and ``max_token_value + 1`` (``ValueError`` otherwise).

    >>> enc = get_encoding("cl100k_base")
    >>> enc.encode("hello world"), enc.decode_tokens_bytes([15339, 1917])
    ([15339, 1917], [b'hello', b' world'])
    """

    def __init__(self, name: str, *, pat_str: str, mergeable_ranks: dict[bytes, int],
                 special_tokens: dict[str, int], explicit_n_vocab: int | None = None):
        self.name = name
        self._pat_str = pat_str
        self._mergeable_ranks = mergeable_ranks
        self._special_tokens = special_tokens
        self.max_token_value = max(max(mergeable_ranks.values()), max(special_tokens.values(), default=0))
        if explicit_n_vocab and (len(mergeable_ranks) + len(special_tokens) != explicit_n_vocab
                                 or self.max_token_value != explicit_n_vocab - 1):
            raise ValueError(f"explicit_n_vocab={explicit_n_vocab}, but there are {len(mergeable_ranks)} + "
                             f"{len(special_tokens)} tokens and the largest id is {self.max_token_value}")
        self._bpe = BPETokenizer.from_tiktoken(mergeable_ranks, pat_str, special_tokens)
        self._decoder = _TokenBytes(self._bpe.vocab)  # {id: bytes}, special tokens included
        self._special_token_values = set(special_tokens.values())
        self.special_tokens_set = set(special_tokens)
        self._sorted_tokens: list[bytes] | None = None  # built by the first encode_with_unstable

    def __repr__(self) -> str:
        return f"<Encoding {self.name!r}>"

    # ---- encoding

    def encode_ordinary(self, text: str) -> list[int]:
        """The ids of ``text`` with special tokens read as ordinary text (``encode(text, disallowed_special=())``)."""
        return self._bpe._encode_ordinary(_replace_lone_surrogates(text))

    def encode(self, text: str, *, allowed_special=frozenset(), disallowed_special="all") -> list[int]:
        """The ids of ``text``. A special token in ``allowed_special`` (a set, or ``"all"``) becomes its id; the
        text of one in ``disallowed_special`` (``"all"``: every one not allowed) raises ``ValueError``; one in
        neither is ordinary text. A lone surrogate is encoded as U+FFFD, a surrogate pair as its character."""
        return self._bpe.encode(text, allowed_special=_check_allowed(allowed_special),
                                disallowed_special=disallowed_special)

    def encode_iterable(self, chunks: Iterable[str], *, allowed_special=frozenset(),
                        disallowed_special="all") -> Iterator[int]:
        """Not in tiktoken: :meth:`encode` of the concatenated ``chunks`` (the lines of an open file, say),
        lazily and in bounded memory, with the same ids on any chunking
        (:meth:`~llmarch.tokenizers.BPETokenizer.encode_iterable`)."""
        return self._bpe.encode_iterable(chunks, allowed_special=_check_allowed(allowed_special),
                                         disallowed_special=disallowed_special)

    def encode_batch(self, text: list[str], *, num_threads: int = 8, allowed_special=frozenset(),
                     disallowed_special="all") -> list[list[int]]:
        """:meth:`encode` of each text (on one thread: ``num_threads`` is ignored)."""
        return [self.encode(t, allowed_special=allowed_special, disallowed_special=disallowed_special)
                for t in text]

    def encode_ordinary_batch(self, text: list[str], *, num_threads: int = 8) -> list[list[int]]:
        """:meth:`encode_ordinary` of each text (on one thread)."""
        return [self.encode_ordinary(t) for t in text]

    def encode_to_numpy(self, text: str, *, allowed_special=frozenset(), disallowed_special="all"):
        """:meth:`encode` as a ``numpy`` array of ``uint32``. Unlike :meth:`encode`, and as in tiktoken (whose
        Rust side receives the text as UTF-8), a surrogate code point raises ``UnicodeEncodeError``."""
        import numpy as np

        ids = self.encode(text, allowed_special=allowed_special, disallowed_special=disallowed_special)
        text.encode("utf-8")  # UnicodeEncodeError for a surrogate, as tiktoken's Rust side gives
        return np.array(ids, dtype=np.uint32)

    def encode_single_token(self, text_or_bytes: str | bytes) -> int:
        """The id of the one token (ordinary or special) whose text or bytes this is; ``KeyError`` otherwise."""
        data = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else bytes(text_or_bytes)
        token = self._mergeable_ranks.get(data)
        if token is not None:
            return token
        try:
            return self._special_tokens[data.decode("utf-8")]
        except (UnicodeDecodeError, KeyError):
            raise KeyError(data) from None

    def encode_with_unstable(self, text: str, *, allowed_special=frozenset(), disallowed_special="all"):
        """``(stable ids, completions)``: the ids of ``text`` without the tokens that more text could change,
        and every list of ids that may follow them; ``tiktoken`` calls this API itself unstable.

        The unstable tokens are those of the last pre-token (with the whitespace-only tokens before it, when it
        starts with one). Their bytes ``u`` then begin one of: a single token that starts with ``u``; for
        each cut ``u = p + s``, ``p`` followed by a token that starts with ``s`` (encoded, and cut after the
        token that reaches the length of ``u``); and, when ``u`` ends with a white-space character, ``u``
        merged as two pieces, before and from that character (a pattern may split there). Each
        ``decode_bytes(stable + completion)`` starts with the bytes of ``text``. A surrogate code point raises
        ``UnicodeEncodeError``, as in tiktoken.
        """
        bpe = self._bpe
        allowed, disallowed = bpe._special_sets(_check_allowed(allowed_special), disallowed_special)
        bpe._raise_if_disallowed(disallowed, text)
        text.encode("utf-8")  # UnicodeEncodeError for a surrogate, as tiktoken's Rust side gives
        ids: list[int] = []
        last = 0  # how many of the ids come from the last pre-token (0: a special token ends the text)
        for part, is_special in bpe._split_special(text, allowed):
            if is_special:
                ids.append(bpe.special_tokens[part])
                last = 0
            else:
                for piece in bpe._pretokenize(part):
                    last = len(bpe._cache[piece])
                    ids += bpe._cache[piece]
        if last == 0:
            return ids, []
        last = self._with_whitespace_before(ids, last)
        unstable = b"".join(self._decoder[i] for i in ids[len(ids) - last:])
        stable = ids[: len(ids) - last]
        ranks, completions = self._mergeable_ranks, set()
        completions.update((ranks[t],) for t in self._tokens_starting_with(unstable))
        for cut in range(1, len(unstable)):
            prefix, suffix = unstable[:cut], unstable[cut:]
            for token in self._tokens_starting_with(suffix):
                possible = prefix + token
                try:
                    encoded = self.encode_ordinary(possible.decode("utf-8"))
                except UnicodeDecodeError:
                    encoded = merge_bytes_by_rank(possible, ranks)
                completion, length = [], 0
                for i in encoded:
                    completion.append(i)
                    length += len(self._decoder[i])
                    if length >= len(unstable):
                        break
                completions.add(tuple(completion))
        size = self._last_whitespace_size(unstable)
        if 0 < size < len(unstable):
            completions.add(tuple(merge_bytes_by_rank(unstable[:-size], ranks)
                                  + merge_bytes_by_rank(unstable[-size:], ranks)))
        return stable, [list(c) for c in completions]

    def _with_whitespace_before(self, ids: list[int], last: int) -> int:
        """``last`` grown over the whitespace-only tokens before the last pre-token's, when its first token is
        whitespace-only (a pattern may split a run of whitespace differently once more text comes)."""
        if last and self._is_whitespace_token(ids[-last]):
            while last < len(ids) and self._is_whitespace_token(ids[-last - 1]):
                last += 1
        return last

    def _tokens_starting_with(self, prefix: bytes) -> list[bytes]:
        """The ordinary tokens whose bytes start with ``prefix`` (a range of the sorted tokens)."""
        if self._sorted_tokens is None:
            self._sorted_tokens = sorted(self._mergeable_ranks)
        tokens = self._sorted_tokens
        found, k = [], bisect.bisect_left(tokens, prefix)
        while k < len(tokens) and tokens[k].startswith(prefix):
            found.append(tokens[k])
            k += 1
        return found

    @staticmethod
    def _last_whitespace_size(data: bytes) -> int:
        """The length in bytes of the last character of ``data`` if it is white space (Unicode White_Space),
        else 0."""
        start = len(data) - 1
        while start > 0 and len(data) - start < 4 and 0x80 <= data[start] < 0xC0:
            start -= 1
        try:
            last = data[start:].decode("utf-8")
        except UnicodeDecodeError:
            return 0
        return len(data) - start if _WHITE_SPACE.fullmatch(last) else 0

    def _encode_single_piece(self, text_or_bytes: str | bytes) -> list[int]:
        """The ids of one piece merged whole, without the regex split and without special tokens."""
        data = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else bytes(text_or_bytes)
        return self._merge_piece(data)

    def _encode_only_native_bpe(self, text: str) -> list[int]:
        """:meth:`encode_ordinary` with every pre-token merged afresh (no cache, no special tokens)."""
        return [i for piece in self._bpe._pretokenize(text) for i in self._merge_piece(piece.encode("utf-8"))]

    def _merge_piece(self, data: bytes) -> list[int]:
        if not data:
            return []
        token = self._mergeable_ranks.get(data)
        return [token] if token is not None else merge_bytes_by_rank(data, self._mergeable_ranks)

    def _encode_bytes(self, text: bytes) -> list[int]:
        """The ids of bytes that may not be UTF-8: the valid prefix is encoded as text; the tokens of its last
        pre-token (and the whitespace-only tokens before them, when that pre-token starts with one) are merged
        again together with the invalid rest, as one piece."""
        try:
            return self.encode_ordinary(text.decode("utf-8"))
        except UnicodeDecodeError as err:
            valid = err.start
        pieces = self._bpe._pretokenize(text[:valid].decode("utf-8"))
        ids = self._bpe._encode_pretokens(pieces)
        redo = self._with_whitespace_before(ids, len(self._bpe._cache[pieces[-1]]) if pieces else 0)
        unstable = b"".join(self._decoder[i] for i in ids[len(ids) - redo:]) + text[valid:]
        return ids[: len(ids) - redo] + self._merge_piece(unstable)

    def _is_whitespace_token(self, token: int) -> bool:
        return all(b in b" \n\t" for b in self._decoder[token])

    # ---- decoding

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of ``tokens``; ``KeyError`` for an id no token has."""
        return b"".join(map(self._decoder.__getitem__, _as_ids(tokens)))

    def decode(self, tokens: Sequence[int], errors: str = "replace") -> str:
        """The text of ``tokens``; bytes that are not UTF-8 become U+FFFD (``errors="replace"``)."""
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)

    def decode_single_token_bytes(self, token: int) -> bytes:
        """The bytes of one token (ordinary or special); ``KeyError`` if no token has this id."""
        return self._decoder[operator.index(token)]

    def decode_tokens_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        """The bytes of each token."""
        return [self._decoder[t] for t in _as_ids(tokens)]

    def decode_with_offsets(self, tokens: Sequence[int]) -> tuple[str, list[int]]:
        """The text and, for each token, the index of the first character that holds one of its bytes.

        A character starts at each byte that is not a UTF-8 continuation byte (``0b10xxxxxx``); a token that
        starts with a continuation byte belongs to the character before it. ``UnicodeDecodeError`` if the
        bytes are not UTF-8.
        """
        chunks = self.decode_tokens_bytes(tokens)
        offsets, n_chars = [], 0
        for data in chunks:
            starts_inside = bool(data) and 0x80 <= data[0] < 0xC0
            offsets.append(max(0, n_chars - starts_inside))
            n_chars += sum(1 for b in data if not 0x80 <= b < 0xC0)
        return b"".join(chunks).decode("utf-8", errors="strict"), offsets

    def decode_batch(self, batch: Sequence[Sequence[int]], *, errors: str = "replace",
                     num_threads: int = 8) -> list[str]:
        """:meth:`decode` of each list of ids."""
        return [self.decode(tokens, errors=errors) for tokens in batch]

    def decode_bytes_batch(self, batch: Sequence[Sequence[int]], *, num_threads: int = 8) -> list[bytes]:
        """:meth:`decode_bytes` of each list of ids."""
        return [self.decode_bytes(tokens) for tokens in batch]

    # ---- the vocabulary

    def token_byte_values(self) -> list[bytes]:
        """The bytes of every ordinary token, sorted."""
        return sorted(self._mergeable_ranks)

    @property
    def eot_token(self) -> int:
        """The id of ``<|endoftext|>``."""
        return self._special_tokens["<|endoftext|>"]

    def is_special_token(self, token: int) -> bool:
        return token in self._special_token_values

    @property
    def n_vocab(self) -> int:
        """``max_token_value + 1``."""
        return self.max_token_value + 1

    # ---- pickling: a registered encoding by its name, another by its arguments

    def __getstate__(self) -> object:
        if _ENCODINGS.get(self.name) is self:
            return self.name
        return {"name": self.name, "pat_str": self._pat_str, "mergeable_ranks": self._mergeable_ranks,
                "special_tokens": self._special_tokens}

    def __setstate__(self, state: object) -> None:
        if isinstance(state, str):
            self.__dict__ = get_encoding(state).__dict__
        else:
            self.__init__(**state)


# --------------------------------------------------------------------------------------------------------------
# The registry

_ENCODINGS: dict[str, Encoding] = {}
_LOCK = threading.RLock()


def list_encoding_names() -> list[str]:
    """The names :func:`get_encoding` accepts."""
    return list(ENCODING_NAMES)


def get_encoding(encoding_name: str) -> Encoding:
    """The :class:`Encoding` called ``encoding_name`` (built from the installed files once, then shared).

    Book: Tokenizers, "Real vocabularies".
    """
    if not isinstance(encoding_name, str):
        raise ValueError(f"Expected a string in get_encoding, got {type(encoding_name)}")
    with _LOCK:
        if encoding_name not in _ENCODINGS:
            if encoding_name not in ENCODING_NAMES:
                raise ValueError(f"Unknown encoding {encoding_name}; the encodings are {list(ENCODING_NAMES)}")
            _ENCODINGS[encoding_name] = Encoding(**encoding_spec(encoding_name))
        return _ENCODINGS[encoding_name]


MODEL_TO_ENCODING: Mapping[str, str] = {
    **dict.fromkeys(["o1", "o3", "o4-mini", "gpt-5", "gpt-4.1", "gpt-4o"], "o200k_base"),
    **dict.fromkeys(["gpt-4", "gpt-3.5-turbo", "gpt-3.5", "gpt-35-turbo", "davinci-002", "babbage-002",
                     "text-embedding-ada-002", "text-embedding-3-small", "text-embedding-3-large"], "cl100k_base"),
    **dict.fromkeys(["text-davinci-003", "text-davinci-002", "code-davinci-002", "code-davinci-001",
                     "code-cushman-002", "code-cushman-001", "davinci-codex", "cushman-codex"], "p50k_base"),
    **dict.fromkeys(["text-davinci-edit-001", "code-davinci-edit-001"], "p50k_edit"),
    **dict.fromkeys(["text-davinci-001", "text-curie-001", "text-babbage-001", "text-ada-001", "davinci", "curie",
                     "babbage", "ada", "text-similarity-davinci-001", "text-similarity-curie-001",
                     "text-similarity-babbage-001", "text-similarity-ada-001", "text-search-davinci-doc-001",
                     "text-search-curie-doc-001", "text-search-babbage-doc-001", "text-search-ada-doc-001",
                     "code-search-babbage-code-001", "code-search-ada-code-001"], "r50k_base"),
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
}
"""Model names and their encodings (tiktoken 0.14's ``tiktoken/model.py``)."""

MODEL_PREFIX_TO_ENCODING: Mapping[str, str] = {
    **dict.fromkeys(["o1-", "o3-", "o4-mini-", "gpt-5", "gpt-4.5-", "gpt-4.1-", "chatgpt-4o-", "gpt-4o-",
                     "ft:gpt-4o"], "o200k_base"),
    **dict.fromkeys(["gpt-4-", "gpt-3.5-turbo-", "gpt-35-turbo-", "ft:gpt-4", "ft:gpt-3.5-turbo",
                     "ft:davinci-002", "ft:babbage-002"], "cl100k_base"),
    "gpt-oss-": "o200k_harmony",
}
"""Prefixes of model names (e.g. ``gpt-4o-2024-05-13``), tried in this order after an exact name."""


def encoding_name_for_model(model_name: str) -> str:
    """The name of a model's encoding; ``KeyError`` for a model this table does not know."""
    if model_name in MODEL_TO_ENCODING:
        return MODEL_TO_ENCODING[model_name]
    for prefix, name in MODEL_PREFIX_TO_ENCODING.items():
        if model_name.startswith(prefix):
            return name
    raise KeyError(f"Could not automatically map {model_name} to a tokeniser; use get_encoding(name) with one "
                   f"of {list(ENCODING_NAMES)}")


def encoding_for_model(model_name: str) -> Encoding:
    """:func:`get_encoding` of the model's encoding; ``KeyError`` for an unknown model."""
    return get_encoding(encoding_name_for_model(model_name))
