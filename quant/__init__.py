"""ggml quantization formats, with no model knowledge: type table, NumPy reference, fast kernels."""
from .formats import GGMLType, TypeInfo, TYPES, UnknownTypeError, type_info
from .ref import QStack, QTensor, QuantError, dequantize, dequantize_rows, matmul

__all__ = ["GGMLType", "TypeInfo", "TYPES", "UnknownTypeError", "type_info",
           "QTensor", "QStack", "QuantError", "dequantize", "dequantize_rows", "matmul"]
