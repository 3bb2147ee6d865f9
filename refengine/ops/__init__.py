"""Small numerical building blocks shared by every architecture."""
from .arrays import as_array, contiguous
from .activations import sigmoid, silu, softplus, swiglu
from .norm import add_rms_norm, layer_norm, rms_norm, rms_norm_gated
from .rope import apply_rope, apply_rope_qk, rms_norm_rope, rms_norm_rope_qk, rope_cos_sin
from .softmax import softmax

__all__ = [
    "add_rms_norm", "as_array", "contiguous", "sigmoid", "silu", "softplus", "swiglu", "layer_norm", "rms_norm",
    "rms_norm_gated",
    "apply_rope", "apply_rope_qk", "rms_norm_rope", "rms_norm_rope_qk", "rope_cos_sin", "softmax"
]
