"""What every block of one forward call sees: the step.

    step.tokens   [T] int64     the token ids of this call (hash routing and n-gram embeddings read them)
    step.pos      [T] int64     their absolute positions (n_past .. n_past + T - 1)
                                (both on the device in a resident run: masks and rope tables are made there)
    step.n_ctx    int           the context size (picks long/short rope factors, like llama.cpp's n_ctx_seq)
    step.g        namespace     the model's global tensors (rope factors live there)
    step.memo(key, fn)          fn() computed once per step and shared by the layers that ask for `key`:
                                a block asks for its own rope parameters, so layers may differ
    step.device                 the Device a resident forward runs on (refengine.devarray), or None: a memoized
                                tuple of host arrays is put there once, not uploaded by every layer
A memo holds values of this step's positions: a step is made per forward call (a captured graph replays the ops
that computed them, reading the positions' buffer, so a replay with new positions recomputes them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass
class Step:
    tokens: np.ndarray
    pos: np.ndarray
    n_ctx: int
    g: Any = None
    device: Any = None
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def T(self) -> int:
        return int(self.tokens.size)

    @property
    def n_past(self) -> int:
        return int(self.pos[0])

    def memo(self, key, fn: Callable[[], Any]):
        if key not in self._memo:
            v = fn()
            if self.device is not None and isinstance(v, tuple) and all(isinstance(a, np.ndarray) for a in v):
                v = tuple(self.device.put(a) for a in v)
            self._memo[key] = v
        return self._memo[key]
