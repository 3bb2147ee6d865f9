"""The GPU path of the model (numba-cuda): device kernels for norms, RoPE, attention and routing, and
`DeviceModel`, the whole llama / qwen3moe forward with activations kept on the device.

Weight multiplies and expert dispatch are `quant.cuda`'s kernels; this package only adds what
needs model knowledge. `Runtime(backend="cuda")` uses `DeviceModel` when no trace is recorded.
"""
from .runner import DeviceModel, unsupported

__all__ = ["DeviceModel", "unsupported"]
