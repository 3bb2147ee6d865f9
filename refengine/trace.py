"""Named intermediates, under llama.cpp's own graph names (`attn_norm-0`, `Qcur-0`, `l_out-3`, `result_output`).

llama.cpp names a tensor `NAME-IL` when `cb(t, "NAME", il)` is called with il >= 0 and `NAME` when il < 0
(`llm_graph_context::cb`). A tensor keeps the *last* name given to it (the llama graph names the residual
sum `ffn_out` and then `l_out`, so `ffn_out-IL` is the feed-forward output before the residual), and
several tensors may share a name (`Qcur-IL` before and after RoPE): the last one computed counts. Arrays are stored in NumPy order, the reverse of ggml's `ne`
(ggml `Qcur` with ne = {K, H, T} is a NumPy `[T, H, K]`), so the flat bytes line up with llama.cpp's.
"""
from __future__ import annotations

import numpy as np


def tensor_name(name: str, il: int) -> str:
    return f"{name}-{il}" if il >= 0 else name


class Trace:
    """Records intermediates; `names=None` keeps everything, otherwise only the listed names."""

    def __init__(self, names: set[str] | None = None):
        self.names = names
        self.tensors: dict[str, np.ndarray] = {}
        self.earlier: dict[str, list] = {}       # a name recorded again: the earlier values, in order

    def wants(self, name: str, il: int) -> bool:
        """Whether a tensor recorded under this name would be kept."""
        return self.names is None or tensor_name(name, il) in self.names

    def __call__(self, name: str, il: int, value: np.ndarray) -> None:
        key = tensor_name(name, il)
        if self.names is None or key in self.names:
            if key in self.tensors:
                self.earlier.setdefault(key, []).append(self.tensors[key])
            self.tensors[key] = np.array(value() if callable(value) else value, copy=True)   # (a lazy value)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def save(self, path: str) -> None:
        """Write all tensors to one .npz file (readable by any engine with NumPy)."""
        np.savez(path, **self.tensors)
