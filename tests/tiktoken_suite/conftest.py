"""Run the ported suite as upstream runs it: against an installed library.

Hypothesis (6.131 and later) draws, now and then, string constants mined from the *local* modules that are
imported (not those under site-packages). tiktoken's suite runs against an installed tiktoken, whose special
tokens are never drawn that way; ``test_hyp_roundtrip`` encodes with the default ``disallowed_special="all"``,
which raises on them by design. llmarch is local here and ``llmarch.tokenizers.openai`` spells out
``"<|fim_middle|>"`` (drawn once in 100 examples), so llmarch's modules are marked as already seen by
hypothesis, which then mines nothing from them, as for an installed package. The test files are not changed.
"""

import importlib.util
import sys

import llmarch.tokenizers  # noqa: F401  (imports every module the suite uses)

if importlib.util.find_spec("hypothesis") is None:  # the test extra installs it
    collect_ignore = ["test_encoding.py", "test_offsets.py"]
else:
    from hypothesis.internal.conjecture import providers

    if hasattr(providers, "_seen_modules"):  # hypothesis >= 6.131 mines local constants
        providers._seen_modules.update(
            id(module) for name, module in list(sys.modules.items()) if name.split(".")[0] == "llmarch"
        )
