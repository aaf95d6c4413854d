"""``python -m llmarch.train``: see :func:`llmarch.train.launch.main`."""

from llmarch.train.launch import main

main()
