"""Residual streams other than `x + f(x)`: Kimi-K3's attention residuals across layers (attn_res.py)."""
from .attn_res import ResidualStream, res_mix  # noqa: F401
