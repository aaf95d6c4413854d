"""Pretraining data: from WARC files to clean, deduplicated text.

Book: Pretraining data (``book/pretraining-data.md``).

Modules, one topic each:
- :mod:`.minhash`: shingles, Jaccard, MinHash signatures, LSH banding, union-find, ``near_duplicate_clusters``;
- :mod:`.simhash`: SimHash fingerprints and clusters by Hamming distance;
- :mod:`.suffix`: suffix and LCP arrays, ``repeated_spans`` (ExactSubstr);
- :mod:`.pii`: ``redact_pii`` (e-mail, phone, IPv4), with a labelled set in :mod:`.pii_examples`;
- :mod:`.quality`: C4's and Gopher's rules, each returning a :class:`FilterResult` with its reasons;
  :mod:`.languages`: their per-language rules (en, de, fr, es, ja, zh);
- :mod:`.classifier`: a hashed n-gram logistic-regression quality classifier; :mod:`.decontaminate`: GPT-3's
  13-gram decontamination; :mod:`.urlfilter`: a domain blocklist and URL word scores;
- :mod:`.perplexity`: a Kneser-Ney n-gram model and CCNet's perplexity buckets;
- :mod:`.langid`: language identification with py3langid;
- :mod:`.crawl`: a deterministic synthetic crawl (WARC files and hidden labels); :mod:`.realdata`: the real
  crawl files and pages the set-up fetches; :mod:`.warc` reads WARC and ARC records; :mod:`.decode` decodes
  pages as browsers do and extracts their text; :mod:`.stages` holds the per-document stages and
  :mod:`.pipeline` the Dask pipeline behind ``python -m llmarch.webdata run`` (imported on their own, so that
  ``import llmarch.webdata`` does not load dask and trafilatura).
"""

from .crawl import read_labels, write_synthetic_crawl
from .langid import identify_language, language_filter
from .minhash import (
    MERSENNE_PRIME,
    UnionFind,
    band_errors,
    band_keys,
    candidate_pairs,
    choose_bands,
    connected_components,
    hash_items,
    jaccard,
    lsh_probability,
    minhash_jaccard,
    minhash_permutations,
    minhash_signature,
    near_duplicate_clusters,
    shingles,
    universal_hash,
    words,
)
from .perplexity import NGramLanguageModel, perplexity_bucket, perplexity_cutoffs, perplexity_filter, train_ngram_model
from .pii import PII_PLACEHOLDERS, PIISpan, find_pii, pii_scores, redact_pii
from .quality import (
    C4_POLICY_PHRASES,
    GOPHER_REPETITION_THRESHOLDS,
    GOPHER_STOP_WORDS,
    FilterResult,
    c4_filter,
    c4_line_filter,
    count_sentences,
    gopher_quality_filter,
    gopher_repetition_filter,
    gopher_repetition_statistics,
    gopher_statistics,
)
from .simhash import hamming_distance, simhash, simhash_blocks, simhash_clusters
from .suffix import (
    as_token_array,
    lcp_array,
    repeated_spans,
    repeated_spans_across,
    suffix_array,
    suffix_array_doubling,
)
