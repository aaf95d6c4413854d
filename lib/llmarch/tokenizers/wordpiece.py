"""WordPiece (BERT): merges ranked by ``count(a b) / (count(a) * count(b))``, greedy longest-match-first encoding.

Book: Tokenizers, "WordPiece".

The first piece of a word is written as is, every later piece with the prefix ``##`` (``"hugs" -> hug ##s``);
words that cannot be segmented become ``[UNK]``. Text is pre-tokenised as BERT's basic tokenizer does
(:func:`_bert_clean`, :func:`_bert_pretokenize`). Training reuses byte-level BPE's incremental pair counts
(:class:`llmarch.tokenizers.merging._PairIndex`).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction

from ._common import (
    _check_bool,
    _check_ids,
    _check_int,
    _check_special_tokens,
    _check_str,
    _check_word_counts,
    _read_json,
    _type_name,
    _write_json_lines,
)
from .merging import _PairIndex

_CONTINUATION = "##"


def _is_punctuation(ch: str) -> bool:
    """BERT's rule: ASCII symbols count as punctuation too (``$``, ``^``, ...), plus every Unicode ``P*``."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _bert_is_whitespace(ch: str) -> bool:
    """BERT's whitespace: space, tab, newline, carriage return and the Unicode space separators (``Zs``)."""
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _bert_clean(text: str) -> str:
    """BERT's text cleaning: NUL, U+FFFD and control characters (category ``C*``, except tab, newline and
    carriage return, which are whitespace) are removed, and every whitespace character becomes a space.
    ``_bert_clean("a\x00b\tc\u200bd")`` -> ``"ab cd"`` (U+200B is a format character, ``Cf``)."""
    kept = []
    for ch in text:
        if ch in ("\x00", "\ufffd") or (ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")):
            continue
        kept.append(" " if _bert_is_whitespace(ch) else ch)
    return "".join(kept)


def _bert_pretokenize(text: str, lowercase: bool, strip_accents: bool | None = None,
                      tokenize_chinese_chars: bool = True) -> list[str]:
    """BERT's basic tokenizer: clean the text (:func:`_bert_clean`), lowercase it and strip its accents (NFD,
    then drop the combining marks; ``strip_accents=None``: when lowercasing, as uncased BERT), then split on
    whitespace; every punctuation mark and (with ``tokenize_chinese_chars``) CJK ideograph is its own word."""
    text = _bert_clean(text)
    if lowercase:
        text = text.lower()
    if lowercase if strip_accents is None else strip_accents:
        text = "".join(ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn")
    words, buf = [], []
    for ch in text:
        if ch == " ":  # after cleaning, the only whitespace left
            if buf:
                words.append("".join(buf))
                buf = []
        elif _is_punctuation(ch) or (tokenize_chinese_chars and _is_cjk(ch)):
            if buf:
                words.append("".join(buf))
                buf = []
            words.append(ch)
        else:
            buf.append(ch)
    if buf:
        words.append("".join(buf))
    return words


def _wordpiece_score_key(pair_count: int, count_a: int, count_b: int) -> Fraction:
    return Fraction(pair_count, count_a * count_b)


class WordPieceTokenizer:
    """WordPiece (BERT): ``##`` continuation pieces, greedy longest-match-first encoding, ``[UNK]``.

    Book: Tokenizers, "WordPiece".

    ``vocab`` maps each token to its id (the order of BERT's ``vocab.txt``); ``merges`` lists the pairs
    merged in training, in order; ``special_tokens`` (``unk_token`` first) are never split. Text is
    pre-tokenised as BERT's basic tokenizer does: split on whitespace, every punctuation character and CJK
    ideograph is a word of its own (``lowercase=True`` also lowercases and strips accents, as uncased BERT).
    ``strip_accents`` (``None``: as ``lowercase``) and ``tokenize_chinese_chars`` are the options of the same
    names of Hugging Face's ``BertTokenizer``, with its defaults; ids and tokens equal its own (tested against
    ``transformers``' Python and Rust BERT tokenizers).

    >>> tok = WordPieceTokenizer().train({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 14)
    >>> tok.merges[:2]
    [('##g', '##s'), ('##u', '##g')]
    >>> tok.tokenize("bugs mug")
    ['b', '##ugs', '[UNK]']
    """

    def __init__(
        self,
        vocab=(),
        unk_token: str = "[UNK]",
        lowercase: bool = False,
        max_input_chars_per_word: int = 100,
        special_tokens=(),
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
    ):
        _check_str("unk_token", unk_token, non_empty=True)
        if strip_accents is not None and not isinstance(strip_accents, bool):
            raise TypeError(f"strip_accents must be True, False or None, got {_type_name(strip_accents)}")
        _check_bool("tokenize_chinese_chars", tokenize_chinese_chars)
        if not isinstance(lowercase, bool):
            raise TypeError(f"lowercase must be a bool, got {_type_name(lowercase)}")
        _check_int("max_input_chars_per_word", max_input_chars_per_word, minimum=1)
        if isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
            raise TypeError(f"vocab must be a list of tokens in id order, got {_type_name(vocab)}")
        tokens = list(vocab)
        for tok in tokens:
            _check_str("each vocab entry", tok, non_empty=True)
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocab lists a token more than once")
        if tokens and unk_token not in tokens:
            raise ValueError(f"vocab does not contain the unknown token {unk_token!r}")
        specials = _check_special_tokens(special_tokens)
        missing = [t for t in specials if t not in tokens]
        if missing:
            raise ValueError(f"special_tokens {missing} are not in vocab")
        self.special_tokens = [unk_token, *(t for t in specials if t != unk_token)] if tokens else []
        self._special_regex = re.compile(
            "(" + "|".join(re.escape(t) for t in sorted(self.special_tokens, key=len, reverse=True)) + ")"
        ) if self.special_tokens else None
        self.unk_token = unk_token
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.max_input_chars_per_word = max_input_chars_per_word
        self.vocab: dict[str, int] = {tok: i for i, tok in enumerate(tokens)}
        self._id_to_token = tokens
        self._max_token_chars = max((len(t) for t in tokens), default=0)
        self.merges: list[tuple[str, str]] = []

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def train(self, text_or_word_counts, vocab_size: int, special_tokens=("[UNK]",)) -> WordPieceTokenizer:
        """Learn a vocabulary of ``vocab_size`` tokens; returns ``self``.

        Book: Tokenizers, "WordPiece".

        Input: a text (pre-tokenised as BERT does) or a dict ``{word: count}`` (used as given). Each word starts
        as ``w ##o ##r ##d``; the vocabulary starts as the special tokens (``unk_token`` is added first if
        missing) and every symbol seen. Then, until the vocabulary has ``vocab_size`` tokens or no pair is
        left, merge the pair with the highest score

            ``score(a, b) = count(a b) / (count(a) * count(b))``

        (counts weighted by word frequency; exact rational comparison; ties: the lexicographically smallest
        pair). Unlike BPE's raw frequency, the score prefers pairs whose parts are rare on their own.
        """
        if isinstance(text_or_word_counts, str):
            word_counts = dict(Counter(self._pretokenize(text_or_word_counts)))
        else:
            word_counts = _check_word_counts(text_or_word_counts, "text_or_word_counts")
        _check_int("vocab_size", vocab_size)
        specials = _check_special_tokens(special_tokens)
        if self.unk_token not in specials:
            specials.insert(0, self.unk_token)

        words = [[w[0], *(_CONTINUATION + ch for ch in w[1:])] for w in word_counts]
        freqs = list(word_counts.values())
        alphabet = sorted({s for w in words for s in w} - set(specials))
        tokens = specials + alphabet
        if vocab_size < len(tokens):
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the {len(specials)} special tokens and the "
                f"{len(alphabet)} symbols of the corpus (every character, with and without ##) need {len(tokens)}"
            )
        symbol_counts: Counter = Counter()
        for w, f in zip(words, freqs):
            for s in w:
                symbol_counts[s] += f
        index = _PairIndex(words, freqs)
        known = set(tokens)
        merges: list[tuple[str, str]] = []
        while len(tokens) < vocab_size and index.counts:
            # float scores find the near-best pairs fast; exact fractions then decide between them
            scored = [(c / (symbol_counts[a] * symbol_counts[b]), (a, b), c) for (a, b), c in index.counts.items()]
            top = max(s for s, _, _ in scored)
            near = [(p, c) for s, p, c in scored if s >= top * (1 - 1e-9)]
            exact = {p: _wordpiece_score_key(c, symbol_counts[p[0]], symbol_counts[p[1]]) for p, c in near}
            best_score = max(exact.values())
            a, b = min(p for p, s in exact.items() if s == best_score)
            new = a + b[len(_CONTINUATION) :]
            _, merged = index.merge((a, b), new)
            symbol_counts[a] -= merged
            symbol_counts[b] -= merged
            symbol_counts[new] += merged
            merges.append((a, b))
            if new not in known:
                known.add(new)
                tokens.append(new)
        self.__init__(tokens, self.unk_token, self.lowercase, self.max_input_chars_per_word, specials,
                      self.strip_accents, self.tokenize_chinese_chars)
        self.merges = merges
        return self

    def _pretokenize(self, text: str) -> list[str]:
        return _bert_pretokenize(text, self.lowercase, self.strip_accents, self.tokenize_chinese_chars)

    def _tokenize_word(self, word: str) -> list[str]:
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces = []
        start, n = 0, len(word)
        while start < n:
            end = min(n, start + self._max_token_chars)
            piece = None
            while start < end:
                candidate = word[start:end] if start == 0 else _CONTINUATION + word[start:end]
                if candidate in self.vocab:
                    piece = candidate
                    break
                end -= 1
            if piece is None:
                return [self.unk_token]  # BERT: one unknown stretch makes the whole word [UNK]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``: greedy longest-match-first within each word, as BERT does.

        Book: Tokenizers, "WordPiece".

        From the start of the word take the longest prefix in the vocabulary, then the longest ``##``-piece
        that continues it, and so on; a word with a stretch no piece covers (or longer than
        ``max_input_chars_per_word``) becomes the single token ``unk_token``. Special tokens (``unk_token``
        and ``special_tokens``) in the text are kept whole, before pre-tokenisation.
        """
        _check_str("text", text)
        if not self.vocab:
            raise ValueError("this WordPieceTokenizer has no vocabulary yet: call train() or pass vocab")
        parts = self._special_regex.split(text) if self._special_regex else [text]
        tokens = []
        for k, part in enumerate(parts):  # odd positions hold the special tokens
            if k % 2:
                tokens.append(part)
            else:
                tokens.extend(p for word in self._pretokenize(part) for p in self._tokenize_word(word))
        return tokens

    def encode(self, text: str) -> list[int]:
        """Ids of :meth:`tokenize`."""
        return [self.vocab[t] for t in self.tokenize(text)]

    def decode(self, ids) -> str:
        """Join tokens with spaces and glue ``##`` pieces to the previous token.

        Book: Tokenizers, "WordPiece". The pre-tokeniser threw the whitespace away, so this is not the exact
        input: ``"Hello, world"`` decodes as ``"Hello , world"``.
        """
        ids = _check_ids(ids, self.vocab_size)
        out = []
        for i in ids:
            tok = self._id_to_token[i]
            if tok.startswith(_CONTINUATION) and len(tok) > len(_CONTINUATION) and out:
                out[-1] += tok[len(_CONTINUATION) :]
            else:
                out.append(tok)
        return " ".join(out)

    def save(self, path) -> None:
        """A readable JSON file: settings, then the tokens in id order, one per line."""
        header = {
            "type": "llmarch.WordPieceTokenizer",
            "version": 1,
            "unk_token": self.unk_token,
            "lowercase": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "special_tokens": self.special_tokens,
            "merges": [list(m) for m in self.merges],
        }
        _write_json_lines(path, header, "vocab", list(self._id_to_token))

    @classmethod
    def load(cls, path) -> WordPieceTokenizer:
        data = _read_json(path, "llmarch.WordPieceTokenizer")
        tok = cls(
            data.get("vocab", []),
            data.get("unk_token", "[UNK]"),
            data.get("lowercase", False),
            data.get("max_input_chars_per_word", 100),
            data.get("special_tokens", ()),
            data.get("strip_accents"),
            data.get("tokenize_chinese_chars", True),
        )
        tok.merges = [tuple(m) for m in data.get("merges", [])]
        return tok

    def __repr__(self) -> str:
        return f"WordPieceTokenizer(vocab_size={self.vocab_size}, unk_token={self.unk_token!r})"
