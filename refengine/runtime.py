"""How a forward pass is executed: arithmetic mode, kernel backend, and an optional trace.

Every weight multiply in the model goes through `Runtime.matmul` and every routed-expert evaluation
through `Runtime.moe_ffn`, so switching the backend or the mode never touches the model math.

A backend is a module with the NumPy oracle's signatures:

    matmul(x, w, *, mode="exact")          x [T, I] float32, w QTensor [O, I] -> [T, O]
    moe_ffn(x, ids, weights, **kw)         optional; default: the loop oracle in refengine.moe

    numpy  -> quant.ref   (the reference)
    cpu    -> quant.cpu   (Numba kernels)
    cuda   -> quant.cuda  (numba-cuda kernels)
"""
from __future__ import annotations


import importlib
from dataclasses import dataclass

import numpy as np

from quant import QTensor

from .errors import ConfigError, NonFiniteError
from .trace import Trace

MODES = ("exact", "llamacpp")
BACKENDS = {"numpy": "quant.ref", "cpu": "quant.cpu", "cuda": "quant.cuda"}


def load_backend(name: str):
    if name not in BACKENDS:
        raise ConfigError(f"backend {name!r} is not available; choose one of {', '.join(BACKENDS)}")
    try:
        mod = importlib.import_module(BACKENDS[name])
    except ImportError as e:
        raise ConfigError(f"backend {name!r} cannot be loaded: {e}") from None
    check = getattr(mod, "check_available", None)          # e.g. cuda: is there a GPU?
    if check is not None:
        try:
            check()
        except RuntimeError as e:
            raise ConfigError(f"backend {name!r}: {e}") from None
    return mod


@dataclass
class Runtime:
    mode: str = "exact"       # "exact": f32 math on dequantized weights; "llamacpp": activations rounded
                              # to the weight's partner type first, as ggml-cpu does (quant.llamacpp)
    backend: str = "numpy"    # see BACKENDS
    trace: Trace | None = None
    check_finite: bool = True
    attn_form: str | None = None   # the form of a fresh state's attention where an arch has two (MLA:
                                   # "absorbed", llama.cpp's and the default, or "naive"; see Model.new_state)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not available; choose one of {', '.join(MODES)}")
        self._be = load_backend(self.backend)
        self._device_models = {}

    def matmul(self, x: np.ndarray, w: QTensor) -> np.ndarray:
        """x: [T, I], w: [O, I] -> [T, O]. Raises NonFiniteError naming the weight if it produced NaN/inf."""
        y = self._be.matmul(x, w, mode=self.mode)
        if self.check_finite and not np.all(np.isfinite(y)) and np.all(np.isfinite(x)):
            raise NonFiniteError(f"weight {w.name!r} ({w.type.name}) produced NaN/inf from a finite input: "
                                 f"the tensor holds non-finite values")
        return y

    def moe_ffn(self, x, ids, weights, record=None, **kw) -> np.ndarray:
        """Routed experts: x [T, D], ids/weights [T, A] -> [T, D] (see refengine.moe.experts).
        `record`: a caller's recorder in place of `self.record` (it must pass the tensors on to it)."""
        rec = record or self.record
        fn = getattr(self._be, "moe_ffn", None)
        if fn is None or (kw.get("act") is not None and not getattr(self._be, "MOE_GATED_ACTS", False)):
            # another activation than SwiGLU on a backend without it (cpu): the loop oracle, its matmuls
            # still through this backend (the cuda backend takes `act`: grouped dispatch, activation on the host)
            from .moe import moe_ffn as fn
            return fn(x, ids, weights, matmul=self.matmul, record=rec, **kw)
        y = fn(x, ids, weights, mode=self.mode, record=rec if self.trace is not None else None, **kw)
        if self.check_finite and not np.all(np.isfinite(y)) and np.all(np.isfinite(x)):
            names = ", ".join(repr(kw[k].name) for k in ("gate", "up", "down") if kw.get(k) is not None)
            raise NonFiniteError(f"routed experts ({names}) produced NaN/inf from a finite input: "
                                 f"an expert that tokens were routed to holds non-finite values")
        return y

    def device_forward(self, model):
        """The cuda backend's whole-forward device path for `model` (refengine.cuda.DeviceModel), or None
        when the NumPy block code must run op by op: another backend, a trace, another mode, or an
        arch / tensor the device path does not cover."""
        if self.backend != "cuda" or self.trace is not None or self.mode != "exact":
            return None
        from .cuda import DeviceModel, unsupported
        if id(model) not in self._device_models:
            self._device_models[id(model)] = None if unsupported(model) else DeviceModel(model)
        dm = self._device_models[id(model)]
        return None if dm is None else dm.forward

    def record(self, name: str, il: int, value: np.ndarray) -> None:
        if self.trace is not None:
            self.trace(name, il, value)
