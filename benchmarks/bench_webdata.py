"""Web-data pipeline benchmarks, each a ratio against a named peer measured in the same run.

    python benchmarks/bench_webdata.py [--quick] [--docs N] [--pages N] [--sa-chars N] [--naive-chars N]

1. ``minhash_signature`` vs datasketch's ``MinHash`` (``update_batch``, 128 permutations) on the 5-gram shingle
   sets (as UTF-8 bytes, for both) of ``--docs`` documents of the course's synthetic prose: signatures per CPU
   second, and agreement: the root-mean-square error of each one's Jaccard estimate over pairs of planted
   near duplicates (both should be close to ``sqrt(J (1 - J) / 128)``).
2. ``near_duplicate_clusters`` vs datasketch's ``MinHashLSH`` (threshold 0.8, 128 permutations, the same
   9 bands of 13 rows) on the same documents with planted near duplicates (Jaccard about 0.9) and distractors
   (about 0.6): documents per CPU second (shingling, signatures, banding and union-find for both) and agreement:
   the Jaccard similarity of the two sets of co-clustered pairs when both skip verification, and the planted
   pairs each finds. Ours also runs with its default exact verification.
3. ``suffix_array`` vs a naive sort of all suffixes (``sorted(range(n), key=lambda i: text[i:])``: its keys
   hold ``n^2 / 2`` characters, which bounds it to small ``n``) on a quarter of ``--naive-chars`` characters and
   on all of them, and vs pydivsufsort (C, divsufsort) on ``--sa-chars`` bytes: ``suffix_array`` (which
   calls libdivsufsort itself, for int64 token ids as for bytes) and the teaching ``suffix_array_doubling``
   (prefix doubling in numpy); every output is checked equal to pydivsufsort's.
4. Text extraction: trafilatura (the pipeline's choice) vs jusText, pages per CPU second on the synthetic
   crawl's HTML pages, with trafilatura's output checked identical when the pages are extracted again in
   reverse order (no state carried between pages).
5. The pipeline on a synthetic crawl of ``--pages`` pages: documents per second per core with the synchronous
   scheduler (one core: CPU time), and on a ``LocalCluster`` of 1 and of 2 single-threaded worker processes
   (started before timing): documents per CPU second (workers and driver: the cost of distribution) and the
   wall-clock scaling from 1 to 2 workers, which needs 2 idle cores to reach 2; the cluster's documents are
   checked equal to the local run's.

Timings are CPU seconds (``time.process_time``) of this process unless said otherwise; the machine may be
shared, so the ratios are the numbers to read. No assertions: the numbers are for the book's chapter. The
default run takes a few minutes on 2 cores; ``--quick`` a few seconds per section.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import numpy as np

from llmarch.webdata import (
    connected_components,
    jaccard,
    minhash_jaccard,
    minhash_signature,
    near_duplicate_clusters,
    shingles,
    suffix_array,
    suffix_array_doubling,
)
from llmarch.webdata.crawl import write_synthetic_crawl
from llmarch.webdata.crawl_text import TOPICS, english_paragraphs
from llmarch.webdata.pipeline import PipelineConfig, run_pipeline
from llmarch.webdata.decode import extract_text, is_html
from llmarch.webdata.warc import iter_warc


def cpu_time(fn, *args, repeats: int = 2, **kwargs):
    """(result, CPU seconds of this process): the fastest of ``repeats`` runs (the first one warms caches)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        result = fn(*args, **kwargs)
        best = min(best, time.process_time() - start)
    return result, best


def edited(text: str, rng: random.Random, fraction: float) -> str:
    """``text`` with about ``fraction`` of its words replaced by a fixed filler word."""
    tokens = text.split()
    for i in rng.sample(range(len(tokens)), max(1, int(fraction * len(tokens)))):
        tokens[i] = "zzz"
    return " ".join(tokens)


def corpus(n_docs: int, seed: int = 0):
    """``n_docs`` texts: base documents, near duplicates of a fifth of them (1% of words replaced, Jaccard about
    0.9) and distractors of a tenth (10% replaced, about 0.6). Returns the texts and the planted pairs
    ``(i, j, kind)``."""
    rng = random.Random(seed)
    n_base = int(n_docs / 1.3)
    texts = ["\n".join(english_paragraphs(rng.choice(TOPICS), rng, 4)) for _ in range(n_base)]
    planted = []
    for i in rng.sample(range(n_base), n_base // 5):
        planted.append((i, len(texts), "near"))
        texts.append(edited(texts[i], rng, 0.01))
    for i in rng.sample(range(n_base), n_docs - len(texts)):
        planted.append((i, len(texts), "far"))
        texts.append(edited(texts[i], rng, 0.10))
    return texts, planted


def co_clustered(labels) -> set[tuple[int, int]]:
    groups = {}
    for i, c in enumerate(labels):
        groups.setdefault(c, []).append(i)
    return {(a, b) for members in groups.values() for x, a in enumerate(members) for b in members[x + 1:]}


def bench_minhash(texts, planted) -> None:
    from datasketch import MinHash

    sets = [[s.encode("utf-8") for s in shingles(t)] for t in texts]
    ours, t_ours = cpu_time(lambda: [minhash_signature(s) for s in sets])

    def datasketch_signatures():
        result = []
        for s in sets:
            m = MinHash(num_perm=128)
            m.update_batch(s)
            result.append(m)
        return result

    theirs, t_theirs = cpu_time(datasketch_signatures)
    true = np.array([jaccard(sets[i], sets[j]) for i, j, _ in planted])
    est_ours = np.array([minhash_jaccard(ours[i], ours[j]) for i, j, _ in planted])
    est_theirs = np.array([theirs[i].jaccard(theirs[j]) for i, j, _ in planted])
    rmse = lambda est: float(np.sqrt(np.mean((est - true) ** 2)))  # noqa: E731
    expected = float(np.sqrt(np.mean(true * (1 - true) / 128)))
    n = len(sets)
    print(f"[minhash] {n} signatures of 128: llmarch {n / t_ours:,.0f}/s, datasketch {n / t_theirs:,.0f}/s "
          f"-> llmarch/datasketch throughput ratio {t_theirs / t_ours:.2f}")
    print(f"[minhash] Jaccard estimate RMSE over {len(planted)} planted pairs (J {true.min():.2f}-{true.max():.2f}): "
          f"llmarch {rmse(est_ours):.4f}, datasketch {rmse(est_theirs):.4f}, theory {expected:.4f}")


def bench_lsh(texts, planted) -> None:
    from datasketch import MinHash, MinHashLSH

    n = len(texts)
    raw, t_raw = cpu_time(near_duplicate_clusters, texts, 0.8, verify="none")
    verified, t_verified = cpu_time(near_duplicate_clusters, texts, 0.8)

    def datasketch_clusters():
        lsh = MinHashLSH(threshold=0.8, num_perm=128)
        sketches = []
        for i, t in enumerate(texts):
            m = MinHash(num_perm=128)
            m.update_batch([s.encode("utf-8") for s in shingles(t)])
            lsh.insert(i, m)
            sketches.append(m)
        pairs = {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i}
        return connected_components(n, pairs), (lsh.b, lsh.r)

    (theirs, params), t_theirs = cpu_time(datasketch_clusters)
    a, b = co_clustered(raw), co_clustered(theirs)
    agreement = len(a & b) / len(a | b) if a | b else 1.0
    found = lambda pairs, kind: sum((i, j) in pairs for i, j, k in planted if k == kind)  # noqa: E731
    n_near = sum(k == "near" for *_, k in planted)
    n_far = len(planted) - n_near
    v = co_clustered(verified)
    print(f"[lsh] {n} documents, datasketch bands x rows = {params[0]} x {params[1]}: llmarch {n / t_raw:,.0f} docs/s "
          f"(unverified), {n / t_verified:,.0f} docs/s (exact verification), datasketch {n / t_theirs:,.0f} docs/s "
          f"-> llmarch/datasketch throughput ratio {t_theirs / t_raw:.2f} (unverified), {t_theirs / t_verified:.2f}")
    print(f"[lsh] co-clustered pairs: llmarch {len(a)}, datasketch {len(b)}, agreement (Jaccard of the pair sets) "
          f"{agreement:.3f}; planted near pairs found {found(a, 'near')}/{n_near} vs {found(b, 'near')}/{n_near} "
          f"(verified: {found(v, 'near')}), distractors clustered {found(a, 'far')}/{n_far} vs {found(b, 'far')}/{n_far} "
          f"(verified: {found(v, 'far')})")


def bench_suffix_array(texts, naive_chars: int, sa_chars: int) -> None:
    import pydivsufsort

    full = "\n".join(texts)
    while len(full) < sa_chars:
        full += "\n" + full
    for n in (naive_chars // 4, naive_chars):
        text = full[:n]
        naive, t_naive = cpu_time(lambda: np.array(sorted(range(len(text)), key=lambda i: text[i:])))
        ours_small, t_small = cpu_time(suffix_array, text)
        print(f"[suffix array] n = {n:,}: naive sort {t_naive:.4f} s, llmarch {t_small:.4f} s -> "
              f"naive/llmarch {t_naive / t_small:.1f}x (equal: {np.array_equal(naive, ours_small)})")
    data = full[:sa_chars].encode("ascii", errors="replace")
    ours, t_ours = cpu_time(suffix_array, data)
    teaching, t_teaching = cpu_time(suffix_array_doubling, data, repeats=1)
    theirs, t_theirs = cpu_time(pydivsufsort.divsufsort, np.frombuffer(data, dtype=np.uint8).copy())
    print(f"[suffix array] n = {sa_chars:,} bytes: llmarch suffix_array {t_ours:.3f} s, pydivsufsort "
          f"{t_theirs:.4f} s -> llmarch/pydivsufsort time ratio {t_ours / t_theirs:.2f} "
          f"(equal: {np.array_equal(ours, theirs)}); the teaching suffix_array_doubling {t_teaching:.2f} s "
          f"-> ratio {t_teaching / t_theirs:.1f} (equal: {np.array_equal(teaching, theirs)})")


def html_pages(warc_files):
    pages = []
    for path in warc_files:
        for record in iter_warc(path):
            if getattr(record, "rec_type", None) == "response" and is_html(record.content_type) and record.payload:
                pages.append((record.payload, record.content_type, record.url))
    return pages


def bench_extraction(warc_files) -> None:
    import justext

    pages = html_pages(warc_files)
    texts, t_traf = cpu_time(lambda: [extract_text(p, c, u) for p, c, u in pages])
    again = [extract_text(p, c, u) for p, c, u in reversed(pages)][::-1]
    stoplist = justext.get_stoplist("English")
    _, t_just = cpu_time(lambda: [[q.text for q in justext.justext(p, stoplist) if not q.is_boilerplate]
                                  for p, _, _ in pages])
    n = len(pages)
    print(f"[extraction] {n} HTML pages: trafilatura {n / t_traf:,.0f} pages/s, jusText {n / t_just:,.0f} pages/s "
          f"-> trafilatura/jusText throughput ratio {t_just / t_traf:.2f}; "
          f"trafilatura identical in reverse order: {texts == again}")


def bench_pipeline(warc_files, partitions: int) -> None:
    from dask.distributed import Client, LocalCluster

    config = PipelineConfig(partitions=partitions)
    start = time.perf_counter()
    local, t_cpu = cpu_time(run_pipeline, warc_files, config)
    wall_local = time.perf_counter() - start
    n = len(local.documents)
    print(f"[pipeline] {n} documents, synchronous scheduler: {t_cpu:.2f} CPU s ({wall_local:.2f} s wall) -> "
          f"{n / t_cpu:,.0f} documents/s/core")
    walls = {}
    for workers in (1, 2):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as client:
                client.wait_for_workers(workers)
                before = sum(client.run(time.process_time).values()) + time.process_time()
                start = time.perf_counter()
                result = run_pipeline(warc_files, config, client=client)
                walls[workers] = time.perf_counter() - start
                cpu = sum(client.run(time.process_time).values()) + time.process_time() - before
        same = result.documents == local.documents
        print(f"[pipeline] LocalCluster, {workers} worker(s): {walls[workers]:.2f} s wall, {cpu:.2f} CPU s (workers "
              f"and driver) -> {n / cpu:,.0f} documents per CPU second (documents equal to the local run: {same})")
    print(f"[pipeline] scaling 1 -> 2 workers: {walls[1] / walls[2]:.2f}x (ideal 2; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a few seconds per section")
    parser.add_argument("--docs", type=int, help="documents for the MinHash and LSH sections (default 2000)")
    parser.add_argument("--pages", type=int, help="pages of the synthetic crawl (default 1000)")
    parser.add_argument("--sa-chars", type=int, help="characters for llmarch vs pydivsufsort (default 10,000,000)")
    parser.add_argument("--naive-chars", type=int, help="characters for the naive suffix sort (default 10,000)")
    args = parser.parse_args(argv)
    quick = args.quick
    n_docs = args.docs or (200 if quick else 2000)
    pages = args.pages or (60 if quick else 1000)
    sa_chars = args.sa_chars or (100_000 if quick else 10_000_000)
    naive_chars = args.naive_chars or (2_000 if quick else 10_000)

    texts, planted = corpus(n_docs)
    bench_minhash(texts, planted)
    bench_lsh(texts, planted)
    bench_suffix_array(texts, naive_chars, sa_chars)
    with tempfile.TemporaryDirectory() as tmp:
        crawl = write_synthetic_crawl(tmp, pages, seed=0)
        bench_extraction(crawl.warc_files)
        bench_pipeline(crawl.warc_files, partitions=4 if quick else 16)


if __name__ == "__main__":
    main()
