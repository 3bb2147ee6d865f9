"""Packed weights on the device: uploaded once, lazily, byte for byte as in the GGUF.

    dw = device_weight(qt)        # allocates; uploads nothing yet
    dw.ensure()                   # upload every row (dense matrices: on first use)
    dw.ensure(experts=[3, 17])    # upload only these experts of an [E, O, I] tensor (when first routed)

The cache is keyed on the QTensor's buffer (address, size, type, shape) and keeps a reference to the
host bytes, so an mmapped tensor is never uploaded twice and its address is never reused meanwhile.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ..ref import QTensor
from .decoders import spec, tables
from .fast_specs import packed_geometry

PAD = 16          # bytes after the tensor: a 4-byte read at any offset stays inside the allocation


class DeviceWeight:
    """One packed tensor in device memory. `w32` / `w16` are uint32 / float16 views of the same bytes."""

    def __init__(self, qt: QTensor):
        self.qt = qt
        self.type = qt.type
        self.shape = qt.shape
        self.rowb, self.estride = packed_geometry(qt)              # bytes per row, per expert
        self.E = qt.shape[0] if qt.ndim == 3 else 1
        self.O = qt.shape[-2] if qt.ndim >= 2 else 1
        self.I = qt.shape[-1]
        n = qt.nbytes + PAD
        n += (-n) % 16
        self.d8 = cuda.device_array(n, dtype=np.uint8)
        self.w32 = self.d8.view(np.uint32)
        self.w16 = self.d8.view(np.float16)
        self.resident = np.zeros(self.E, dtype=bool)
        self.spec = spec(qt.type)
        self.tab = device_table(self.spec.table)

    @property
    def nbytes(self) -> int:
        return self.qt.nbytes

    def ensure(self, experts=None, stream=0) -> "DeviceWeight":
        """Upload the listed experts (all rows when None) that are not on the device yet."""
        if experts is None:
            if not self.resident.all():
                o = 0
                for part in getattr(self.qt, "parts", (self.qt,)):          # a QStack: each part at its rows
                    self.d8[o:o + part.nbytes].copy_to_device(np.ascontiguousarray(part.raw).reshape(-1),
                                                              stream=stream)
                    o += part.nbytes
                self.resident[:] = True
            return self
        raw = self.qt.raw.reshape(self.E, -1)
        for e in np.unique(np.asarray(experts).reshape(-1)):
            e = int(e)
            if not self.resident[e]:
                o = e * self.estride
                self.d8[o:o + self.estride].copy_to_device(np.ascontiguousarray(raw[e]), stream=stream)
                self.resident[e] = True
        return self


_WEIGHTS: dict[tuple, DeviceWeight] = {}
_TABLES: dict[str, object] = {}


def _key(qt) -> tuple:
    parts = getattr(qt, "parts", None)                    # a QStack (quant.ref): its parts' buffers
    if parts is not None:
        return ("stack",) + tuple(_key(p) for p in parts)
    return (qt.raw.__array_interface__["data"][0], qt.nbytes, int(qt.type), qt.shape)


def device_weight(qt: QTensor) -> DeviceWeight:
    """The cached device copy of `qt` (allocated on first call, filled by `ensure`); a `quant.ref.QStack` is one
    weight of its parts' rows, each part's bytes copied at its offset (a part's own copy, if made, is another)."""
    k = _key(qt)
    dw = _WEIGHTS.get(k)
    if dw is None:
        dw = _WEIGHTS[k] = DeviceWeight(qt)
    return dw


def device_table(name: str):
    if name not in _TABLES:
        _TABLES[name] = cuda.to_device(tables()[name])
    return _TABLES[name]


def clear() -> None:
    """Drop every cached device weight (frees device memory once no kernel holds them)."""
    _WEIGHTS.clear()


def resident_bytes() -> int:
    return sum(dw.d8.size for dw in _WEIGHTS.values())
