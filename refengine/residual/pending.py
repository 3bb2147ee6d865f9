"""A residual stream whose last sublayer output is not added yet.

A pre-norm block ends with x + f and the next block (or the head) starts with rms_norm of that sum. Handing the next
block the pair (x, f) lets it make both at once, `ops.add_rms_norm` (one launch on a GPU, as llama.cpp's CUDA backend
fuses its add and rms_norm): the same numbers as the add and the norm one after the other (one float32 add, then the
norm of the sum).

A MoE block's f may itself be handed on unmade, `SlotSum`: its weighted expert slots [T, A, D] and its shared experts'
output, whose sum the next norm makes too (`ops.add_slots_rms_norm`: on a GPU the experts' combine, the adds and the
norm in one launch, as the qwen3moe device model fused them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import add_rms_norm, rms_norm
from ..ops.norm import add_slots_rms_norm, slot_sum


@dataclass
class SlotSum:
    """A MoE block's output not summed yet: slots [T, A, D], the routed experts' weighted outputs in slot order
    (`rt.moe_ffn(..., slots=True)`), plus extra [T, D] (the shared experts' output) or None."""
    slots: np.ndarray
    extra: np.ndarray | None = None

    @property
    def shape(self):
        return (self.slots.shape[0], self.slots.shape[2])

    def total(self) -> np.ndarray:
        """The sum on its own: slots[:, 0] + ... + slots[:, A - 1] (+ extra), `ops.slot_sum`."""
        return slot_sum(self.slots, self.extra)


@dataclass
class PendingAdd:
    """The residual x [T, D] and a sublayer's output f [T, D] (or a SlotSum), their sum x + f made by the next norm
    (`add_norm`)."""
    x: np.ndarray
    f: np.ndarray | SlotSum

    @property
    def shape(self):
        return self.x.shape

    def total(self) -> np.ndarray:
        """x + f on its own (a trace's record of the sum, where the next norm has not made it yet)."""
        return self.x + (self.f.total() if isinstance(self.f, SlotSum) else self.f)


def add_norm(r, w, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(the residual, rms_norm(the residual) * w): r a PendingAdd (x + f and its norm, `ops.add_rms_norm`; f a
    SlotSum: `ops.add_slots_rms_norm`) or an array (itself and its norm)."""
    if isinstance(r, PendingAdd) and isinstance(r.f, SlotSum):
        return add_slots_rms_norm(r.x, r.f.slots, r.f.extra, w, eps)
    if isinstance(r, PendingAdd):
        return add_rms_norm(r.x, r.f, w, eps)
    return r, rms_norm(r, w, eps)
