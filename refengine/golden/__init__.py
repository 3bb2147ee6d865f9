"""Golden outputs other engines test against (`make_golden`, `check_golden`), a KL-divergence base over a corpus
(`make_golden_corpus`) and the conformance kit."""
from .check import check_golden, load_dump, load_golden
from .corpus import make_golden_corpus, tokenize_text
from .write import MANIFEST_FILE, TENSORS_FILE, make_golden

__all__ = ["MANIFEST_FILE", "TENSORS_FILE", "check_golden", "load_dump", "load_golden", "make_golden",
           "make_golden_corpus", "tokenize_text"]
