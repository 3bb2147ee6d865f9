"""Oracles: llama.cpp through llama-cpp-python, and the authors' PyTorch code in transformers (torch imported only
when a transformers function runs; docs/oracles.md)."""
from .llamacpp import LlamaCpp, OracleResult, generate_llamacpp, run_llamacpp
from .transformers import HFResult, hf_checkpoint, hf_forward, hf_model

__all__ = ["LlamaCpp", "OracleResult", "generate_llamacpp", "run_llamacpp",
           "HFResult", "hf_checkpoint", "hf_forward", "hf_model"]
