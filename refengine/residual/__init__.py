"""Residual streams other than `x + f(x)` made at once: Kimi-K3's attention residuals across layers (attn_res.py),
the sum left to the next norm (pending.py)."""
from .attn_res import ResidualStream, res_mix  # noqa: F401
from .pending import PendingAdd, add_norm  # noqa: F401
