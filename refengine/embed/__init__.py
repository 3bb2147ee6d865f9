"""Embeddings beyond the token table: hashed n-gram (per-layer) embeddings (ngram.py)."""
