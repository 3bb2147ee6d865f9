"""Attention variants: softmax MHA/GQA over a KV cache; MLA, sparse indexers and linear attention to come."""
from .mha import attention, causal_mask

__all__ = ["attention", "causal_mask"]
