"""Write one GGUF file, streaming tensor data, with metadata copied byte for byte from a file we read.

Layout (GGUF v3, little endian; the same one `reader.py` parses):

    magic "GGUF" | u32 3 | u64 n_tensors | u64 n_kv
    n_kv x      { str key | u32 value_type | value }            arrays: u32 elem_type | u64 n | payload
    n_tensors x { str name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
    zero padding to `alignment`, then each tensor's bytes, each padded to `alignment`

Array values read by `reader.py` are `LazyArray` views into the source mmap; their payload bytes are
copied as they are (a 262k-entry vocabulary is never turned into Python objects). Tensor data is written
as the caller produces it, chunk by chunk, so memory stays bounded by one chunk.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from gguf.constants import GGUFValueType

from quant import type_info

from ..errors import GGUFError
from .reader import STRUCT_FORMAT, LazyArray

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3


@dataclass
class PlannedTensor:
    name: str
    type: int                 # ggml type id
    ne: tuple[int, ...]       # ggml order
    nbytes: int
    offset: int = 0           # relative to the start of the data section


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: GGUFValueType, value) -> bytes:
    if vtype == GGUFValueType.STRING:
        return _str(value)
    if vtype == GGUFValueType.ARRAY:
        if not isinstance(value, LazyArray):
            raise GGUFError(f"array values must come from a read GGUF file (LazyArray), got {type(value).__name__}")
        head = struct.pack("<IQ", int(value.elem_type), value.count)
        return head + bytes(value._buf[value._offset:value._end])
    return struct.pack(STRUCT_FORMAT[vtype], value)


class GGUFWriter:
    """`w = GGUFWriter(path, kv, tensors, alignment)`; `w.write_header()`; then for every tensor, in order,
    `w.write_tensor(name, chunks)`; `w.close()`.   kv: [(key, GGUFValueType, value)]."""

    def __init__(self, path: str | os.PathLike, kv: list, tensors: list[PlannedTensor], alignment: int = 32):
        self.path = os.fspath(path)
        self.kv, self.tensors, self.alignment = kv, tensors, alignment
        off = 0
        for t in tensors:
            t.offset = off
            off += -(-t.nbytes // alignment) * alignment
        self._next = 0
        self._f = None

    def _pad(self) -> None:
        n = -self._f.tell() % self.alignment
        self._f.write(b"\0" * n)

    def write_header(self) -> None:
        self._f = open(self.path, "wb")
        out = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))]
        for key, vtype, value in self.kv:
            out += [_str(key), struct.pack("<I", int(vtype)), _value(vtype, value)]
        for t in self.tensors:
            out += [_str(t.name), struct.pack("<I", len(t.ne)), struct.pack(f"<{len(t.ne)}Q", *t.ne),
                    struct.pack("<IQ", t.type, t.offset)]
        self._f.write(b"".join(out))
        self._pad()
        self._data_start = self._f.tell()

    def write_tensor(self, name: str, chunks) -> None:
        """Write the next tensor's bytes from an iterable of byte-like chunks (NumPy arrays)."""
        t = self.tensors[self._next]
        if t.name != name:
            raise GGUFError(f"{self.path}: expected tensor {t.name!r} next, got {name!r}")
        if self._f.tell() != self._data_start + t.offset:
            raise GGUFError(f"{self.path}: tensor {name!r} would start at the wrong offset")
        n = 0
        for c in chunks:
            b = memoryview(c).cast("B")
            self._f.write(b)
            n += b.nbytes
        if n != t.nbytes:
            raise GGUFError(f"{self.path}: tensor {name!r} ({type_info(t.type).type.name} {list(t.ne)}) "
                            f"got {n} bytes, expected {t.nbytes}")
        self._pad()
        self._next += 1

    def close(self) -> None:
        if self._f is not None:
            if self._next != len(self.tensors):
                self._f.close()
                raise GGUFError(f"{self.path}: closed after {self._next} of {len(self.tensors)} tensors")
            self._f.close()
            self._f = None
