"""Figure-drawing helpers for the book's chapters (diagrams drawn with matplotlib at build time)."""
