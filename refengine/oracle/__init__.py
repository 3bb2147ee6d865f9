"""Oracles: llama.cpp through llama-cpp-python (and, later, the authors' PyTorch code in transformers)."""
from .llamacpp import OracleResult, run_llamacpp

__all__ = ["OracleResult", "run_llamacpp"]
