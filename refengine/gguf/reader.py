"""Read one GGUF file: header, metadata and tensor table parsed from an mmap; tensor data never copied.

Layout (GGUF v2/v3, little endian), as `ggml/src/gguf.cpp` writes it:

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x   { str key | u32 value_type | value }          (arrays: u32 elem_type | u64 n | n values)
    n_tensors x { str name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
    padding to `general.alignment` (default 32)
    tensor data: each tensor at data_start + offset

Why not `gguf.GGUFReader`: it materializes every array element as a Python object (a 262k-token
vocabulary costs 9 s and 700 MB) and reports a cut file as a NumPy error. This reader keeps arrays
lazy (string arrays are decoded only when asked for) and names the file and the item on every error.
The type enums come from `gguf.constants` and `quant.formats`.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np
from gguf.constants import GGUFValueType

from quant import QTensor
from quant.formats import GGMLType, UnknownTypeError as _QUnknown, type_info

from ..errors import MalformedGGUFError, TensorBoundsError, TruncatedFileError, UnknownTypeError

GGUF_MAGIC = b"GGUF"
_SCALAR = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "<u1", GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}
STRUCT_FORMAT = {                 # `struct` format of each scalar value type (the reader's and the writer's)
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<B", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
MAX_DIMS = 4
# ggml's gguf reader limits (ggml/src/gguf.cpp): a string and an array at most 2**30 bytes / elements,
# a tensor name shorter than GGML_MAX_NAME, element counts and byte sizes representable in int64.
MAX_STRING = 1024 * 1024 * 1024
MAX_ARRAY = 1024 * 1024 * 1024
MAX_NAME = 64
INT64_MAX = 2**63 - 1


class LazyArray:
    """A GGUF array value; numeric arrays are zero-copy NumPy views, string arrays decode on first use."""

    def __init__(self, buf, offset: int, end: int, elem_type: GGUFValueType, count: int):
        self._buf, self._offset, self._end = buf, offset, end
        self.elem_type, self.count = elem_type, count
        self._value = None

    def __len__(self) -> int:
        return self.count

    @property
    def value(self):
        if self._value is None:
            if self.elem_type == GGUFValueType.STRING:
                out, off = [], self._offset
                for _ in range(self.count):
                    (n,) = struct.unpack_from("<Q", self._buf, off)
                    out.append(bytes(self._buf[off + 8: off + 8 + n]).decode("utf-8", errors="replace"))
                    off += 8 + n
                self._value = out
            else:
                arr = np.frombuffer(self._buf, dtype=_SCALAR[self.elem_type], count=self.count, offset=self._offset)
                self._value = arr.astype(bool) if self.elem_type == GGUFValueType.BOOL else arr
        return self._value

    def __repr__(self) -> str:
        return f"<array {self.elem_type.name} x {self.count}>"


@dataclass
class TensorInfo:
    name: str
    type: GGMLType
    ne: tuple[int, ...]       # ggml order: ne[0] is the contiguous dimension
    offset: int               # absolute byte offset in the file
    nbytes: int
    path: str

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order: reversed ne."""
        return tuple(reversed(self.ne))


@dataclass
class GGUFFile:
    path: str
    version: int
    kv: dict = field(default_factory=dict)           # key -> python scalar / str / LazyArray
    kv_types: dict = field(default_factory=dict)     # key -> GGUFValueType
    tensors: dict = field(default_factory=dict)      # name -> TensorInfo (file order)
    alignment: int = 32
    data_start: int = 0
    size: int = 0
    _mm: object = None

    def tensor(self, name: str) -> QTensor:
        """The packed bytes of one tensor as an mmapped QTensor view (no read happens until used)."""
        ti = self.tensors[name]
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=ti.nbytes, offset=ti.offset)
        return QTensor.from_raw(name, ti.type, ti.shape, raw)

    def advise_random(self, name: str) -> None:
        """Tell the kernel that tensor `name` is read at scattered rows (MADV_RANDOM): a page fault then reads that
        page only, not a read-ahead window around it (an n-gram table read a few rows at a time: with read-ahead,
        each row cost ~1 MB of page cache and 7 ms)."""
        ti = self.tensors[name]
        start = ti.offset - ti.offset % mmap.PAGESIZE
        if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            self._mm.madvise(mmap.MADV_RANDOM, start, ti.offset + ti.nbytes - start)


class _Cursor:
    def __init__(self, buf, path: str, size: int):
        self.buf, self.path, self.size, self.off = buf, path, size, 0

    def need(self, n: int, what: str):
        if self.off + n > self.size:
            raise TruncatedFileError(
                f"{self.path}: file ends at byte {self.size} while reading {what} "
                f"(needs bytes {self.off}..{self.off + n}); the file is truncated or not a GGUF")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.off)
        self.off += n
        return v[0] if len(v) == 1 else v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"length of {what}")
        if n > MAX_STRING or n > self.size:
            raise MalformedGGUFError(f"{self.path}: {what} claims a length of {n} bytes, larger than the file")
        self.need(n, what)
        s = bytes(self.buf[self.off:self.off + n]).decode("utf-8", errors="replace")
        self.off += n
        return s

    def value(self, vtype: int, what: str):
        try:
            vt = GGUFValueType(vtype)
        except ValueError:
            raise MalformedGGUFError(f"{self.path}: {what} has unknown value type {vtype}") from None
        if vt == GGUFValueType.STRING:
            return self.string(what)
        if vt == GGUFValueType.ARRAY:
            et = self.unpack("<I", f"element type of {what}")
            n = self.unpack("<Q", f"element count of {what}")
            try:
                et = GGUFValueType(et)
            except ValueError:
                raise MalformedGGUFError(f"{self.path}: array {what} has unknown element type {et}") from None
            if n > MAX_ARRAY:
                raise MalformedGGUFError(f"{self.path}: array {what} claims {n} elements (ggml reads at most {MAX_ARRAY})")
            start = self.off
            if et == GGUFValueType.STRING:
                self.need(8 * n, f"{n} string lengths of {what}")       # every element has at least its length
                for i in range(n):
                    m = self.unpack("<Q", f"{what}[{i}] length")
                    self.need(m, f"{what}[{i}]")
                    self.off += m
            elif et == GGUFValueType.ARRAY:
                raise MalformedGGUFError(f"{self.path}: nested arrays in {what} are not supported by GGUF readers")
            else:
                nb = n * np.dtype(_SCALAR[et]).itemsize
                self.need(nb, what)
                self.off += nb
            return LazyArray(self.buf, start, self.off, et, n)
        v = self.unpack(STRUCT_FORMAT[vt], what)
        return bool(v) if vt == GGUFValueType.BOOL else v


def _overflows(ne: tuple[int, ...]) -> bool:
    """ggml's test (gguf.cpp): a dimension >= 2**63, or the running element count leaving int64."""
    if max(ne) > INT64_MAX:
        return True
    n = ne[0]
    for d in ne[1:]:
        if d > 1 and INT64_MAX // d < n:
            return True
        n *= d
    return False


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse the header, metadata and tensor table of one GGUF file and validate every tensor's bounds."""
    path = os.fspath(path)
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise MalformedGGUFError(f"{path}: cannot open: {e.strerror}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise TruncatedFileError(f"{path}: file is empty")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(mm, path, size)
    cur.need(4, "magic")
    magic = bytes(mm[0:4])
    if magic != GGUF_MAGIC:
        raise MalformedGGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    cur.off = 4
    version = cur.unpack("<I", "version")
    if version not in (2, 3):
        why = ("GGUFv1 is no longer supported" if version == 1 else "the file's byte order differs from this host's"
               if version & 0xFFFF == 0 else "2 and 3 are supported")
        raise MalformedGGUFError(f"{path}: GGUF version {version} is not supported ({why})")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    if n_tensors > size or n_kv > size:
        raise MalformedGGUFError(f"{path}: impossible counts ({n_tensors} tensors, {n_kv} keys) for a {size}-byte file")

    gf = GGUFFile(path=path, version=version, size=size, _mm=mm)
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if not key:
            raise MalformedGGUFError(f"{path}: metadata key #{i} is empty")
        if key in gf.kv:       # ggml refuses the file; silently keeping the first or last value would hide it
            raise MalformedGGUFError(f"{path}: metadata key {key!r} appears twice (again as key #{i})")
        vtype = cur.unpack("<I", f"value type of {key!r}")
        gf.kv[key] = cur.value(vtype, f"value of {key!r}")
        gf.kv_types[key] = GGUFValueType(vtype)

    align = gf.kv.get("general.alignment", 32)
    if "general.alignment" in gf.kv and gf.kv_types["general.alignment"] != GGUFValueType.UINT32:
        raise MalformedGGUFError(f"{path}: metadata key 'general.alignment' must be UINT32 but is "
                                 f"{gf.kv_types['general.alignment'].name}")
    if align <= 0 or align & (align - 1):
        raise MalformedGGUFError(f"{path}: general.alignment = {align!r} is not a power of two")
    gf.alignment = align

    infos = []
    for i in range(n_tensors):
        name = cur.string(f"name of tensor #{i}")
        if len(name.encode()) >= MAX_NAME:
            raise MalformedGGUFError(f"{path}: tensor #{i} name {name[:80]!r} is {len(name.encode())} bytes "
                                     f"(ggml allows at most {MAX_NAME - 1})")
        n_dims = cur.unpack("<I", f"n_dims of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise MalformedGGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        ne = tuple(cur.unpack("<Q", f"shape of tensor {name!r}") for _ in range(n_dims))
        if _overflows(ne):
            raise MalformedGGUFError(f"{path}: tensor {name!r} has shape {list(ne)}, whose element count does not "
                                     f"fit in int64 (ggml reads each dimension and the product as int64)")
        tid = cur.unpack("<I", f"type of tensor {name!r}")
        off = cur.unpack("<Q", f"offset of tensor {name!r}")
        infos.append((name, ne, tid, off))
    gf.data_start = (cur.off + align - 1) // align * align
    if infos and gf.data_start > size:
        raise TruncatedFileError(f"{path}: file ends at byte {size}, before its data section (byte {gf.data_start})")

    expected = 0                            # ggml: each tensor starts where the previous one ends, padded
    for name, ne, tid, off in infos:
        if name in gf.tensors:
            raise MalformedGGUFError(f"{path}: tensor {name!r} appears twice in the tensor table")
        try:
            info = type_info(tid)
        except _QUnknown:
            raise UnknownTypeError(f"{path}: tensor {name!r} has unknown ggml type id {tid}") from None
        if ne[0] % info.block_size:
            raise MalformedGGUFError(
                f"{path}: tensor {name!r} of type {info.type.name} has ne[0] = {ne[0]}, "
                f"not a multiple of the block size {info.block_size}")
        nbytes = info.row_bytes(ne[0]) * math.prod(ne[1:])
        if off != expected:
            raise MalformedGGUFError(
                f"{path}: tensor {name!r} has data offset {off}, expected {expected}: ggml requires tensor data in "
                f"table order, each tensor starting where the previous one ends, padded to {align} bytes")
        expected += (nbytes + align - 1) // align * align
        start = gf.data_start + off
        if start + nbytes > size:
            raise TensorBoundsError(
                f"{path}: tensor {name!r} ({info.type.name} {list(ne)}) needs bytes {start}..{start + nbytes} "
                f"but the file has {size}; the file is truncated")
        gf.tensors[name] = TensorInfo(name, info.type, ne, start, nbytes, path)
    return gf
