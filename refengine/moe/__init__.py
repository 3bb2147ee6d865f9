"""Mixture-of-experts: routing (scores -> ids, weights) and expert evaluation."""
from .experts import moe_ffn
from .router import softmax_topk, topk_desc

__all__ = ["moe_ffn", "softmax_topk", "topk_desc"]
