"""Oracles: llama.cpp through llama-cpp-python (and, later, the authors' PyTorch code in transformers)."""
from .llamacpp import LlamaCpp, OracleResult, generate_llamacpp, run_llamacpp

__all__ = ["LlamaCpp", "OracleResult", "generate_llamacpp", "run_llamacpp"]
