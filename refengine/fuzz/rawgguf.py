"""A GGUF as editable parts: header, metadata (each value kept encoded), tensor table and tensor bytes.

    raw = parse(open(path, "rb").read())         # a well-formed seed file
    raw.kvs[i] = (key, GGUF value type, encode_value(type, value))
    raw.tensors[j].ne = [...]                    # then raw.encode() -> bytes

`encode` lays the tensors out again as ggml expects (in order, each padded to the alignment), resizing a
tensor's bytes to what its new shape and type need, unless `relayout` is off (offsets are then written as set).
The fuzzer's mutations (refengine/fuzz/mutate.py) edit these parts; nothing here checks anything.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from quant.formats import type_info

# GGUF value types (gguf.constants.GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
INT_TYPES = (U8, I8, U16, I16, U32, I32, U64, I64)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
        I64: "<q", F64: "<d"}
MAX_RESIZE = 1 << 26                 # a tensor resized on relayout up to 64 MiB; beyond, its seed bytes stay


@dataclass
class TInfo:
    name: bytes
    ne: list[int]
    type: int
    offset: int
    blob: bytes                  # the tensor's bytes as in the seed
    n_dims: int | None = None    # written instead of len(ne) when set (a lying n_dims)

    def nbytes(self) -> int | None:
        """The bytes ne and type call for; None when the type is unknown or the size absurd (then: the blob)."""
        try:
            n = type_info(self.type).row_bytes(self.ne[0]) * math.prod(self.ne[1:])
        except Exception:                                   # noqa: BLE001  (any unknown type or bad row)
            return None
        return n if 0 <= n <= MAX_RESIZE else None


@dataclass
class RawGGUF:
    version: int
    kvs: list[tuple[bytes, int, bytes]]        # (key, value type, encoded value)
    tensors: list[TInfo]
    alignment: int = 32
    magic: bytes = b"GGUF"
    n_tensors: int | None = None               # header counts, when a mutant lies about them
    n_kv: int | None = None
    relayout: bool = True                      # recompute offsets from the tensors' sizes

    def encode(self) -> bytes:
        out = [self.magic, struct.pack("<IQQ", self.version & 0xFFFFFFFF,
                                       _u64(len(self.tensors) if self.n_tensors is None else self.n_tensors),
                                       _u64(len(self.kvs) if self.n_kv is None else self.n_kv))]
        for k, vt, raw in self.kvs:
            out += [_str(k), struct.pack("<I", vt), raw]
        if self.relayout:                      # each tensor's bytes resized to what its (new) ne and type need
            off = 0
            for t in self.tensors:
                n = t.nbytes()
                if n is not None and n != len(t.blob):
                    t.blob = t.blob[:n] + bytes(max(0, n - len(t.blob)))
                t.offset = off
                off += align_up(len(t.blob), self.alignment)
        for t in self.tensors:
            nd = len(t.ne) if t.n_dims is None else t.n_dims
            out += [_str(t.name), struct.pack("<I", nd), b"".join(struct.pack("<Q", _u64(d)) for d in t.ne),
                    struct.pack("<IQ", t.type & 0xFFFFFFFF, _u64(t.offset))]
        head = b"".join(out)
        a = self.alignment if 0 < self.alignment < 1 << 24 else 32
        data = bytearray(align_up(len(head), a) - len(head))
        if self.relayout:
            for t in self.tensors:
                data += t.blob + bytes(align_up(len(t.blob), a) - len(t.blob))
        else:                    # place each blob at its (possibly wrong) offset, bounded
            body = bytearray(sum(align_up(len(t.blob), 32) for t in self.tensors))
            for t in self.tensors:
                o = min(t.offset, len(body))
                body[o:o + len(t.blob)] = t.blob
            data += body
        return head + bytes(data)


def _u64(v: int) -> int:
    return v % (1 << 64)


def align_up(n: int, a: int) -> int:
    a = a if 0 < a < 1 << 24 else 32
    return (n + a - 1) // a * a


def _str(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def encode_value(vt: int, v) -> bytes:
    """The bytes of one value of type vt (ARR: v = (element type, list))."""
    if vt == STR:
        return _str(v)
    if vt == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(encode_value(et, x) for x in items)
    if vt in (F32, F64):
        return struct.pack(_FMT[vt], v)
    bits = 8 * struct.calcsize(_FMT[vt])
    return struct.pack(_FMT[vt].upper(), int(v) % (1 << bits)) if vt in (I8, I16, I32, I64) else \
        struct.pack(_FMT[vt], int(v) % (1 << bits))


def parse(buf: bytes) -> RawGGUF:
    """Split a well-formed GGUF into its parts (the seeds only: no checks here)."""
    off = 4
    version, n_t, n_kv = struct.unpack_from("<IQQ", buf, off)
    off += 20

    def string(o):
        (n,) = struct.unpack_from("<Q", buf, o)
        return buf[o + 8:o + 8 + n], o + 8 + n

    def skip(vt, o):
        if vt == STR:
            return string(o)[1]
        if vt == ARR:
            et, n = struct.unpack_from("<IQ", buf, o)
            o += 12
            if et == STR:
                for _ in range(n):
                    o = string(o)[1]
                return o
            return o + n * struct.calcsize(_FMT[et])
        return o + struct.calcsize(_FMT[vt])
    kvs, align = [], 32
    for _ in range(n_kv):
        k, off = string(off)
        (vt,) = struct.unpack_from("<I", buf, off)
        end = skip(vt, off + 4)
        kvs.append((k, vt, buf[off + 4:end]))
        if k == b"general.alignment":
            align = struct.unpack_from("<I", buf, off + 4)[0]
        off = end
    infos = []
    for _ in range(n_t):
        name, off = string(off)
        (nd,) = struct.unpack_from("<I", buf, off)
        ne = list(struct.unpack_from(f"<{nd}Q", buf, off + 4))
        ty, o = struct.unpack_from("<IQ", buf, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 12
        infos.append((name, ne, ty, o))
    start = align_up(off, align)
    ends = [o for _, _, _, o in infos[1:]] + [len(buf) - start]
    tensors = []
    for (name, ne, ty, o), e in zip(infos, ends):
        tensors.append(TInfo(name, ne, ty, o, buf[start + o:start + e]))
    for t in tensors:                     # trim each blob to its real size (drop the padding after it)
        info = type_info(t.type)
        t.blob = t.blob[:info.row_bytes(t.ne[0]) * math.prod(t.ne[1:])]
    return RawGGUF(version, kvs, tensors, alignment=align)
