"""Command line of the web-data pipeline.

    python -m llmarch.webdata crawl --out DIR [--pages N] [--seed S] [--files K]
    python -m llmarch.webdata run WARC [WARC ...] --out DIR [--scheduler ADDRESS | --workers N] [--partitions P]
                                   [--languages en ...] [--min-language-probability P] [--near-threshold T]
                                   [--substring-min-words N] [--min-words N] [--fineweb-c4]
                                   [--substring-keep-first] [--url-blocklist FILE] [--benchmark FILE] [--quiet]

``crawl`` writes the synthetic crawl (WARC files and ``labels.jsonl``); ``run`` runs the pipeline and writes
``kept.jsonl``, ``removed.jsonl`` and ``stats.json``: in this process by default, on a local cluster of ``N``
worker processes with ``--workers N``, or on the ``dask.distributed`` cluster whose scheduler listens at
``--scheduler ADDRESS`` (e.g. ``tcp://10.0.0.5:8786``; the workers need ``llmarch`` importable and the WARC
paths readable). Read errors are printed as warnings and listed in ``stats.json``; the exit status is 0, or 1
when no record at all could be read.

Book: Pretraining data, "The pipeline"
"""

from __future__ import annotations

import argparse
import sys

from .crawl import write_synthetic_crawl
from .decontaminate import load_benchmark
from .pipeline import PipelineConfig, run_pipeline, write_outputs
from .urlfilter import UrlFilter, load_domain_list


def _crawl(args) -> int:
    crawl = write_synthetic_crawl(args.out, n_pages=args.pages, seed=args.seed, n_files=args.files)
    counts = ", ".join(f"{kind} {n}" for kind, n in sorted(crawl.counts.items()))
    print(f"wrote {len(crawl.warc_files)} WARC files and {crawl.labels} ({counts})", file=sys.stderr)
    return 0


def _run(args) -> int:
    config = PipelineConfig(
        languages=tuple(args.languages), min_language_probability=args.min_language_probability,
        near_threshold=args.near_threshold, substring_min_words=args.substring_min_words, min_words=args.min_words,
        partitions=args.partitions, c4_terminal_punctuation=not args.fineweb_c4,
        substring_keep_first=args.substring_keep_first,
        url_filter=UrlFilter(load_domain_list(args.url_blocklist)) if args.url_blocklist else None,
        benchmark_ngrams=load_benchmark(args.benchmark) if args.benchmark else None)
    client = cluster = None
    try:
        if args.scheduler or args.workers:
            from dask.distributed import Client, LocalCluster

            if args.scheduler:
                client = Client(args.scheduler, timeout="30s")
            else:
                cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
                client = Client(cluster)
        result = run_pipeline(args.warc, config, client=client, progress=not args.quiet)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    stats = write_outputs(args.out, result, config)
    for error in result.read_errors:
        record = f" (record {error.record_id}, {error.url or 'no URL'})" if error.record_id else ""
        print(f"warning: {error.source} at offset {error.offset}{record}: {error.error}", file=sys.stderr)
    for entry in stats["inputs"]:
        if "warning" in entry:
            print(f"warning: {entry['source']}: {entry['warning']}", file=sys.stderr)
    docs = stats["documents"]
    if not args.quiet:
        print(f"kept {docs['kept']} of {docs['in']} documents ({len(result.read_errors)} read errors); "
              f"wrote {args.out}/kept.jsonl, removed.jsonl, stats.json", file=sys.stderr)
    if not any(entry["records"] for entry in stats["inputs"]):
        print("error: no record could be read from the inputs", file=sys.stderr)
        return 1
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmarch.webdata", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    crawl = sub.add_parser("crawl", help="write the synthetic crawl: WARC files and labels.jsonl")
    crawl.add_argument("--out", required=True, help="output folder")
    crawl.add_argument("--pages", type=_positive, default=300, help="number of response records (default 300)")
    crawl.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    crawl.add_argument("--files", type=_positive, default=3, help="number of WARC files (default 3)")
    crawl.set_defaults(func=_crawl)

    run = sub.add_parser("run", help="run the pipeline on WARC files")
    run.add_argument("warc", nargs="+", help="WARC files (.warc or .warc.gz), in priority order")
    run.add_argument("--out", required=True, help="output folder for kept.jsonl, removed.jsonl, stats.json")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS", help="address of a dask.distributed scheduler")
    where.add_argument("--workers", type=_positive, help="run on a local cluster of this many worker processes")
    run.add_argument("--partitions", type=_positive, default=8, help="partitions of the per-document stages")
    run.add_argument("--languages", nargs="+", default=["en"],
                     help="languages to keep (default en); each needs filter rules: de en es fr ja zh")
    run.add_argument("--min-language-probability", type=float, default=0.5)
    run.add_argument("--near-threshold", type=float, default=0.8, help="Jaccard threshold of near duplicates")
    run.add_argument("--substring-min-words", type=_positive, default=50,
                     help="shortest repeated span (in words) that exact-substring dedup removes")
    run.add_argument("--min-words", type=int, default=50, help="documents shorter after substring dedup are removed")
    run.add_argument("--fineweb-c4", action="store_true",
                     help="FineWeb's C4 variant: no terminal-punctuation rule (lines without an end mark stay)")
    run.add_argument("--substring-keep-first", action="store_true",
                     help="exact-substring dedup keeps the first copy of a repeated span (default: cuts all)")
    run.add_argument("--url-blocklist", metavar="FILE", help="remove pages whose domain is listed (one a line)")
    run.add_argument("--benchmark", metavar="FILE",
                     help="cut the 13-grams of this benchmark (.jsonl: its string values; else lines) from pages")
    run.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    run.set_defaults(func=_run)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
