# Ported from openai/tiktoken 0.14.0 (commit 4e71bbe0c078468e00fefbf94b39849389f346e5), tests/test_helpers.py; MIT licence, see LICENSE here.
# The only change: `import tiktoken` -> `import llmarch.tokenizers as tiktoken` (see __init__.py).

import bisect
import functools
import os

import pytest

import llmarch.tokenizers as tiktoken

MAX_EXAMPLES: int = int(os.environ.get("TIKTOKEN_MAX_EXAMPLES", "100"))

ENCODINGS = ["r50k_base", "cl100k_base"]
SOME_ENCODINGS = ["cl100k_base"]


ENCODING_FACTORIES = [
    pytest.param(functools.partial(tiktoken.get_encoding, name), id=name) for name in ENCODINGS
]
SOME_ENCODING_FACTORIES = [
    pytest.param(functools.partial(tiktoken.get_encoding, name), id=name) for name in SOME_ENCODINGS
]


