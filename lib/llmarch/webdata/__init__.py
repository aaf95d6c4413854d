"""Pretraining data: from WARC files to clean, deduplicated text (placeholder; being written)."""
