"""Per-sequence state carried between forward calls: the KV cache of every attention layer (f32)."""
from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values of every position seen so far, per layer, in float32 (llama.cpp with type_k = type_v = F32).

    k[il]: [S, Hkv, K], v[il]: [S, Hkv, V]; `n_past` positions are filled.
    """

    def __init__(self, n_layer: int):
        self.k: list[np.ndarray | None] = [None] * n_layer
        self.v: list[np.ndarray | None] = [None] * n_layer
        self.n_past = 0

    def append(self, il: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the new positions of layer il and return all positions: [S, Hkv, K], [S, Hkv, V]."""
        if self.k[il] is None:
            self.k[il], self.v[il] = k.copy(), v.copy()
        else:
            self.k[il] = np.concatenate([self.k[il], k], axis=0)
            self.v[il] = np.concatenate([self.v[il], v], axis=0)
        return self.k[il], self.v[il]
