"""Subword tokenizers: classic BPE, byte-level BPE (with BPE-dropout), WordPiece and the Unigram model.

Book: Tokenizers (``book/tokenizers.md``).

One module per algorithm, each stating its conventions in its docstring; everything is importable from
``llmarch.tokenizers`` itself:

- :mod:`~llmarch.tokenizers.classic`: classic character-level BPE with the end-of-word marker ``</w>``
  (:func:`train_bpe_words`, :func:`bpe_segment_word`, :func:`merge_symbols`; Sennrich et al., 2016);
- :mod:`~llmarch.tokenizers.bpe`: byte-level BPE (:class:`BPETokenizer`, GPT-2) with BPE-dropout, and the
  pre-tokenisation regexes (:data:`GPT2_SPLIT_PATTERN`, :data:`GPT4_SPLIT_PATTERN`, :func:`pretokenize`);
- :mod:`~llmarch.tokenizers.wordpiece`: WordPiece (:class:`WordPieceTokenizer`; BERT);
- :mod:`~llmarch.tokenizers.unigram`: the Unigram language model (:class:`UnigramTokenizer`; Kudo, 2018;
  SentencePiece);
- :mod:`~llmarch.tokenizers._common`: the argument checks, seeding and JSON file helpers they share.

Every public function checks its arguments and raises ``TypeError``/``ValueError`` naming the problem.
"""

from .bpe import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, BPETokenizer, pretokenize
from .classic import END_OF_WORD, bpe_segment_word, merge_symbols, train_bpe_words
from .unigram import UnigramTokenizer
from .wordpiece import WordPieceTokenizer

# Private helpers that book/experiments/tokenizer_compression.py imports from here.
from .bpe import _PairIndex  # noqa: F401
from .wordpiece import _bert_pretokenize  # noqa: F401

__all__ = [
    "END_OF_WORD",
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "train_bpe_words",
    "bpe_segment_word",
    "merge_symbols",
    "pretokenize",
    "BPETokenizer",
    "WordPieceTokenizer",
    "UnigramTokenizer",
]
