"""NumPy reference: dequantize any ggml tensor, and the one matmul entry point every weight goes through.

A weight is a `QTensor`: its packed bytes as a read-only uint8 view (usually an mmap of the GGUF), its
ggml type, and its logical shape in NumPy order (`[..., rows, cols]`, cols = ggml `ne0`, contiguous).
Nothing here knows about models.

    y = matmul(x, w)        x: [T, I] float32, w: QTensor [O, I]  ->  y: [T, O] float32
                            (ggml_mul_mat(w, x) with ggml's ne = {I, O})
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .decode import DecodeError, decode
from .errors import QuantError
from .formats import GGMLType, TypeInfo, type_info


@dataclass(frozen=True)
class QTensor:
    """A packed ggml tensor: `raw` is uint8 `[*shape[:-1], row_bytes]`, shape is NumPy order."""
    name: str
    type: GGMLType
    shape: tuple[int, ...]
    raw: np.ndarray

    @staticmethod
    def from_raw(name: str, ggml_type, shape, raw: np.ndarray) -> "QTensor":
        """Wrap packed bytes (any contiguous array, reinterpreted as uint8) as a QTensor, checking the size."""
        info = type_info(ggml_type)
        shape = tuple(int(s) for s in shape)
        if not shape:
            shape = (1,)
        try:
            row_bytes = info.row_bytes(shape[-1])
        except ValueError as e:
            raise QuantError(f"tensor {name!r}: {e}") from None
        buf = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        want = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
        if buf.size != want:
            raise QuantError(f"tensor {name!r}: {info.type.name} {list(shape)} needs {want} bytes, got {buf.size}")
        return QTensor(name, info.type, shape, buf.reshape(*shape[:-1], row_bytes))

    @property
    def info(self) -> TypeInfo:
        return type_info(self.type)

    @property
    def nbytes(self) -> int:
        return int(self.raw.size)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, i: int) -> "QTensor":
        """Slice along the first axis, e.g. one expert of a `[E, O, I]` tensor. Still packed, no copy."""
        if self.ndim < 2:
            raise IndexError(f"tensor {self.name!r} of shape {list(self.shape)} cannot be indexed")
        n = self.shape[0]
        if not -n <= i < n:
            raise IndexError(f"tensor {self.name!r}: index {i} out of range for first axis of {n}")
        return QTensor(f"{self.name}[{i}]", self.type, self.shape[1:], self.raw[i])

    def rows(self, start: int, stop: int) -> "QTensor":
        """Rows `start:stop` of a 2-D tensor, still packed."""
        return QTensor(self.name, self.type, (stop - start, self.shape[-1]), self.raw[start:stop])

    @property
    def row_bytes(self) -> int:
        """Packed bytes of one row."""
        return int(self.raw.shape[-1])


@dataclass(frozen=True)
class QStack:
    """2-D tensors of one type and width with their rows one after another, as one weight: several products of one
    input made as one (q, k and v; a FFN's gate and up). Nothing is copied on the host: a device uploads each
    part's bytes at its rows' offset (`quant.cuda.weights`), a host multiplies by the parts one by one."""
    parts: tuple

    def __post_init__(self):
        p0 = self.parts[0] if self.parts else None
        if p0 is None or any(not isinstance(p, QTensor) or p.ndim != 2 or p.type != p0.type
                             or p.shape[-1] != p0.shape[-1] for p in self.parts):
            names = [getattr(p, "name", p) for p in self.parts]
            raise QuantError(f"stack of {names}: needs 2-D tensors of one type and width")

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    @property
    def type(self) -> GGMLType:
        return self.parts[0].type

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[-1])

    ndim = 2

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def row_bytes(self) -> int:
        return self.parts[0].row_bytes

    def bounds(self) -> list[tuple[int, int]]:
        """Each part's rows [start, stop) in the stack (its output columns in a product)."""
        out, o = [], 0
        for p in self.parts:
            out.append((o, o + p.shape[0]))
            o += p.shape[0]
        return out


def _decode(raw: np.ndarray, t: GGMLType, name: str) -> np.ndarray:
    """Packed bytes `[..., row_bytes]` -> float32 `[..., cols]` (bit-exact with ggml, see `quant.decode`)."""
    try:
        return decode(raw, t)
    except DecodeError as e:
        raise QuantError(f"tensor {name!r}: {e}") from None


def dequantize(w: QTensor) -> np.ndarray:
    """Decode a whole tensor to float32 of shape `w.shape`. For big tensors prefer `matmul` or `dequantize_rows`."""
    return _decode(w.raw, w.type, w.name).reshape(w.shape)


def dequantize_rows(w: QTensor, rows: np.ndarray) -> np.ndarray:
    """Decode selected rows of a 2-D tensor (an embedding lookup): rows [N] -> [N, cols]."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= w.shape[0]):
        raise IndexError(f"tensor {w.name!r}: row index out of range [0, {w.shape[0]}): {rows.min()}..{rows.max()}")
    return _decode(np.ascontiguousarray(w.raw[rows]), w.type, w.name).reshape(len(rows), w.shape[-1])


# Dequantized rows per chunk in matmul: bounds the float32 scratch to ~32 MB whatever the tensor size.
CHUNK_ELEMENTS = 8 << 20


MODES = ("exact", "llamacpp")


def matmul(x: np.ndarray, w: QTensor, *, mode: str = "exact") -> np.ndarray:
    """y = x @ dequantize(w).T, in float32, one row block of w at a time.

    x: [T, I] float32; w: [O, I] any ggml type  ->  [T, O] float32.
    mode "exact":    the product with the dequantized weights, nothing else rounded.
    mode "llamacpp": x is first rounded to the weight's partner type as ggml-cpu does
                     (`quant.llamacpp.round_activations`: Q8_0 / Q8_1 / Q8_K blocks, f16, bf16), which is
                     what `ggml_mul_mat(w, x)` on llama.cpp's CPU backend computes.
    """
    if mode not in MODES:
        raise QuantError(f"matmul: mode {mode!r} is not implemented (available: {', '.join(MODES)})")
    if w.ndim != 2:
        raise QuantError(f"matmul: weight {w.name!r} must be 2-D, got shape {list(w.shape)}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise QuantError(f"matmul: input {list(x.shape)} does not match weight {w.name!r} {list(w.shape)} (need [T, {w.shape[1]}])")
    x_in = x
    if mode == "llamacpp":
        from .llamacpp import round_activations
        try:
            x = round_activations(x, w.type)             # [T, I], the values ggml-cpu's dot products see
        except ValueError as e:
            raise QuantError(f"matmul: weight {w.name!r}: {e}") from None
    O, I = w.shape
    y = np.empty((x.shape[0], O), dtype=np.float32)
    step = max(1, CHUNK_ELEMENTS // max(I, 1))
    for r0 in range(0, O, step):
        r1 = min(O, r0 + step)
        wd = _decode(w.raw[r0:r1], w.type, w.name)   # [r, I]
        np.matmul(x, wd.T, out=y[:, r0:r1])
    if mode == "llamacpp" and w.type in (GGMLType.Q4_1, GGMLType.Q5_1):
        from .llamacpp import q8_1_min_term
        y += q8_1_min_term(x_in, w.raw, w.type)          # ggml uses the fp16 block sum s of Q8_1
    return y
