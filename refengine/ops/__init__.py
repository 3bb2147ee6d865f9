"""Small numerical building blocks shared by every architecture."""
from .activations import silu, swiglu
from .norm import layer_norm, rms_norm
from .rope import apply_rope, rope_cos_sin
from .softmax import softmax

__all__ = ["silu", "swiglu", "layer_norm", "rms_norm", "apply_rope", "rope_cos_sin", "softmax"]
