"""Byte-level BPE (GPT-2, GPT-4, GPT-4o) with BPE-dropout: training, the published vocabularies, encoding.

Book: Tokenizers, "Byte-level BPE" and "Real vocabularies".

:class:`BPETokenizer` works on UTF-8 bytes, so any string round-trips. A tokenizer it trains numbers the bytes
``0..255``, ``merges[i] = (id_a, id_b)`` creates id ``256 + i`` and special tokens take the ids after the last
merge. A published vocabulary (:meth:`BPETokenizer.from_tiktoken`, :meth:`BPETokenizer.from_gpt2_files`) keeps
its official ids: a byte-to-id table says which id each byte has. In every case a merge's priority is the id
it creates (the smaller, the earlier). Text is cut at special tokens, then into pre-tokens by a regex
(:mod:`~llmarch.tokenizers.pretokenize`); merges never cross pre-tokens. The inner loops (pair counts of
training, the merge of one pre-token) are in :mod:`~llmarch.tokenizers.merging`.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain

from ._common import (
    _check_choice,
    _check_ids,
    _check_int,
    _check_probability,
    _check_special_tokens,
    _check_str,
    _make_rng,
    _read_json,
    _type_name,
    _write_json_lines,
)
from .merging import _merge_by_rank_scan, _PairIndex, merge_by_rank_heap, merge_bytes_by_rank, merge_with_dropout
from .pretokenize import GPT2_SPLIT_PATTERN, compile_split_pattern, split_pieces
from .vocab_files import read_gpt2_files, read_tiktoken_ranks

_SURROGATE = re.compile("[\ud800-\udfff]")
_HEAP_MERGE_FROM = 24  # pre-tokens of at least this many bytes are merged with the priority queue
_CACHE_LIMIT = 200_000  # distinct pre-tokens remembered between calls of encode
TIE_BREAKS = ("smallest_ids", "greatest_bytes")


def _replace_lone_surrogates(text: str) -> str:
    """What tiktoken does to a str that UTF-8 cannot encode: a surrogate pair becomes its character (a round trip
    through UTF-16), a lone surrogate becomes U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class _GreatestBytesFirst:
    """Heap key that pops the lexicographically greatest ``(bytes_a, bytes_b)`` first (a min-heap, reversed)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[bytes, bytes]):
        self.key = key

    def __lt__(self, other: _GreatestBytesFirst) -> bool:
        return self.key > other.key

    def __eq__(self, other) -> bool:
        return isinstance(other, _GreatestBytesFirst) and self.key == other.key


class _PieceCache(dict):
    """``{pre-token: token ids}``; a missing pre-token is merged on first use."""

    def __init__(self, encode_piece):
        super().__init__()
        self.encode_piece = encode_piece

    def __missing__(self, piece: str) -> tuple[int, ...]:
        ids = self[piece] = self.encode_piece(piece)
        return ids


# --------------------------------------------------------------------------------------------------------------
# Byte-level BPE with BPE-dropout


class BPETokenizer:
    """Byte-level BPE: any string round-trips; trained here or loaded from GPT-2's, GPT-4's or GPT-4o's files.

    Book: Tokenizers, "Byte-level BPE" and "Real vocabularies".

    Trained (``BPETokenizer(merges, special_tokens, pattern)`` or :meth:`train`): ids ``0..255`` are the bytes,
    ``merges[i] = (id_a, id_b)`` makes id ``256 + i`` with bytes ``vocab[id_a] + vocab[id_b]``, and special
    tokens take the ids after the last merge, in the order given. Loaded (:meth:`from_tiktoken`,
    :meth:`from_gpt2_files`): the official ids; ``byte_ids[b]`` is the id of byte ``b``. ``vocab`` maps every
    id to its bytes. Encoding: cut the text at the allowed special tokens (longest first), cut each piece into
    pre-tokens with ``pattern``, turn each pre-token into its bytes' ids and merge, smallest merged id first.

    >>> tok = BPETokenizer().train("low lower lowest " * 20, vocab_size=262)
    >>> [tok.vocab[i] for i in tok.encode(" lowest lower")]
    [b' lowe', b'st', b' lower']
    >>> tok.decode(tok.encode("naïve 🙂\\r\\n"))
    'naïve 🙂\\r\\n'
    """

    def __init__(self, merges=(), special_tokens=(), pattern: str | None = GPT2_SPLIT_PATTERN):
        self._setup(merges, special_tokens, pattern)

    def _setup(self, merges, special_tokens, pattern) -> None:
        """The layout of a trained tokenizer: bytes are ``0..255``, merge ``k`` is ``256 + k``."""
        if isinstance(merges, (str, bytes)) or not isinstance(merges, Iterable):
            raise TypeError(f"merges must be a list of (id_a, id_b) pairs, got {_type_name(merges)}")
        checked: list[tuple[int, int]] = []
        ranks: dict[tuple[int, int], int] = {}
        vocab = {i: bytes([i]) for i in range(256)}
        for k, pair in enumerate(merges):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"merges[{k}] = {pair!r} is not a pair (id_a, id_b)")
            a, b = pair
            for x in (a, b):
                if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 256 + k:
                    raise ValueError(
                        f"merges[{k}] = {pair!r}: ids must be ints that exist before this merge (0..{255 + k})"
                    )
            if (a, b) in ranks:
                raise ValueError(f"merges[{k}] = {pair!r} repeats merges[{ranks[(a, b)] - 256}]")
            checked.append((a, b))
            ranks[(a, b)] = 256 + k
            vocab[256 + k] = vocab[a] + vocab[b]
        specials = _check_special_tokens(special_tokens)
        special_ids = {tok: 256 + len(checked) + j for j, tok in enumerate(specials)}
        self._install(vocab, checked, ranks, list(range(256)), special_ids, pattern, whole_pieces=None)

    def _install(self, vocab, merges, ranks, byte_ids, special_tokens, pattern, whole_pieces) -> None:
        if pattern is not None:
            _check_str("pattern", pattern, non_empty=True)
        self._split = None if pattern is None else compile_split_pattern(pattern)  # fails now, not at encode
        self.pattern = pattern
        self._merges = merges  # None: built on first use (see _pair_table)
        self._pair_ranks = ranks
        self.byte_ids = byte_ids
        self._whole_pieces = whole_pieces  # {bytes: id} of a tiktoken vocabulary: merged by byte strings
        self.special_tokens = dict(special_tokens)
        for tok, i in reversed(self.special_tokens.items()):  # an id with two names decodes to the first
            vocab[i] = tok.encode("utf-8")
        self.vocab = vocab
        self._special_regexes: dict[frozenset, re.Pattern | None] = {}
        self._prefix_sets: dict[frozenset, frozenset] = {}
        self._cache = _PieceCache(self._encode_piece)

    @property
    def vocab_size(self) -> int:
        """One more than the largest id: ``256 + len(merges) + len(special_tokens)`` when trained here,
        tiktoken's ``n_vocab`` for a loaded vocabulary (which may leave ids unused)."""
        return max(self.vocab) + 1

    # ---- loading published vocabularies

    @classmethod
    def from_tiktoken(cls, ranks, pattern: str | None, special_tokens: Mapping[str, int] | None = None):
        """A tokenizer from a tiktoken vocabulary: ``ranks`` is a rank file's path or ``{token bytes: rank}``.

        Book: Tokenizers, "Real vocabularies".

        The rank is the token's id. tiktoken merges the adjacent pair whose concatenation has the smallest rank
        (the leftmost among equal ranks), so every way of writing a token as two tokens is a merge
        (:attr:`merges`, built on first use); encoding merges by the ranks of byte strings
        (:func:`~llmarch.tokenizers.merging.merge_bytes_by_rank`), and a pre-token that is itself a token is
        taken whole, as tiktoken does. ``ranks`` is kept, not copied. ``pattern``: e.g.
        :data:`~llmarch.tokenizers.CL100K_SPLIT_PATTERN`. ``special_tokens``: ``{text: id}`` (the official
        ids, e.g. ``{"<|endoftext|>": 100257}``).
        """
        if not isinstance(ranks, Mapping):
            ranks = read_tiktoken_ranks(ranks)
        vocab = {rank: token for token, rank in ranks.items()}
        if len(vocab) != len(ranks) or not all(type(t) is bytes and t for t in ranks) or not all(
                type(r) is int and r >= 0 for r in vocab):
            cls._explain_bad_ranks(ranks)
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise ValueError(f"ranks lack the single bytes {missing[:8]}: byte-level BPE needs all 256")
        byte_ids = [ranks[bytes([b])] for b in range(256)]
        tok = cls.__new__(cls)
        tok._install(vocab, None, None, byte_ids, cls._check_special_ids(special_tokens, vocab), pattern,
                     whole_pieces=ranks)
        return tok

    @staticmethod
    def _explain_bad_ranks(ranks: Mapping) -> None:
        """Raise the error that names the first bad entry of ``ranks`` (the fast checks found one)."""
        seen: dict[int, bytes] = {}
        for token, rank in ranks.items():
            if not isinstance(token, bytes) or not token:
                raise TypeError(f"ranks must map non-empty bytes to ints; found the key {token!r}")
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise ValueError(f"ranks[{token!r}] = {rank!r} is not an int >= 0")
            if rank in seen:
                raise ValueError(f"rank {rank} is given to both {seen[rank]!r} and {token!r}")
            seen[rank] = token

    def _pair_table(self) -> None:
        """``merges`` and the pair ranks of a tiktoken vocabulary, built on first use (loading does not need
        them: :func:`~llmarch.tokenizers.merging.merge_bytes_by_rank` merges by the ranks of byte strings).
        Every way of writing a token as two tokens is a merge whose rank is the token's id."""
        rank_of, vocab = self._whole_pieces.get, self.vocab
        pair_ranks: dict[tuple[int, int], int] = {}
        for rank in sorted(self._whole_pieces.values()):
            token = vocab[rank]
            for cut in range(1, len(token)):
                a = rank_of(token[:cut])
                if a is not None:
                    b = rank_of(token[cut:])
                    if b is not None:
                        pair_ranks[(a, b)] = rank
        self._merges, self._pair_ranks = list(pair_ranks), pair_ranks

    @property
    def merges(self) -> list[tuple[int, int]]:
        """The merges ``(id_a, id_b)`` in priority order (for a loaded tiktoken vocabulary, built on first use)."""
        if self._merges is None:
            self._pair_table()
        return self._merges

    @property
    def _ranks(self) -> dict[tuple[int, int], int]:
        """``{(id_a, id_b): id of the merged token}``, the priority of each merge."""
        if self._pair_ranks is None:
            self._pair_table()
        return self._pair_ranks

    @classmethod
    def from_gpt2_files(cls, vocab_json, merges_txt, special_tokens: Mapping[str, int] | None = None,
                        pattern: str | None = GPT2_SPLIT_PATTERN):
        """A tokenizer from GPT-2's ``encoder.json`` (or ``vocab.json``) and ``vocab.bpe`` (or ``merges.txt``).

        Book: Tokenizers, "Real vocabularies".

        Merge ``k`` of the file joins two tokens into the token with the id ``vocab.json`` gives it; these ids
        must grow with ``k`` (they do in GPT-2: merge ``k`` is id ``256 + k``) since a merge's priority is its
        id. ``special_tokens`` (``{text: id}``): by default the tokens of ``vocab.json`` that are neither a
        byte nor made by a merge (GPT-2's ``<|endoftext|>``, 50256).
        """
        token_ids, merge_list = read_gpt2_files(vocab_json, merges_txt)
        vocab = {i: t for t, i in token_ids.items()}
        if len(vocab) != len(token_ids):
            raise ValueError(f"{vocab_json} gives one id to two tokens")
        missing = [b for b in range(256) if bytes([b]) not in token_ids]
        if missing:
            raise ValueError(f"{vocab_json} lacks the single bytes {missing[:8]}: byte-level BPE needs all 256")
        merges, ranks, last = [], {}, -1
        for k, (left, right) in enumerate(merge_list):
            where = f"{merges_txt}, merge {k}"
            for part in (left, right, left + right):
                if part not in token_ids:
                    raise ValueError(f"{where} ({left!r} + {right!r}): {part!r} is not in {vocab_json}")
            pair, new = (token_ids[left], token_ids[right]), token_ids[left + right]
            if new <= last:
                raise ValueError(f"{where} makes id {new}, not above the previous merge's id {last}: the ids of "
                                 "merged tokens must grow in the order of the merges")
            merges.append(pair)
            ranks[pair] = last = new
        if special_tokens is None:
            made = set(ranks.values()) | {token_ids[bytes([b])] for b in range(256)}
            special_tokens = {t.decode("utf-8"): i for i, t in vocab.items() if i not in made}
        byte_ids = [token_ids[bytes([b])] for b in range(256)]
        tok = cls.__new__(cls)
        tok._install(vocab, merges, ranks, byte_ids, cls._check_special_ids(special_tokens, vocab), pattern,
                     whole_pieces=None)
        return tok

    @staticmethod
    def _check_special_ids(special_tokens, vocab: dict[int, bytes]) -> dict[str, int]:
        if special_tokens is None:
            return {}
        if not isinstance(special_tokens, Mapping):
            raise TypeError(f"special_tokens must be a dict {{text: id}}, got {_type_name(special_tokens)}")
        for text, i in special_tokens.items():
            _check_str("each special token", text, non_empty=True)
            _check_int(f"the id of {text!r}", i, minimum=0)
            if i in vocab and vocab[i] != text.encode("utf-8"):
                raise ValueError(f"special token {text!r} has id {i}, which is the token {vocab[i]!r}")
        return dict(special_tokens)

    # ---- special tokens

    def _special_sets(self, allowed_special, disallowed_special) -> tuple[frozenset, frozenset]:
        """tiktoken's rule: ``(allowed, disallowed)`` special tokens; ``"all"`` disallows every one not allowed."""
        registered = frozenset(self.special_tokens)
        if allowed_special == "all":
            allowed = registered
        else:
            if isinstance(allowed_special, str) or not isinstance(allowed_special, Iterable):
                raise TypeError(f"allowed_special must be 'all' or a set of strings, got {allowed_special!r}")
            allowed = self._check_token_set("allowed_special", allowed_special) & registered  # others ignored
        if disallowed_special == "all":
            disallowed = registered - allowed
        elif isinstance(disallowed_special, str) or not isinstance(disallowed_special, Iterable):
            raise TypeError(f"disallowed_special must be 'all' or a set of strings, got {disallowed_special!r}")
        else:
            disallowed = self._check_token_set("disallowed_special", disallowed_special)
        return allowed, disallowed

    def _raise_if_disallowed(self, disallowed: frozenset, text: str) -> None:
        found = self._special_regex(disallowed).search(text) if disallowed else None
        if found:
            raise ValueError(
                f"the text holds the special token {found.group()!r} at position {found.start()}, which is "
                "not allowed: pass allowed_special={...} (or 'all') to encode it as its id, or leave it out "
                "of disallowed_special (e.g. disallowed_special=()) to encode it as ordinary text"
            )

    @staticmethod
    def _check_token_set(name: str, tokens) -> frozenset:
        tokens = list(tokens)
        for t in tokens:
            if not isinstance(t, str) or not t:
                raise TypeError(f"{name} must hold non-empty strings, got {t!r}")
        return frozenset(tokens)

    def _special_regex(self, specials: frozenset) -> re.Pattern | None:
        if specials not in self._special_regexes:
            by_length = sorted(specials, key=lambda s: (-len(s), s))  # the longest match wins
            self._special_regexes[specials] = (
                re.compile("(" + "|".join(map(re.escape, by_length)) + ")") if specials else None
            )
        return self._special_regexes[specials]

    def _split_special(self, text: str, specials: frozenset) -> list[tuple[str, bool]]:
        regex = self._special_regex(specials)
        if regex is None:
            return [(text, False)] if text else []
        parts = regex.split(text)  # the capture group keeps the separators at odd positions
        return [(p, k % 2 == 1) for k, p in enumerate(parts) if p]

    # ---- training

    def train(self, text: str, vocab_size: int, special_tokens=(), tie_break: str = "smallest_ids") -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``; returns ``self``.

        Book: Tokenizers, "Byte-level BPE".

        Special tokens are cut out of the training text first (they are never merged into anything). The
        pre-tokens are counted once; each distinct pre-token becomes a list of byte ids with its frequency.
        Then, per merge: take the most frequent adjacent pair, rewrite only the pre-tokens that contain it and
        update only the counts that change (an index from each pair to the pre-tokens holding it, and a heap
        with lazy deletion to find the maximum). Training stops early when no pair is left, so the vocabulary
        can come out smaller than ``vocab_size``.

        ``tie_break`` decides among equally frequent pairs: ``"smallest_ids"`` (the default) takes the smallest
        ``(id_a, id_b)``; ``"greatest_bytes"`` the lexicographically greatest ``(bytes_a, bytes_b)``, the rule of
        Stanford CS336's assignment 1 tests. (Hugging Face ``tokenizers`` takes the smallest pair of its own ids,
        which number the bytes in the order of their characters in GPT-2's byte-to-unicode alphabet, where
        the space comes after every printable byte, and merged tokens in the order they were made.)
        """
        _check_str("text", text)
        _check_int("vocab_size", vocab_size)
        _check_choice("tie_break", tie_break, TIE_BREAKS)
        specials = _check_special_tokens(special_tokens)
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the 256 bytes and {len(specials)} special tokens alone "
                f"need {256 + len(specials)} ids"
            )
        self._setup((), specials, self.pattern)
        pretokens: Counter[str] = Counter()
        for chunk, is_special in self._split_special(text, frozenset(specials)):
            if not is_special:
                pretokens.update(self._pretokenize(chunk))
        words = [list(p.encode("utf-8")) for p in pretokens]
        index = _PairIndex(words, list(pretokens.values()))
        token_bytes = [bytes([i]) for i in range(256)]
        if tie_break == "smallest_ids":
            def entry(count, a, b):
                return (-count, a, b)
        else:
            def entry(count, a, b):
                return (-count, _GreatestBytesFirst((token_bytes[a], token_bytes[b])), a, b)
        heap = [entry(c, a, b) for (a, b), c in index.counts.items()]
        heapq.heapify(heap)
        merges: list[tuple[int, int]] = []
        for new_id in range(256, vocab_size - len(specials)):
            while heap:
                top = heap[0]
                if index.counts.get((top[-2], top[-1])) == -top[0]:
                    break
                heapq.heappop(heap)  # stale: the count changed after this entry was pushed
            if not heap:
                break
            top = heapq.heappop(heap)
            a, b = top[-2], top[-1]
            merges.append((a, b))
            token_bytes.append(token_bytes[a] + token_bytes[b])
            changed, _ = index.merge((a, b), new_id)
            for p in changed:
                c = index.counts.get(p)
                if c:
                    heapq.heappush(heap, entry(c, p[0], p[1]))
        self._setup(merges, specials, self.pattern)
        return self

    # ---- encoding

    def _pretokenize(self, text: str) -> list[str]:
        if self._split is None:
            return [text] if text else []
        return split_pieces(self._split, text)

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        data = piece.encode("utf-8")
        whole = self._whole_pieces
        if whole is not None:
            token = whole.get(data)
            return (token,) if token is not None else tuple(merge_bytes_by_rank(data, whole))
        byte_ids = self.byte_ids
        ids = [byte_ids[b] for b in data]
        if len(ids) >= _HEAP_MERGE_FROM:
            return tuple(merge_by_rank_heap(ids, self._ranks))
        return tuple(_merge_by_rank_scan(ids, self._ranks))

    def _encode_ordinary(self, text: str) -> list[int]:
        """Ids of text without special tokens."""
        return self._encode_pretokens(self._pretokenize(text))

    def _encode_pretokens(self, pieces: list[str]) -> list[int]:
        """Ids of pre-tokens already split (each distinct pre-token is merged once, then remembered)."""
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        return list(chain.from_iterable(map(cache.__getitem__, pieces)))

    def encode(self, text: str, dropout: float = 0.0, seed=None, allowed_special=(),
               disallowed_special="all") -> list[int]:
        """Token ids of ``text``; with ``dropout > 0``, BPE-dropout.

        Book: Tokenizers, "Byte-level BPE" (BPE-dropout: Provilkov et al., 2020) and "Real vocabularies".

        Special tokens follow tiktoken: those in ``allowed_special`` (a set, or ``"all"``) become their single
        id; the text of a special token in ``disallowed_special`` (by default every one not allowed) raises
        ``ValueError``; one in neither is encoded as ordinary text. A lone surrogate (a str UTF-8 cannot encode)
        is encoded as U+FFFD, as tiktoken does.

        ``dropout = p``: while segmenting each pre-token, every applicable merge is skipped with probability
        ``p`` at every step (the first merge not skipped, in priority order, is applied; the word is final
        when all are skipped). ``p = 0`` is plain BPE, ``p = 1`` gives single bytes. ``seed``: an int (same ids
        every time), a ``random.Random`` (shared state), or ``None`` (fresh randomness).
        """
        _check_str("text", text)
        dropout = _check_probability("dropout", dropout)
        rng = _make_rng(seed) if dropout > 0 else None
        allowed, disallowed = self._special_sets(allowed_special, disallowed_special)
        self._raise_if_disallowed(disallowed, text)
        text = _replace_lone_surrogates(text)
        if rng is None:
            return self._encode_parts(self._split_special(text, allowed))
        ids: list[int] = []
        for chunk, is_special in self._split_special(text, allowed):
            if is_special:
                ids.append(self.special_tokens[chunk])
            else:
                byte_ids = self.byte_ids
                for piece in self._pretokenize(chunk):
                    ids += merge_with_dropout([byte_ids[b] for b in piece.encode("utf-8")], self._ranks, dropout, rng)
        return ids

    def encode_iterable(self, chunks: Iterable[str], allowed_special=(), disallowed_special="all",
                        buffer_chars: int = 65536) -> Iterator[int]:
        """The ids of the concatenated ``chunks`` (e.g. the lines of an open file), lazily, in bounded memory.

        Book: Tokenizers, "Real vocabularies".

        The ids equal ``encode("".join(chunks), allowed_special=..., disallowed_special=...)`` on any chunking
        (a property test checks GPT-2's, GPT-4's and GPT-4o's patterns). Chunks are gathered until they hold
        ``buffer_chars`` characters (1: each chunk as it comes); then the pre-tokens that no later text can
        change are encoded, and the rest of the text is held back and split again with what follows. A
        pre-token is final when it ends at least 3 characters before the end of the text read so far (the
        longest look-ahead of these patterns: a contraction ``'ll`` after a word), before the trailing run of
        whitespace (whose split depends on what follows: ``\\s+(?!\\S)``, ``\\s*[\\r\\n]``, ``\\s++$``) and
        before a trailing prefix of a special token (which the next chunk may complete). A pattern of your own
        that looks further ahead needs its own margin. A disallowed special token raises ``ValueError`` when
        the text that completes it is read (after the ids before it). The memory held is ``buffer_chars`` plus
        one chunk, the ids of one buffer and the text held back (one run of whitespace plus a few pre-tokens,
        except in a text that never stops being whitespace or one word).
        """
        if isinstance(chunks, str) or not isinstance(chunks, Iterable):
            raise TypeError(f"chunks must be an iterable of str (e.g. an open text file), got {_type_name(chunks)}")
        _check_int("buffer_chars", buffer_chars, minimum=1)
        allowed, disallowed = self._special_sets(allowed_special, disallowed_special)
        return chain.from_iterable(self._id_batches(chunks, allowed, disallowed, buffer_chars))

    def _id_batches(self, chunks, allowed: frozenset, disallowed: frozenset, buffer_chars: int):
        """The ids of :meth:`encode_iterable`, one list per buffer of text."""
        prefixes = self._special_prefixes(allowed | disallowed)
        longest_prefix = max(map(len, prefixes), default=0)
        held, buffered, size = "", [], 0
        for k, chunk in enumerate(chunks):
            _check_str(f"chunk {k}", chunk)
            buffered.append(chunk)
            size += len(chunk)
            if size < buffer_chars:
                continue
            text = held + "".join(buffered)
            buffered, size = [], 0
            pending = text[-1] if "\ud800" <= text[-1] <= "\udbff" else ""  # half a surrogate pair
            text = text[: len(text) - len(pending)]
            self._raise_if_disallowed(disallowed, text)
            parts = self._split_special(_replace_lone_surrogates(text), allowed)
            tail = parts.pop()[0] if parts and not parts[-1][1] else ""
            ids = self._encode_parts(parts)
            # hold back a trailing prefix of a special token, and before it (the end of the text if the prefix
            # becomes that token) the last 3 characters and any whitespace run, which later text can re-split
            stem = tail
            for cut in range(min(longest_prefix, len(tail)), 0, -1):
                if tail[-cut:] in prefixes:
                    stem = tail[:-cut]
                    break
            limit = min(len(stem) - 3, len(stem.rstrip()))
            pieces = self._pretokenize(tail)
            final, end = len(pieces), len(tail)
            while final and end > limit:
                final -= 1
                end -= len(pieces[final])
            ids += self._encode_pretokens(pieces[:final])
            held = tail[end:] + pending
            yield ids
        text = held + "".join(buffered)
        self._raise_if_disallowed(disallowed, text)
        yield self._encode_parts(self._split_special(_replace_lone_surrogates(text), allowed))

    def _encode_parts(self, parts: list[tuple[str, bool]]) -> list[int]:
        """The ids of text cut at special tokens: ``(text, is_special)`` pairs."""
        ids: list[int] = []
        for part, is_special in parts:
            if is_special:
                ids.append(self.special_tokens[part])
            else:
                ids += self._encode_ordinary(part)
        return ids

    def _special_prefixes(self, specials: frozenset) -> frozenset:
        """Every proper prefix of the given special tokens (a text ending with one may continue into a token)."""
        if specials not in self._prefix_sets:
            self._prefix_sets[specials] = frozenset(s[:k] for s in specials for k in range(1, len(s)))
        return self._prefix_sets[specials]

    def decode(self, ids, errors: str = "replace") -> str:
        """The text of ``ids``: concatenate the tokens' bytes and decode UTF-8.

        Book: Tokenizers, "Byte-level BPE".

        A slice of ids can end inside a multi-byte character; ``errors="replace"`` (as GPT-2 and tiktoken do)
        shows the broken bytes as U+FFFD, ``errors="strict"`` raises ``UnicodeDecodeError``.
        """
        ids = _check_ids(ids, self.vocab_size)
        _check_choice("errors", errors, ("strict", "replace", "ignore", "backslashreplace"))
        vocab = self.vocab
        unused = next((i for i in ids if i not in vocab), None)
        if unused is not None:
            raise ValueError(f"id {unused} is unused in this vocabulary: no token has it")
        return b"".join([vocab[i] for i in ids]).decode("utf-8", errors=errors)

    # ---- files

    def save(self, path) -> None:
        """Write a readable JSON file: pattern, special tokens and one merge per line.

        Book: Tokenizers, "Byte-level BPE".

        Each merge is written as ``[id_a, id_b, "text"]``: ``text`` shows the new token's bytes (invalid UTF-8
        as ``\\xNN``) for a human reader and is ignored by :meth:`load`. Only a tokenizer with the trained
        layout can be saved; a published vocabulary is read from its own files.
        """
        trained = self.byte_ids == list(range(256)) and all(
            self._ranks[pair] == 256 + k for k, pair in enumerate(self.merges)
        ) and len(self._ranks) == len(self.merges)
        if not trained:
            raise ValueError("save writes tokenizers with the trained layout (bytes 0..255, merge k = id 256 + k); "
                             "load a published vocabulary from its own files")
        header = {
            "type": "llmarch.BPETokenizer",
            "version": 1,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
        }
        rows = [
            [a, b, self.vocab[256 + k].decode("utf-8", errors="backslashreplace")]
            for k, (a, b) in enumerate(self.merges)
        ]
        _write_json_lines(path, header, "merges", rows)

    @classmethod
    def load(cls, path) -> BPETokenizer:
        """Read a file written by :meth:`save`; the loaded tokenizer encodes exactly as the saved one."""
        data = _read_json(path, "llmarch.BPETokenizer")
        merges = data.get("merges")
        if not isinstance(merges, list) or "pattern" not in data:
            raise ValueError(f"{path} needs a 'pattern' and a list of 'merges'")
        pairs = []
        for k, row in enumerate(merges):
            if not isinstance(row, list) or len(row) < 2:
                raise ValueError(f"{path}: merge {k} is {row!r}, not [id_a, id_b, ...]")
            pairs.append((row[0], row[1]))
        return cls(pairs, data.get("special_tokens", []), data.get("pattern"))

    def __repr__(self) -> str:
        size = f"tokens={len(self._whole_pieces)}" if self._whole_pieces is not None else f"merges={len(self.merges)}"
        return f"BPETokenizer({size}, special_tokens={list(self.special_tokens)})"
