"""GGUF access: one virtual file over all shards, mmapped lazy tensors, lint."""
from .reader import GGUFFile, LazyArray, TensorInfo, read_gguf
from .model_file import GGUFModel, open_gguf, shard_path

__all__ = ["GGUFFile", "LazyArray", "TensorInfo", "read_gguf", "GGUFModel", "open_gguf", "shard_path"]
