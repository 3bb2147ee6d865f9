"""A residual stream whose last sublayer output is not added yet.

A pre-norm block ends with x + f and the next block (or the head) starts with rms_norm of that sum. Handing the next
block the pair (x, f) lets it make both at once, `ops.add_rms_norm` (one launch on a GPU, as llama.cpp's CUDA backend
fuses its add and rms_norm): the same numbers as the add and the norm one after the other (one float32 add, then the
norm of the sum).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import add_rms_norm, rms_norm


@dataclass
class PendingAdd:
    """The residual x [T, D] and a sublayer's output f [T, D], their sum x + f made by the next norm (`add_norm`)."""
    x: np.ndarray
    f: np.ndarray

    @property
    def shape(self):
        return self.x.shape

    def total(self) -> np.ndarray:
        """x + f on its own (a trace's record of the sum, where the next norm has not made it yet)."""
        return self.x + self.f


def add_norm(r, w, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(the residual, rms_norm(the residual) * w): r a PendingAdd (x + f and its norm, `ops.add_rms_norm`) or an
    array (itself and its norm)."""
    if isinstance(r, PendingAdd):
        return add_rms_norm(r.x, r.f, w, eps)
    return r, rms_norm(r, w, eps)
