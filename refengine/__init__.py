"""refengine: a readable NumPy reference engine for large MoE models read from GGUF, checked against llama.cpp."""
from .config import ModelConfig
from .errors import RefengineError
from .gguf import open_gguf
from .model import Model
from .runtime import Runtime
from .trace import Trace

__all__ = ["Model", "ModelConfig", "RefengineError", "Runtime", "Trace", "open_gguf"]
__version__ = "0.1.0"
