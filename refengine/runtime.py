"""How a forward pass is executed: arithmetic mode, kernel backend, and an optional trace.

Every weight multiply in the model goes through `Runtime.matmul`, so switching the backend or the
mode never touches the model math.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import quant
from quant import QTensor

from .errors import ConfigError
from .trace import Trace

MODES = ("exact",)
BACKENDS = ("numpy",)


@dataclass
class Runtime:
    mode: str = "exact"       # "exact": f32 math on dequantized weights
    backend: str = "numpy"    # "numpy": quant.ref
    trace: Trace | None = None
    check_finite: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not available; choose one of {', '.join(MODES)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend {self.backend!r} is not available; choose one of {', '.join(BACKENDS)}")

    def matmul(self, x: np.ndarray, w: QTensor) -> np.ndarray:
        """x: [T, I], w: [O, I] -> [T, O]."""
        return quant.matmul(x, w)

    def record(self, name: str, il: int, value: np.ndarray) -> None:
        if self.trace is not None:
            self.trace(name, il, value)
