"""Mixture-of-experts: routing (scores -> ids, weights) and expert evaluation."""
from .experts import moe_ffn
from .router import route, softmax_topk, topk_desc

__all__ = ["moe_ffn", "route", "softmax_topk", "topk_desc"]
