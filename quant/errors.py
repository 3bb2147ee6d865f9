"""The error every quant entry point raises on a tensor it cannot handle (a leaf: it imports nothing)."""
from __future__ import annotations


class QuantError(ValueError):
    """A tensor whose bytes cannot be decoded (unsupported type, wrong byte count)."""
