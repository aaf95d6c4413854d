"""Command line of ``python -m llmarch.train``.

Book: Training at scale, "A worked run".
"""

from __future__ import annotations

import sys

from llmarch.train.loop import write_tiny_gpt_checkpoint


def main(argv: list[str] | None = None) -> None:
    """Without arguments: retrain the tiny pretrained GPT and overwrite its checkpoint."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        write_tiny_gpt_checkpoint()
