"""Subword tokenizers: classic BPE, byte-level BPE (with BPE-dropout), WordPiece and the Unigram model.

Book: Tokenizers (``book/tokenizers.md``).

One module per algorithm, each stating its conventions in its docstring; everything is importable from
``llmarch.tokenizers`` itself:

- :mod:`~llmarch.tokenizers.classic`: classic character-level BPE with the end-of-word marker ``</w>``
  (:func:`train_bpe_words`, :func:`bpe_segment_word`, :func:`merge_symbols`; Sennrich et al., 2016);
- :mod:`~llmarch.tokenizers.pretokenize`: the pre-tokenisation regexes (:data:`GPT2_SPLIT_PATTERN`,
  :data:`CL100K_SPLIT_PATTERN`, :data:`O200K_SPLIT_PATTERN`) and :func:`pretokenize`;
- :mod:`~llmarch.tokenizers.bpe`: byte-level BPE (:class:`BPETokenizer`) with BPE-dropout, trained or loaded
  from published files (:meth:`BPETokenizer.from_tiktoken`, :meth:`BPETokenizer.from_gpt2_files`);
- :mod:`~llmarch.tokenizers.merging`: the inner loops of byte-level BPE (incremental pair counts of training,
  :func:`merge_by_rank_heap` and :func:`merge_bytes_by_rank` for encoding);
- :mod:`~llmarch.tokenizers.vocab_files` and :mod:`~llmarch.tokenizers.openai`: the file formats of published
  vocabularies, and GPT-2, GPT-4 and GPT-4o from the installed files (:func:`openai_tokenizer`);
- :mod:`~llmarch.tokenizers.encoding`: tiktoken's interface (:class:`Encoding`, :func:`get_encoding`,
  :func:`encoding_for_model`): ``import llmarch.tokenizers as tiktoken`` runs code written for tiktoken;
- :mod:`~llmarch.tokenizers.unicode16`: tiktoken's Unicode (16.0) in the patterns (:func:`pin_unicode`);
- :mod:`~llmarch.tokenizers.wordpiece`: WordPiece (:class:`WordPieceTokenizer`; BERT);
- :mod:`~llmarch.tokenizers.unigram`: the Unigram language model (:class:`UnigramTokenizer`; Kudo, 2018;
  SentencePiece);
- :mod:`~llmarch.tokenizers._common`: the argument checks, seeding and JSON file helpers they share.

Every public function checks its arguments and raises ``TypeError``/``ValueError`` naming the problem.
"""

from .bpe import BPETokenizer
from .merging import merge_bytes_by_rank, merge_by_rank_heap
from .openai import (
    ENCODING_NAMES,
    OPENAI_SPECIAL_TOKENS,
    OPENAI_SPLIT_PATTERNS,
    R50K_SPLIT_PATTERN,
    encoding_spec,
    openai_tokenizer,
)
from .encoding import (
    Encoding,
    encoding_for_model,
    encoding_name_for_model,
    get_encoding,
    list_encoding_names,
)
from .pretokenize import (
    CL100K_SPLIT_PATTERN,
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    O200K_SPLIT_PATTERN,
    pretokenize,
)
from .unicode16 import UNICODE_16_CLASSES, pin_unicode
from .vocab_files import bytes_to_unicode, openai_vocabulary_files, read_gpt2_files, read_tiktoken_ranks
from .classic import END_OF_WORD, bpe_segment_word, merge_symbols, train_bpe_words
from .unigram import UnigramTokenizer
from .wordpiece import WordPieceTokenizer

# Private helpers that book/experiments/tokenizer_compression.py imports from here.
from .merging import _PairIndex  # noqa: F401
from .wordpiece import _bert_pretokenize  # noqa: F401

__all__ = [
    "END_OF_WORD",
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "CL100K_SPLIT_PATTERN",
    "O200K_SPLIT_PATTERN",
    "OPENAI_SPECIAL_TOKENS",
    "OPENAI_SPLIT_PATTERNS",
    "openai_tokenizer",
    "ENCODING_NAMES",
    "R50K_SPLIT_PATTERN",
    "encoding_spec",
    "pin_unicode",
    "UNICODE_16_CLASSES",
    "Encoding",
    "get_encoding",
    "encoding_for_model",
    "encoding_name_for_model",
    "list_encoding_names",
    "openai_vocabulary_files",
    "read_tiktoken_ranks",
    "read_gpt2_files",
    "bytes_to_unicode",
    "merge_by_rank_heap",
    "merge_bytes_by_rank",
    "train_bpe_words",
    "bpe_segment_word",
    "merge_symbols",
    "pretokenize",
    "BPETokenizer",
    "WordPieceTokenizer",
    "UnigramTokenizer",
]
