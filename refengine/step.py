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
    step.out_rows(il, n, x)     x cut to the rows whose output is asked for, at the last block (below)
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
    last_out: bool = False     # only the last row's output is asked for (Model.run_step(last_only=True))
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def T(self) -> int:
        return int(self.tokens.size)

    @property
    def n_past(self) -> int:
        return int(self.pos[0])

    def out_rows(self, il: int, n_layer: int, x):
        """x [T, ...] cut to its last row at the last block (il == n_layer - 1) of a step whose last row's output
        only is asked for (`last_out`), else x as it is; a list or tuple: each of its members (nested: Kimi-K3's bank
        of checkpoints). Every arch's block calls it between its attention half and its FFN half, where llama.cpp
        gathers the output rows (`inp_out_ids`, e.g. deepseek2.cpp:636-639): a prompt's last block then runs its FFN
        half on one row, as llama.cpp's does when only the next token's logits are wanted. Nothing after that point
        writes the state (the caches were written by the attention half), so the state is the same either way, and
        so is the last row's output up to the products' summation order over 1 row instead of T."""
        if not self.last_out or il != n_layer - 1:
            return x
        if isinstance(x, (list, tuple)):
            return type(x)(self.out_rows(il, n_layer, v) for v in x)
        return x[-1:]

    def memo(self, key, fn: Callable[[], Any]):
        if key not in self._memo:
            v = fn()
            if self.device is not None and isinstance(v, tuple) and all(isinstance(a, np.ndarray) for a in v):
                v = tuple(self.device.put(a) for a in v)
            self._memo[key] = v
        return self._memo[key]
