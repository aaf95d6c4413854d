"""A synthetic crawl with hidden labels: WARC files of web pages whose kind the course knows, so that every
stage of the pipeline can be scored.

Book: Pretraining data, "From a crawl to text".

:func:`write_synthetic_crawl` writes ``n_files`` WARC files (all gzip-compressed, one record per gzip member,
except the last file, which is plain) and a sidecar ``labels.jsonl`` that is not part of the crawl. Each file
starts with a ``warcinfo`` record; every other record is an HTTP ``response``. Pages come in these kinds
(the share of ``n_pages`` in brackets; every kind has at least one page):

- ``clean`` (the rest, about half): an English article on one of a dozen topics, inside its site's
  boilerplate (navigation, sidebar, footer, cookie banner). Some carry personal information (an e-mail
  address, a phone number, an IPv4 address), some end with a shared licence or quote a shared paragraph
  (passages of 60-70 words that many pages repeat); a few are short notes, and half of the programming
  pages contain a line of code (see ``traits`` below);
- ``exact-duplicate`` (7%): a clean page again at another URL, either the same HTML (a mirror) or the
  same article in another site's boilerplate (syndication);
- ``near-duplicate`` (7%): a clean page republished with a few words changed and a note added;
- ``foreign`` (10%): an article in German, French, Spanish or Italian;
- ``spam`` (8%): keyword stuffing, a page of lorem ipsum, or a link farm;
- ``low-quality`` (10%): too short, a tag cloud, mostly symbols, or a list of teaser lines;
- ``http-error`` (3%), ``non-html`` (3%: PDF, PNG, JSON) and ``empty`` (2%) responses.

A duplicate always comes after its original in the crawl's order (file, then offset), so a pipeline that
keeps the first copy keeps the original. The same ``seed`` gives byte-identical files: record ids are drawn
from the seed, dates are fixed, and gzip members carry no timestamp.

One JSON object per response record in ``labels.jsonl``, in crawl order::

    {"id": "<urn:uuid:...>", "url": "...", "file": "crawl-000.warc.gz", "offset": 1234,
     "kind": "clean", "variant": null, "language": "en", "duplicate_of": null,
     "pii": [{"kind": "EMAIL", "value": "..."}], "shared_passages": ["licence"], "traits": []}

``variant`` names the sub-kind (the topic of a clean page, ``mirror``/``syndicated``, ``keyword-stuffing``/``lorem-ipsum``/
``link-farm``, ``too-short``/``tag-cloud``/``symbols``/``teasers``, ``pdf``/``png``/``json``);
``duplicate_of`` is the ``id`` of the original page of a duplicate; ``pii`` lists the personal information
written into the page (``kind`` as in :data:`llmarch.webdata.PII_PLACEHOLDERS`); ``shared_passages`` names the
shared passages it contains (``licence``, ``quote``); ``traits`` marks the clean pages that rules are known to
remove although they are fine: ``short`` (a two-sentence note, under Gopher's 50 words) and ``code`` (a
programming page with a line of code, whose ``{`` fails C4's page rule).
"""

from __future__ import annotations

import html
import io
import json
import os
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from .crawl_text import (
    FOREIGN_SENTENCES,
    LICENCE_PASSAGE,
    LOREM_IPSUM,
    MONTHS,
    QUOTED_PASSAGE,
    SPAM_PRODUCTS,
    TOPICS,
    english_paragraphs,
    english_sentence,
    foreign_paragraphs,
    page_title,
    plural,
    slug,
)

__all__ = ["KIND_SHARES", "SyntheticCrawl", "write_synthetic_crawl", "read_labels"]

KIND_SHARES = {
    "exact-duplicate": 0.07,
    "near-duplicate": 0.07,
    "foreign": 0.10,
    "spam": 0.08,
    "low-quality": 0.10,
    "http-error": 0.03,
    "non-html": 0.03,
    "empty": 0.02,
}
"""The share of each non-clean kind in the crawl; the remaining pages are ``clean``."""

PII_SHARE, LICENCE_SHARE, QUOTE_SHARE = 0.25, 0.15, 0.10
"""Shares of the clean pages with personal information, with the shared licence, quoting the shared paragraph."""

SHORT_SHARE, CODE_SHARE = 0.04, 0.5
"""Share of the clean pages that are short notes (two sentences), and of the clean programming pages with a line
of code in their prose: good pages that the quality filters are known to remove (Gopher's 50-word minimum,
C4's curly-bracket rule), so that the filters' precision is not trivially 1."""

CRAWL_DATE = "2024-03-01T12:00:00Z"
"""The ``WARC-Date`` of every record (and the HTTP ``Date``): a fixed date keeps the files reproducible."""

MIN_PAGES = 20

_FIRST_NAMES = ("anna", "ben", "chloe", "david", "emma", "farid", "grace", "hiro", "isla", "jonas", "kate",
                "liam", "maya", "noah", "olga", "priya", "ravi", "sofia", "tom", "wei")
_LAST_NAMES = ("ashworth", "brennan", "carter", "dubois", "evans", "fischer", "garcia", "hughes", "ito",
               "jones", "kowalski", "lindqvist", "moreau", "novak", "okafor", "patel", "quinn", "rossi")
_SYNDICATOR = "hobby-digest.example"
_SCRAPER = "content-mirror.example"
_FOREIGN_SITES = {"de": "gartenfreunde.example", "fr": "le-petit-atelier.example",
                  "es": "la-huerta-diaria.example", "it": "il-taccuino.example"}
_NAV = {
    "en": ("Home", "Articles", "Archive", "About", "Contact"),
    "de": ("Startseite", "Artikel", "Archiv", "Über uns", "Kontakt"),
    "fr": ("Accueil", "Articles", "Archives", "À propos", "Contact"),
    "es": ("Inicio", "Artículos", "Archivo", "Quiénes somos", "Contacto"),
    "it": ("Home", "Articoli", "Archivio", "Chi siamo", "Contatti"),
}
_COOKIE_BANNER = ("This website uses cookies to improve your experience. By continuing to browse the site you "
                  "agree to our use of cookies.")


@dataclass
class _Article:
    """What a page says, before it is wrapped in a site's boilerplate."""

    title: str
    paragraphs: list[str]
    author: str
    language: str = "en"


@dataclass
class _Page:
    url: str
    body: bytes
    content_type: str
    status: str = "200 OK"
    label: dict = field(default_factory=dict)
    article: _Article | None = None
    site: str = ""


class SyntheticCrawl(NamedTuple):
    """What :func:`write_synthetic_crawl` wrote: the WARC files (in crawl order), the labels file, and the
    number of pages of each kind.

    Book: Pretraining data, "From a crawl to text"
    """

    warc_files: list[Path]
    labels: Path
    counts: dict[str, int]


def _record_id(rng: random.Random) -> str:
    return f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>"


def _site_page(site: str, article: _Article, rng: random.Random, sidebar: list[str]) -> bytes:
    """An article inside a site's boilerplate: header with navigation, sidebar, footer and cookie banner."""
    nav = "".join(f'<li><a href="https://{site}/{slug(item)}/">{html.escape(item)}</a></li>'
                  for item in _NAV[article.language])
    related = "".join(f'<li><a href="https://{site}/{slug(t)}.html">{html.escape(t)}</a></li>' for t in sidebar)
    body = "".join(f"<p>{html.escape(p)}</p>\n" for p in article.paragraphs)
    year = 2024 - rng.randint(0, 6)
    return (
        f'<!DOCTYPE html>\n<html lang="{article.language}">\n<head><meta charset="utf-8">'
        f"<title>{html.escape(article.title)} | {site}</title></head>\n<body>\n"
        f'<div id="cookie-banner" class="cookie-consent"><p>{_COOKIE_BANNER}</p>'
        f"<button>Accept</button><button>Reject</button></div>\n"
        f'<header><a class="logo" href="https://{site}/">{site}</a><nav><ul>{nav}</ul></nav></header>\n'
        f'<main><article><h1>{html.escape(article.title)}</h1>\n'
        f'<p class="byline">By {html.escape(article.author)}</p>\n{body}</article></main>\n'
        f'<aside><h2>Popular posts</h2><ul>{related}</ul></aside>\n'
        f'<footer><p>Copyright {year} {site}. All rights reserved.</p><ul>'
        f'<li><a href="https://{site}/privacy/">Privacy policy</a></li>'
        f'<li><a href="https://{site}/terms/">Terms of use</a></li></ul></footer>\n</body>\n</html>\n'
    ).encode("utf-8")


def _html_page(url, site, article, rng, sidebar, label) -> _Page:
    return _Page(url, _site_page(site, article, rng, sidebar), "text/html; charset=utf-8", label=label,
                 article=article, site=site)


def _author(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST_NAMES).title()} {rng.choice(_LAST_NAMES).title()}"


def _pii_sentence(rng: random.Random, site: str) -> tuple[str, list[dict]]:
    """A sentence with personal information, and the labels of what it contains."""
    first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
    email = f"{first}.{last}@{rng.choice(('mail.example', site, 'post.example'))}"
    phone = rng.choice((
        f"+44 20 7946 0{rng.randint(100, 999)}",
        f"(555) 01{rng.randint(0, 9)}-{rng.randint(1000, 9999)}",
        f"+1 555 01{rng.randint(0, 9)} {rng.randint(1000, 9999)}",
        f"020 7946 0{rng.randint(100, 999)}",
    ))
    ip = f"{rng.choice(('192.0.2', '198.51.100', '203.0.113'))}.{rng.randint(1, 254)}"
    fee, founded = rng.randint(10, 60), rng.randint(1950, 2010)
    which = rng.randint(0, 2)
    if which == 0:
        return (f"If you have questions, write to {email} or call {phone} on weekday evenings; membership "
                f"costs £{fee} a year and the club was founded in {founded}.",
                [{"kind": "EMAIL", "value": email}, {"kind": "PHONE", "value": phone}])
    if which == 1:
        return (f"The club secretary, {first.title()} {last.title()}, answers mail at {email} within "
                f"{rng.randint(2, 9)} days.", [{"kind": "EMAIL", "value": email}])
    return (f"Our photo archive of {rng.randint(200, 4000)} pictures runs on a small server at {ip}, so please "
            f"be patient if it is slow, or phone {phone} if it is down.",
            [{"kind": "IP_ADDRESS", "value": ip}, {"kind": "PHONE", "value": phone}])


def _code_sentence(topic, rng: random.Random) -> str:
    name = rng.choice(topic.nouns).replace(" ", "_")
    return (f"The whole fix was one line, if ({name}.is_stale()) {{ {name}.refresh(); }}, and after that the "
            f"{rng.choice(topic.nouns)} behaved.")


def _clean_page(rng: random.Random, index: int, titles: list[str]) -> _Page:
    topic = rng.choice(TOPICS)
    title = page_title(topic, rng)
    label = {"kind": "clean", "variant": topic.name, "language": "en", "pii": [], "shared_passages": [],
             "traits": []}
    if rng.random() < SHORT_SHARE:
        paragraphs = english_paragraphs(topic, rng, 1, (2, 2))
        label["traits"].append("short")
        url = f"https://{topic.site}/notes/{slug(title)}-{index}.html"
        return _html_page(url, topic.site, _Article(title, paragraphs, _author(rng)), rng, rng.sample(titles, 4),
                          label)
    paragraphs = english_paragraphs(topic, rng, rng.randint(3, 5))
    if topic.name == "programming" and rng.random() < CODE_SHARE:
        paragraphs[rng.randrange(len(paragraphs))] += " " + _code_sentence(topic, rng)
        label["traits"].append("code")
    if rng.random() < PII_SHARE:
        sentence, pii = _pii_sentence(rng, topic.site)
        paragraphs.insert(rng.randint(1, len(paragraphs)), sentence)
        label["pii"] = pii
    if rng.random() < QUOTE_SHARE:
        paragraphs.insert(rng.randint(1, len(paragraphs)), QUOTED_PASSAGE)
        label["shared_passages"].append("quote")
    if rng.random() < LICENCE_SHARE:
        paragraphs.append(LICENCE_PASSAGE)
        label["shared_passages"].append("licence")
    url = f"https://{topic.site}/{2015 + index % 9}/{slug(title)}-{index}.html"
    return _html_page(url, topic.site, _Article(title, paragraphs, _author(rng)), rng, rng.sample(titles, 4), label)


def _foreign_page(rng: random.Random, index: int) -> _Page:
    language = rng.choice(sorted(FOREIGN_SENTENCES))
    paragraphs = foreign_paragraphs(language, rng, 4)
    title = paragraphs[0].split(",")[0].split(".")[0]
    site = _FOREIGN_SITES[language]
    label = {"kind": "foreign", "variant": None, "language": language}
    sidebar = [s.split(",")[0] for s in rng.sample(FOREIGN_SENTENCES[language], 3)]
    return _html_page(f"https://{site}/blog/{index}.html", site, _Article(title, paragraphs, _author(rng), language),
                      rng, sidebar, label)


def _spam_page(rng: random.Random, index: int, titles: list[str]) -> _Page:
    variant = rng.choice(("keyword-stuffing", "lorem-ipsum", "link-farm"))
    product = rng.choice(SPAM_PRODUCTS)
    site = f"best-{slug(product)}-{index}.example"
    label = {"kind": "spam", "variant": variant, "language": "en"}
    if variant == "keyword-stuffing":
        phrases = (f"cheap {product}", f"buy {product} online", f"best {product}", f"{product} discount",
                   f"{product} sale", f"top {product} deals")
        paragraphs = [" ".join(rng.choice(phrases).capitalize() + "." for _ in range(rng.randint(12, 20)))
                      for _ in range(4)]
        article = _Article(f"Cheap {product} - best {product} deals", paragraphs, "Admin")
    elif variant == "lorem-ipsum":
        topic = rng.choice(TOPICS)
        paragraphs = [english_sentence(topic, rng) + " " + english_sentence(topic, rng), LOREM_IPSUM, LOREM_IPSUM]
        article = _Article("Welcome to our new website", paragraphs, "Admin")
        site = topic.site
    else:
        links = "".join(
            f'<li><a href="https://{slug(product)}-{rng.randint(1, 999)}.example/">{rng.choice(("best", "cheap", "top", "free"))} '
            f"{product} {rng.randint(1, 99)}</a></li>" for _ in range(rng.randint(40, 80)))
        body = (f"<!DOCTYPE html>\n<html><head><title>{product} links</title></head><body>\n"
                f"<h1>{product.title()} directory</h1><ul>{links}</ul></body></html>\n").encode("utf-8")
        return _Page(f"https://{site}/links.html", body, "text/html; charset=utf-8", label=label)
    return _html_page(f"https://{site}/{slug(article.title)}.html", site, article, rng, rng.sample(titles, 3), label)


def _low_quality_page(rng: random.Random, index: int, titles: list[str]) -> _Page:
    variant = rng.choice(("too-short", "tag-cloud", "symbols", "teasers"))
    topic = rng.choice(TOPICS)
    label = {"kind": "low-quality", "variant": variant, "language": "en"}
    if variant == "too-short":
        paragraphs = [rng.choice(("Page coming soon.", "Nothing here yet, check back later.",
                                  "This page has moved."))]
    elif variant == "tag-cloud":
        words = [w for phrase in topic.nouns + topic.adjectives + topic.verbs for w in phrase.split()]
        paragraphs = [", ".join(rng.choice(words) for _ in range(rng.randint(60, 120)))]
    elif variant == "symbols":
        pieces = ("★★★★★", "#####", ">>>", "***", "$$$", "!!!", "===", "+++", "~~~", "@@@")
        paragraphs = [" ".join(rng.choice(pieces) for _ in range(rng.randint(40, 80))) for _ in range(2)]
    else:
        paragraphs = [f"Read more about the {rng.choice(topic.nouns)} and {plural(rng.choice(topic.nouns))}..."
                      for _ in range(rng.randint(8, 15))]
    article = _Article(page_title(topic, rng), paragraphs, _author(rng))
    return _html_page(f"https://{topic.site}/tag/{index}.html", topic.site, article, rng, rng.sample(titles, 3),
                      label)


def _other_response(kind: str, rng: random.Random, index: int) -> _Page:
    topic = rng.choice(TOPICS)
    base = f"https://{topic.site}"
    if kind == "empty":
        return _Page(f"{base}/feed/{index}", b"", "text/html; charset=utf-8", label={"kind": kind, "variant": None})
    if kind == "http-error":
        body = b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>\n"
        return _Page(f"{base}/missing/{index}.html", body, "text/html; charset=utf-8", "404 Not Found",
                     label={"kind": kind, "variant": "404"})
    variant = rng.choice(("pdf", "png", "json"))
    payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(200, 600)))
    if variant == "pdf":
        body, ctype = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n" + payload, "application/pdf"
    elif variant == "png":
        body, ctype = b"\x89PNG\r\n\x1a\n" + payload, "image/png"
    else:
        body = json.dumps({"id": index, "items": [rng.randint(0, 99) for _ in range(20)]}).encode()
        ctype = "application/json"
    return _Page(f"{base}/files/{index}.{variant}", body, ctype, label={"kind": kind, "variant": variant})


def _exact_duplicate(original: _Page, rng: random.Random, index: int, titles: list[str]) -> _Page:
    label = {**original.label, "kind": "exact-duplicate", "language": "en"}
    if rng.random() < 0.5:
        label["variant"] = "mirror"
        return replace(original, url=f"{original.url}?utm_source=newsletter&id={index}", label=label)
    label["variant"] = "syndicated"
    page = _html_page(f"https://{_SYNDICATOR}/story/{index}.html", _SYNDICATOR, original.article, rng,
                      rng.sample(titles, 4), label)
    return page


def _near_duplicate(original: _Page, rng: random.Random, index: int, titles: list[str]) -> _Page:
    """The original article with 2-4 words of its prose replaced (never a paragraph's last word, whose full stop
    C4's line rule needs; never in a shared passage or personal information) and an update note appended."""
    article = original.article
    paragraphs = [p.split(" ") for p in article.paragraphs]
    pii_values = [item["value"] for item in original.label["pii"]]
    prose = [i for i, p in enumerate(article.paragraphs)
             if p not in (LICENCE_PASSAGE, QUOTED_PASSAGE) and not any(v in p for v in pii_values)]
    topic = next(t for t in TOPICS if t.name == original.label["variant"])
    for _ in range(rng.randint(2, 4)):
        p = rng.choice(prose)
        w = rng.randrange(len(paragraphs[p]) - 1)
        paragraphs[p][w] = rng.choice(topic.adjectives)
    edited = [" ".join(p) for p in paragraphs]
    edited.append(f"Updated in {rng.choice(MONTHS)} with a few corrections from readers.")
    label = {**original.label, "kind": "near-duplicate", "variant": "edited", "language": "en"}
    return _html_page(f"https://{_SCRAPER}/{slug(article.title)}-{index}.html", _SCRAPER,
                      _Article(article.title, edited, article.author), rng, rng.sample(titles, 4), label)


def _kind_counts(n_pages: int) -> dict[str, int]:
    counts = {kind: max(1, round(share * n_pages)) for kind, share in KIND_SHARES.items()}
    counts["clean"] = n_pages - sum(counts.values())
    return counts


def _pages(n_pages: int, rng: random.Random) -> list[_Page]:
    """All pages in crawl order: base pages shuffled, each duplicate placed after its original."""
    counts = _kind_counts(n_pages)
    titles = [page_title(t, rng) for t in TOPICS for _ in range(3)]
    base: list[_Page] = []
    for i in range(counts["clean"]):
        base.append(_clean_page(rng, i, titles))
    for i in range(counts["foreign"]):
        base.append(_foreign_page(rng, i))
    for i in range(counts["spam"]):
        base.append(_spam_page(rng, i, titles))
    for i in range(counts["low-quality"]):
        base.append(_low_quality_page(rng, i, titles))
    for kind in ("http-error", "non-html", "empty"):
        for i in range(counts[kind]):
            base.append(_other_response(kind, rng, i))
    rng.shuffle(base)
    for page in base:
        page.label["id"] = _record_id(rng)
    keyed = [(float(i), page) for i, page in enumerate(base)]
    clean = [i for i, page in enumerate(base) if page.label["kind"] == "clean" and not page.label["traits"]]
    for kind, make in (("exact-duplicate", _exact_duplicate), ("near-duplicate", _near_duplicate)):
        for i in range(counts[kind]):
            original = rng.choice(clean)
            page = make(base[original], rng, i, titles)
            page.label = {**page.label, "id": _record_id(rng), "duplicate_of": base[original].label["id"]}
            keyed.append((original + rng.uniform(0.1, len(base) - original), page))
    keyed.sort(key=lambda kv: kv[0])
    return [page for _, page in keyed]


def _write_warc(path: Path, pages: list[_Page], rng: random.Random, gzip: bool) -> list[dict]:
    """Write ``pages`` as response records after a warcinfo record; return their labels with file and offset."""
    labels = []
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        writer = WARCWriter(fh, gzip=gzip)
        info = (f"software: llmarch.webdata.crawl\r\nformat: WARC File Format 1.0\r\n"
                f"description: synthetic crawl for the course, file {path.name}\r\n").encode()
        writer.write_record(writer.create_warc_record(
            "", "warcinfo", payload=io.BytesIO(info), length=len(info),
            warc_headers_dict={"WARC-Record-ID": _record_id(rng), "WARC-Date": CRAWL_DATE,
                               "WARC-Filename": path.name, "Content-Type": "application/warc-fields"}))
        for page in pages:
            http = StatusAndHeaders(page.status, [("Content-Type", page.content_type),
                                                  ("Content-Length", str(len(page.body))),
                                                  ("Date", "Fri, 01 Mar 2024 12:00:00 GMT")], protocol="HTTP/1.1")
            offset = fh.tell()
            writer.write_record(writer.create_warc_record(
                page.url, "response", payload=io.BytesIO(page.body), length=len(page.body), http_headers=http,
                warc_headers_dict={"WARC-Record-ID": page.label["id"], "WARC-Date": CRAWL_DATE}))
            label = {"id": page.label["id"], "url": page.url, "file": path.name, "offset": offset}
            label.update({k: page.label.get(k) for k in ("kind", "variant", "language", "duplicate_of")})
            label["pii"] = page.label.get("pii", [])
            label["shared_passages"] = page.label.get("shared_passages", [])
            label["traits"] = page.label.get("traits", [])
            labels.append(label)
    os.replace(tmp, path)
    return labels


def write_synthetic_crawl(out_dir, n_pages: int = 300, seed: int = 0, n_files: int = 3) -> SyntheticCrawl:
    """Write ``n_files`` WARC files with ``n_pages`` response records in all, and ``labels.jsonl``, under
    ``out_dir`` (created if needed): ``crawl-000.warc.gz``, ..., the last one plain ``crawl-<k>.warc``.

    Pages are split into consecutive runs, one per file, so a duplicate may sit in another file than its
    original. The same ``(n_pages, seed, n_files)`` gives byte-identical files.

    Book: Pretraining data, "From a crawl to text"
    """
    if isinstance(n_pages, bool) or not isinstance(n_pages, int) or n_pages < MIN_PAGES:
        raise ValueError(f"n_pages must be an integer >= {MIN_PAGES} (every kind needs a page), got {n_pages!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(n_files, bool) or not isinstance(n_files, int) or not 1 <= n_files <= n_pages:
        raise ValueError(f"n_files must be an integer in [1, n_pages], got {n_files!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pages = _pages(n_pages, rng)
    bounds = [round(k * n_pages / n_files) for k in range(n_files + 1)]
    warc_files, labels = [], []
    for k in range(n_files):
        plain = n_files > 1 and k == n_files - 1
        path = out / f"crawl-{k:03d}.warc{'' if plain else '.gz'}"
        labels.extend(_write_warc(path, pages[bounds[k] : bounds[k + 1]], rng, gzip=not plain))
        warc_files.append(path)
    labels_path = out / "labels.jsonl"
    tmp = labels_path.with_name(labels_path.name + ".tmp")
    tmp.write_text("".join(json.dumps(label, ensure_ascii=False) + "\n" for label in labels), encoding="utf-8")
    os.replace(tmp, labels_path)
    return SyntheticCrawl(warc_files, labels_path, dict(Counter(label["kind"] for label in labels)))


def read_labels(path) -> list[dict]:
    """The labels of a synthetic crawl (``labels.jsonl``), in crawl order.

    Book: Pretraining data, "From a crawl to text"
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"labels file {path} does not exist")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
