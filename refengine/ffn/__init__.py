"""Feed-forward blocks: the dense gated FFN; the MoE block (router + routed + shared experts) is in `refengine.moe`."""
from .dense import dense_ffn, dense_ffn_table

__all__ = ["dense_ffn", "dense_ffn_table"]
