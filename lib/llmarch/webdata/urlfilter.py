"""URL filtering before any text is read: a domain blocklist and a URL word score, after RefinedWeb
(Penedo et al. 2023, appendix G.1), whose pipeline starts with both.

Book: Pretraining data, "URL and toxicity filtering".

- **Blocklist**: a file of domains, one per line (``#`` starts a comment); a URL is blocked when its host
  or any parent domain of its host is listed (``ads.example.com`` is blocked by ``example.com``).
  RefinedWeb used a list of 4.6 million adult, fraud and malware domains; none is shipped here.
- **URL words**: the URL is lower-cased and split on every non-alphanumeric character (as datatrove does);
  a *hard* word anywhere removes the page, *soft* words add their weight (default 1 each) to a score, and a
  score of at least ``soft_threshold`` (default 2) removes it. Soft words are words that are innocent
  alone but telling together; a single one is not enough.

Word lists are the user's: which words, and in which languages, is the bias of the filter (see the chapter:
a list of "bad" words also removes pages about health, sexuality and the communities it names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .quality import FilterResult

__all__ = ["load_domain_list", "url_words", "UrlFilter"]

_SPLIT = re.compile(r"[^a-z0-9]+")


def load_domain_list(path) -> frozenset[str]:
    """The domains of a blocklist file (one per line, ``#`` comments and blank lines ignored), lower-cased,
    without a leading ``www.`` or ``*.``.

    Book: Pretraining data, "URL and toxicity filtering"
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"blocklist file not found: {path}")
    domains = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip().lower()
        if line:
            domains.add(line.removeprefix("*.").removeprefix("www."))
    return frozenset(domains)


def url_words(url: str) -> list[str]:
    """The words of a URL: its lower-cased alphanumeric runs.

    ``url_words("https://Shop.example.com/Best-Deals_2024?q=x") == ["https", "shop", "example", "com",
    "best", "deals", "2024", "q", "x"]``.

    Book: Pretraining data, "URL and toxicity filtering"
    """
    return [w for w in _SPLIT.split(url.lower()) if w]


@dataclass(frozen=True)
class UrlFilter:
    """``blocked_domains``; ``hard_words`` (one removes the page); ``soft_words`` (word -> weight) and
    ``soft_threshold``. Calling it on a URL returns a :class:`FilterResult` with reason
    ``url:blocked_domain``, ``url:hard_word`` or ``url:soft_words`` (``text`` is the URL).

    Book: Pretraining data, "URL and toxicity filtering"
    """

    blocked_domains: frozenset[str] = frozenset()
    hard_words: frozenset[str] = frozenset()
    soft_words: Mapping[str, float] = field(default_factory=dict)
    soft_threshold: float = 2.0

    def __post_init__(self):
        for name in ("blocked_domains", "hard_words"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise ValueError(f"{name} must be a collection of strings, got {type(value).__name__}")
            object.__setattr__(self, name, frozenset(v.lower() for v in value))
        if self.soft_threshold <= 0:
            raise ValueError(f"soft_threshold must be positive, got {self.soft_threshold!r}")

    def score(self, url: str) -> float:
        """The soft-word score of ``url``: the sum of the weights of the distinct soft words in it."""
        return float(sum(self.soft_words.get(w, 0.0) for w in set(url_words(url))))

    def __call__(self, url: str) -> FilterResult:
        host = (urlsplit(url).hostname or "").lower().removeprefix("www.")
        parts = host.split(".")
        if any(".".join(parts[i:]) in self.blocked_domains for i in range(len(parts))):
            return FilterResult(False, ("url:blocked_domain",), url)
        if self.hard_words & set(url_words(url)):
            return FilterResult(False, ("url:hard_word",), url)
        if self.soft_words and self.score(url) >= self.soft_threshold:
            return FilterResult(False, ("url:soft_words",), url)
        return FilterResult(True, (), url)
