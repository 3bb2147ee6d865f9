"""Per-sequence state carried between forward calls: the KV cache of every attention layer (f32)."""
from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values of every position seen so far, per layer, in float32 (llama.cpp with type_k = type_v = F32).

    `append` returns layer il's keys [S, Hkv, K] and values [S, Hkv, V]; `n_past` positions are filled.
    """

    def __init__(self, n_layer: int):
        self._k: list[np.ndarray | None] = [None] * n_layer     # capacity-doubling buffers
        self._v: list[np.ndarray | None] = [None] * n_layer
        self._n = [0] * n_layer
        self.n_past = 0

    def append(self, il: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the new positions of layer il and return all positions: [S, Hkv, K], [S, Hkv, V]."""
        n, T = self._n[il], k.shape[0]
        if self._k[il] is None or n + T > self._k[il].shape[0]:
            cap = max(2 * (n + T), 16)                   # amortized O(1) per position, not a copy per token
            for bufs, new in ((self._k, k), (self._v, v)):
                grown = np.empty((cap, *new.shape[1:]), dtype=np.float32)
                if bufs[il] is not None:
                    grown[:n] = bufs[il][:n]
                bufs[il] = grown
        self._k[il][n:n + T] = k
        self._v[il][n:n + T] = v
        self._n[il] = n + T
        return self._k[il][:n + T], self._v[il][:n + T]
