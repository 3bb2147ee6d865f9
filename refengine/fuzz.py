"""Fuzz the loader: mutated GGUFs, each opened and run in a bounded child process, beside llama.cpp's loader.

    python -m refengine.fuzz -n 5000 --out fuzz.jsonl --table docs/fuzz.md      (see --help)

A mutant is one seed file (or split set) with one structured change (`KINDS`) or random byte flips. Each is
run twice, in two forked children with an address-space and CPU-time bound (`resource.setrlimit`) and a
wall-clock deadline:

    refengine   Model(path); load_all(); forward([1, 2, 3])
    llama.cpp   ggml's gguf_init_from_file (the GGUF reader), then llama_model_load_from_file (the loader)

and classified (`OUTCOMES`):

    typed     a refengine error (`refengine.errors`), naming the file, key or tensor
    ran       loaded and produced logits (`warned`: with a note that llama.cpp refuses the file)
    untyped   any other Python exception: a bug
    crash     the child died by a signal (a segfault, an abort)
    hang      past the deadline or the CPU bound
    memory    MemoryError, or the child hit the address-space bound

Mutants are deterministic in (seed, index): `mutate(seed_files, kind, rng)` rewrites the header through a
small parser (`RawGGUF`) that keeps every key's encoded value, the tensor table and each tensor's bytes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

# GGUF value types (gguf.constants.GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
        I64: "<q", F64: "<d"}

KINDS = ("value_type", "count", "float", "dup_key", "drop_key", "arch", "dims", "tensor_type", "dup_tensor",
         "tensor_name", "offset", "alignment", "header", "truncate", "byteflip", "nonfinite", "shards")
OUTCOMES = ("typed", "ran", "warned", "untyped", "crash", "hang", "memory")
DEADLINE_S = 10.0
MEMORY_BYTES = 1 << 30          # address space a child may add to what it inherits from the fork


# ---------------------------------------------------------------- a GGUF as editable parts

@dataclass
class TInfo:
    name: bytes
    ne: list[int]
    type: int
    offset: int
    blob: bytes                  # the tensor's bytes as in the seed
    n_dims: int | None = None    # written instead of len(ne) when set (a lying n_dims)


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
        off, offsets = 0, []
        for t in self.tensors:
            if self.relayout:
                t.offset = off
            offsets.append(t.offset)
            off += _pad(len(t.blob), self.alignment)
        for t in self.tensors:
            nd = len(t.ne) if t.n_dims is None else t.n_dims
            out += [_str(t.name), struct.pack("<I", nd), b"".join(struct.pack("<Q", _u64(d)) for d in t.ne),
                    struct.pack("<IQ", t.type & 0xFFFFFFFF, _u64(t.offset))]
        head = b"".join(out)
        a = self.alignment if 0 < self.alignment < 1 << 24 else 32
        data = bytearray(_pad(len(head), a) - len(head))
        for t, o in zip(self.tensors, offsets):
            if self.relayout:
                data += t.blob + bytes(_pad(len(t.blob), a) - len(t.blob))
        if not self.relayout:                    # place each blob at its (possibly wrong) offset, bounded
            body = bytearray(sum(_pad(len(t.blob), 32) for t in self.tensors))
            for t in self.tensors:
                o = min(t.offset, len(body))
                body[o:o + len(t.blob)] = t.blob
            data += body
        return head + bytes(data)


def _u64(v: int) -> int:
    return v % (1 << 64)


def _pad(n: int, a: int) -> int:
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
    start = _pad(off, align)
    ends = [o for _, _, _, o in infos[1:]] + [len(buf) - start]
    tensors = []
    for (name, ne, ty, o), e in zip(infos, ends):
        tensors.append(TInfo(name, ne, ty, o, buf[start + o:start + e]))
    # trim each blob to its real size (the padding of the next one is not part of it)
    from quant.formats import type_info
    for t in tensors:
        info = type_info(t.type)
        t.blob = t.blob[:info.row_bytes(t.ne[0]) * math.prod(t.ne[1:])]
    return RawGGUF(version, kvs, tensors, alignment=align)


# ---------------------------------------------------------------- mutations

INT_TYPES = (U8, I8, U16, I16, U32, I32, U64, I64)
HUGE = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 10_000_000, 4_294_967_295, 2**63 - 1, 2**63, 2**64 - 1, -1, -2**31, 513]
BAD_FLOATS = [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 1e30, -1e-30, 3.4e38]
OTHER_VALUES = [(STR, "abc"), (STR, ""), (STR, "12"), (ARR, (I32, [1, 2, 3])), (ARR, (STR, ["a", "b"])),
                (ARR, (F32, [])), (F32, 1.5), (F64, 2.0), (BOOL, 1), (U64, 2**40), (I8, -1), (U16, 7), (I64, -5),
                (ARR, (U8, [0] * 2)), (ARR, (ARR, [])), (13, None), (200, None)]
ARCH_NAMES = ["gpt2", "", "LLAMA", "llama ", "qwen3moe", "deepseek2", "llama\x00x", "x" * 300, "mamba", "bert"]


def _keys(raw: RawGGUF, kinds: tuple[int, ...] | None = None) -> list[int]:
    return [i for i, (k, vt, _) in enumerate(raw.kvs) if kinds is None or vt in kinds]


def _choice(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _set(raw: RawGGUF, i: int, vt: int, v) -> str:
    k = raw.kvs[i][0]
    if vt > ARR + 3:                     # an invalid value type id: no value bytes follow that a reader can parse
        raw.kvs[i] = (k, vt, b"\0" * 8)
    else:
        raw.kvs[i] = (k, vt, encode_value(vt, v))
    return f"{k.decode(errors='replace')} := {vt}:{v!r}"[:120]


def mutate(files: list[str], kind: str, rng, outdir: str) -> tuple[str, str]:
    """Write one mutant of the seed set `files` (first = the file to open) into outdir; (path, description)."""
    target = int(rng.integers(len(files))) if kind in ("shards", "byteflip", "truncate") else 0
    bufs = [open(f, "rb").read() for f in files]
    raw = parse(bufs[target])
    desc = ""
    out_names = [os.path.basename(f) for f in files]

    if kind == "value_type":
        i = _choice(rng, _keys(raw))
        vt, v = _choice(rng, OTHER_VALUES)
        desc = _set(raw, i, vt, v)
    elif kind == "count":
        i = _choice(rng, _keys(raw, INT_TYPES) or _keys(raw))
        v = _choice(rng, HUGE)
        vt = _choice(rng, [raw.kvs[i][1], U32, U64, I32, I64]) if raw.kvs[i][1] in INT_TYPES else U32
        vt = I64 if v < 0 and vt in (U32, U64) and rng.random() < .5 else vt
        desc = _set(raw, i, vt, v)
    elif kind == "float":
        i = _choice(rng, _keys(raw, (F32, F64)) or _keys(raw))
        desc = _set(raw, i, _choice(rng, [F32, F64]), _choice(rng, BAD_FLOATS))
    elif kind == "dup_key":
        i = _choice(rng, _keys(raw))
        k, vt, v = raw.kvs[i]
        if rng.random() < .5 and vt in INT_TYPES + (F32,):
            v = encode_value(vt, 1)
        raw.kvs.insert(int(rng.integers(len(raw.kvs) + 1)), (k, vt, v))
        desc = f"{k.decode()} twice"
    elif kind == "drop_key":
        i = _choice(rng, _keys(raw))
        desc = f"drop {raw.kvs[i][0].decode()}"
        del raw.kvs[i]
    elif kind == "arch":
        i = next(i for i, (k, _, _) in enumerate(raw.kvs) if k == b"general.architecture")
        if rng.random() < .2:
            vt, v = _choice(rng, [(ARR, (STR, ["llama"])), (U32, 1), (ARR, (I32, [1]))])
        else:
            vt, v = STR, _choice(rng, ARCH_NAMES)
        desc = _set(raw, i, vt, v)
    elif kind == "dims":
        t = _choice(rng, raw.tensors)
        j = int(rng.integers(len(t.ne)))
        how = _choice(rng, ["huge", "zero", "plus", "swap", "ndims", "extra"])
        if how == "huge":
            t.ne[j] = _choice(rng, [2**62, 2**63, 2**64 - 1, 2**32, 2**40, 2**31 * 3])
        elif how == "zero":
            t.ne[j] = 0
        elif how == "plus":
            t.ne[j] += _choice(rng, [1, 32, 256, t.ne[j]])
        elif how == "swap":
            t.ne.reverse()
        elif how == "ndims":
            t.n_dims = _choice(rng, [0, 5, 2**31, len(t.ne) + 1])
        else:
            t.ne.append(_choice(rng, [1, 2, 3]))
        desc = f"{t.name.decode()} {how} -> ne {t.ne} n_dims {t.n_dims}"
    elif kind == "tensor_type":
        t = _choice(rng, raw.tensors)
        t.type = _choice(rng, [int(rng.integers(0, 42)), 4, 5, 39, 40, 41, 255, 2**31, 0, 1, 8, 12])
        desc = f"{t.name.decode()} type {t.type}"
    elif kind == "dup_tensor":
        a, b = rng.choice(len(raw.tensors), 2, replace=False)
        raw.tensors[int(b)].name = raw.tensors[int(a)].name
        desc = f"{raw.tensors[int(a)].name.decode()} twice"
    elif kind == "tensor_name":
        t = _choice(rng, raw.tensors)
        t.name = _choice(rng, [b"", b"x" * 64, b"y" * 63, t.name + b".extra", b"blk.99.attn_q.weight",
                               t.name.replace(b"blk.0", b"blk.7"), b"\xff\xfe", t.name.upper()])
        desc = f"name -> {t.name[:70]!r}"
    elif kind == "offset":
        raw.relayout = False
        off = 0
        for t in raw.tensors:
            t.offset = off
            off += _pad(len(t.blob), raw.alignment)
        i = int(rng.integers(len(raw.tensors)))
        t = raw.tensors[i]
        how = _choice(rng, ["+1", "+align", "-align", "swap", "zero", "huge", "same-as-prev"])
        if how == "+1":
            t.offset += 1
        elif how == "+align":
            t.offset += raw.alignment
        elif how == "-align":
            t.offset = max(0, t.offset - raw.alignment)
        elif how == "swap" and len(raw.tensors) > 1:
            k = (i + 1) % len(raw.tensors)
            t.offset, raw.tensors[k].offset = raw.tensors[k].offset, t.offset
        elif how == "zero":
            t.offset = 0
        elif how == "huge":
            t.offset = _choice(rng, [2**63, 2**64 - 32, 2**40])
        else:
            t.offset = raw.tensors[i - 1].offset if i else 64
        desc = f"{t.name.decode()} offset {how} -> {t.offset}"
    elif kind == "alignment":
        raw.kvs = [kv for kv in raw.kvs if kv[0] != b"general.alignment"]
        vt, v = _choice(rng, [(U32, 0), (U32, 1), (U32, 3), (U32, 64), (U32, 1 << 20), (U32, 48), (U64, 32),
                              (STR, "32"), (I32, -32), (U32, 2**31), (U16, 64)])
        raw.kvs.insert(int(rng.integers(len(raw.kvs) + 1)), (b"general.alignment", vt, encode_value(vt, v)))
        if vt == U32 and v and not v & (v - 1) and v < 1 << 24 and rng.random() < .7:
            raw.alignment = v            # a valid alignment, laid out for it: a valid file
        desc = f"general.alignment := {vt}:{v!r}" + (" (laid out)" if raw.alignment == v else "")
    elif kind == "header":
        how = _choice(rng, ["n_tensors", "n_kv", "version", "magic"])
        if how == "n_tensors":
            raw.n_tensors = _choice(rng, [0, len(raw.tensors) - 1, len(raw.tensors) + 1, 2**63, 2**64 - 1, 2**31])
        elif how == "n_kv":
            raw.n_kv = _choice(rng, [0, len(raw.kvs) - 1, len(raw.kvs) + 1, 2**63, 2**64 - 1, 10**6])
        elif how == "version":
            raw.version = _choice(rng, [0, 1, 4, 2, 3 << 24, 2**32 - 1])
        else:
            raw.magic = _choice(rng, [b"GGUG", b"FUGG", b"\0\0\0\0", b"GGML"])
        desc = f"{how} -> {getattr(raw, how) if how != 'magic' else raw.magic!r}"
    elif kind == "nonfinite":
        floats = [t for t in raw.tensors if t.type in (0, 1, 8, 12)]    # F32, F16, Q8_0, Q4_K
        t = _choice(rng, floats)
        b = bytearray(t.blob)
        v = _choice(rng, [float("nan"), float("inf"), float("-inf")])
        if t.type == 0:
            j = int(rng.integers(len(b) // 4)) * 4
            b[j:j + 4] = struct.pack("<f", v)
        else:                    # F16 element, or the f16 scale d at the start of a Q8_0 / Q4_K block
            block = {1: 2, 8: 34, 12: 144}[t.type]
            j = int(rng.integers(len(b) // block)) * block
            b[j:j + 2] = np.float16(v).tobytes()
        t.blob = bytes(b)
        desc = f"{t.name.decode()} byte {j} := {v}"
    elif kind == "shards":
        ks = {k: i for i, (k, _, _) in enumerate(raw.kvs)}
        opts = ["split.no", "split.count", "split.tensors.count", "drop_file", "move_tensor", "add_split"]
        how = _choice(rng, opts if len(files) > 1 else ["add_split", "split.count", "split.no"])
        if how in ("split.no", "split.count", "split.tensors.count"):
            key = how.encode()
            v = _choice(rng, [0, 1, 2, len(files), len(files) + 1, 65535, 2**31, 1.5, "2"])
            vt = STR if isinstance(v, str) else F32 if isinstance(v, float) else \
                _choice(rng, [U16, I32, U64]) if how != "split.tensors.count" else I32
            if key in ks:
                _set(raw, ks[key], vt, v)
            else:
                raw.kvs.append((key, vt, encode_value(vt, v)))
            desc = f"shard {target}: {how} := {vt}:{v!r}"
        elif how == "drop_file":
            desc = f"shard {target} missing"
            raw = None
        elif how == "move_tensor":          # one tensor of this shard also put into another shard
            other = (target + 1) % len(files)
            oraw = parse(bufs[other])
            oraw.tensors.append(TInfo(**{**_choice(rng, raw.tensors).__dict__}))
            bufs[other] = oraw.encode()
            desc = f"a tensor of shard {target} also in shard {other}"
        else:
            raw.kvs += [(b"split.count", U16, encode_value(U16, 2)), (b"split.no", U16, encode_value(U16, 0))]
            desc = "split.count = 2 on a file named as a single"
            raw.kvs = list({k: (k, vt, v) for k, vt, v in raw.kvs}.values())
    elif kind not in ("truncate", "byteflip"):
        raise ValueError(f"unknown mutation kind {kind!r}")

    data = bufs[target] if raw is None or kind in ("truncate", "byteflip") else raw.encode()
    if kind == "truncate":
        head = len(bufs[target]) - sum(len(t.blob) for t in raw.tensors)
        cut = int(rng.integers(head + 64)) if rng.random() < .7 else int(rng.integers(len(data)))
        data = data[:cut]
        desc = f"shard {target} cut at byte {cut} of {len(bufs[target])}"
    elif kind == "byteflip":
        b = bytearray(data)
        head = len(b) - sum(len(t.blob) for t in raw.tensors)
        n = int(rng.integers(1, 9))
        where = [int(rng.integers(head if rng.random() < .8 else len(b))) for _ in range(n)]
        for j in where:
            b[j] ^= 1 << int(rng.integers(8))
        data = bytes(b)
        desc = f"shard {target}: {n} bit flips at {sorted(where)[:4]}"
    for i, f in enumerate(files):
        p = os.path.join(outdir, out_names[i])
        if i == target:
            if raw is not None or kind in ("truncate", "byteflip"):
                open(p, "wb").write(data)
        else:
            open(p, "wb").write(bufs[i])
    return os.path.join(outdir, out_names[0]), desc


# ---------------------------------------------------------------- the two runs, each in a bounded child

def _run_refengine(path: str) -> dict:
    import warnings

    from .config import LlamaCppWouldRefuse
    from .errors import RefengineError
    from .model import Model
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            m = Model(path)
            m.load_all()
            m.forward([1, 2, 3])
        notes = [str(x.message) for x in w if issubclass(x.category, LlamaCppWouldRefuse)]
        return {"outcome": "warned" if notes else "ran", "msg": notes[0][:300] if notes else ""}
    except RefengineError as e:
        return {"outcome": "typed", "error": type(e).__name__, "msg": str(e)[:300]}
    except MemoryError as e:
        return {"outcome": "memory", "error": "MemoryError", "msg": str(e)[:300]}
    except Exception as e:                                   # noqa: BLE001  (what the fuzzer is for)
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"outcome": "untyped", "error": type(e).__name__,
                "msg": f"{str(e)[:200]} at {os.path.basename(tb.filename)}:{tb.lineno}"}


_LOG: list[str] = []
_LOG_CB = None


def _llamacpp_setup():
    """Load llama.cpp once, before forking: its error log lines are collected into _LOG (llama.cpp's reason)."""
    global _LOG_CB
    import ctypes

    import llama_cpp as L

    from quant import ggml as qggml
    if _LOG_CB is None:
        state = {"last": 0}

        def log(level, text, user):                   # ggml_log_level: 4 error, 5 continues the last line
            if level == 5:
                level = state["last"]
            state["last"] = level
            if level == 4 and text:
                _LOG.append(text.decode("utf-8", errors="replace").strip())
        _LOG_CB = L.llama_log_callback(log)
        L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
        L.llama_backend_init()
        g = qggml.lib("ggml-base")
        g.gguf_init_from_file.restype = ctypes.c_void_p
        g.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GGUFInitParams]
        g.gguf_free.argtypes = [ctypes.c_void_p]
    return L, qggml.lib("ggml-base")


def _gguf_params():
    return _GGUFInitParams(True, None)


try:
    import ctypes as _ct

    class _GGUFInitParams(_ct.Structure):
        """`struct gguf_init_params` (ggml/include/gguf.h): no_alloc, ctx (NULL: read metadata only)."""
        _fields_ = [("no_alloc", _ct.c_bool), ("ctx", _ct.c_void_p)]
except ImportError:          # pragma: no cover
    _GGUFInitParams = None


def _run_llamacpp(path: str) -> dict:
    L, g = _llamacpp_setup()
    _LOG.clear()
    ctx = g.gguf_init_from_file(path.encode(), _gguf_params())
    if not ctx:
        return {"outcome": "refused", "stage": "gguf", "msg": _reason()}
    g.gguf_free(ctx)
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False
    _LOG.clear()
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        return {"outcome": "refused", "stage": "model", "msg": _reason()}
    L.llama_model_free(model)
    return {"outcome": "accepted", "stage": "model", "msg": ""}


def _reason() -> str:
    errs = [x for x in _LOG if x and "failed to load model" not in x and "failed to read" not in x]
    return (errs[0] if errs else (_LOG[0] if _LOG else "?"))[:300]


def run_bounded(fn, path: str, *, deadline: float = DEADLINE_S, memory: int = MEMORY_BYTES) -> dict:
    """fn(path) -> dict, in a forked child bounded in address space (+memory over the parent's), CPU time and
    wall time. Crashes, hangs and memory exhaustion become outcomes; 'peak_mb' is the child's peak RSS."""
    r, w = os.pipe()
    vm = _vm_bytes()
    pid = os.fork()
    if pid == 0:                                                       # the child
        try:
            os.close(r)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.environ["GGML_NO_BACKTRACE"] = "1"          # ggml_abort: no gdb attach (seconds per abort)
            import faulthandler
            faulthandler.disable()                           # an abort is an outcome here, not a report
            resource.setrlimit(resource.RLIMIT_AS, (vm + memory, vm + memory))
            cpu = int(math.ceil(deadline))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            res = fn(path)
        except MemoryError:
            res = {"outcome": "memory", "error": "MemoryError", "msg": "outside the run"}
        except BaseException as e:                                     # noqa: BLE001
            res = {"outcome": "untyped", "error": type(e).__name__, "msg": str(e)[:200]}
        try:
            os.write(w, json.dumps(res).encode()[:60000])
        finally:
            os._exit(0)
    os.close(w)
    t0 = time.monotonic()
    status = rusage = None
    while True:
        got, status, rusage = os.wait4(pid, os.WNOHANG)
        if got:
            break
        if time.monotonic() - t0 > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, rusage = os.wait4(pid, 0)
            os.close(r)
            return {"outcome": "hang", "msg": f"killed after {deadline:.0f} s", "wall_s": deadline}
        time.sleep(0.002)
    chunks = []
    while True:
        c = os.read(r, 65536)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    wall = time.monotonic() - t0
    peak_mb = rusage.ru_maxrss / 1024
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        kind = "hang" if sig == signal.SIGXCPU else "crash"
        return {"outcome": kind, "msg": f"killed by {signal.Signals(sig).name}", "wall_s": wall, "peak_mb": peak_mb}
    try:
        res = json.loads(b"".join(chunks))
    except ValueError:
        res = {"outcome": "crash", "msg": f"exit status {os.WEXITSTATUS(status)} without a result"}
    res.update(wall_s=round(wall, 3), peak_mb=round(peak_mb, 1))
    return res


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- seeds and the campaign

SEEDS = {   # name -> (arch, write_synth options): dense, MoE, quantized (MLA + MoE), split
    "dense-f32": ("llama", dict(wtype="F32")),
    "moe-q8_0": ("qwen3moe", dict(wtype="Q8_0")),
    "moe-f16": ("llama", dict(preset="tiny-moe", wtype="F16")),
    "mla-q4_k": ("deepseek2", dict(wtype="Q4_K")),
    "split3-q8_0": ("llama", dict(wtype="Q8_0", shards=3)),
}


def make_seeds(root: str, names=None) -> dict[str, list[str]]:
    """Write the seed files; name -> its files (first: the one to open)."""
    from .synth import write_synth
    out = {}
    for name in names or SEEDS:
        arch, kw = SEEDS[name]
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        first = write_synth(arch, os.path.join(d, f"{name}.gguf"), seed=1, progress=False, **kw)
        files = sorted(os.path.join(d, f) for f in os.listdir(d))
        out[name] = [str(first)] + [f for f in files if f != str(first)]
    return out


def baseline_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fuzz_one(seeds: dict[str, list[str]], index: int, seed: int, work: str, *, oracle: bool) -> dict:
    names = sorted(seeds)
    seed_name = names[index % len(names)]
    kind = KINDS[(index // len(names)) % len(KINDS)]
    rng = np.random.default_rng([seed, index])
    d = os.path.join(work, f"m{index}")
    os.makedirs(d, exist_ok=True)
    try:
        path, desc = mutate(seeds[seed_name], kind, rng, d)
        rec = {"index": index, "seed": seed_name, "kind": kind, "desc": desc}
        rec["refengine"] = run_bounded(_run_refengine, path)
        if oracle:
            rec["llamacpp"] = run_bounded(_run_llamacpp, path)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rec


def campaign(n: int, *, seed: int = 0, seeds: dict | None = None, oracle: bool = True, progress: bool = False,
             out=None, start: int = 0, step: int = 1) -> list[dict]:
    """Mutants start, start+step, ... below n; returns their records (and writes JSON lines to `out`)."""
    from tqdm import tqdm
    if oracle:
        _llamacpp_setup()
    from .model import Model  # noqa: F401  (imported before forking, so children start warm)
    tmp = tempfile.mkdtemp(prefix="refengine-fuzz-")
    try:
        seeds = seeds or make_seeds(os.path.join(tmp, "seeds"))
        recs = []
        for i in tqdm(range(start, n, step), desc="fuzz", unit="mutant", disable=not progress):
            rec = fuzz_one(seeds, i, seed, tmp, oracle=oracle)
            recs.append(rec)
            if out is not None:
                out.write(json.dumps(rec) + "\n")
                out.flush()
        return recs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- tables

def accepts(rec: dict) -> bool:
    return rec["refengine"]["outcome"] in ("ran", "warned")


def outcome_table(recs: list[dict]) -> str:
    by = defaultdict(Counter)
    for r in recs:
        by[r["kind"]][r["refengine"]["outcome"]] += 1
        by["(all)"][r["refengine"]["outcome"]] += 1
    peak = max((r["refengine"].get("peak_mb", 0) for r in recs), default=0)
    rows = ["| kind | mutants | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 2) + "|"]
    for k in [*KINDS, "(all)"]:
        if k in by:
            c = by[k]
            rows.append(f"| {k} | {sum(c.values())} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    return "\n".join(rows) + f"\n\nPeak RSS of any refengine child: {peak:.0f} MB (the fork's inherited pages included)."


def differential_table(recs: list[dict]) -> str:
    by = defaultdict(Counter)
    for r in recs:
        if "llamacpp" not in r:
            continue
        lo = r["llamacpp"]["outcome"]
        la = "accepts" if lo == "accepted" else "refuses" if lo == "refused" else lo
        ra = "runs" if accepts(r) else "refuses"
        if r["refengine"]["outcome"] == "warned":
            ra = "runs, says llama.cpp refuses"
        by[r["kind"]][(la, ra)] += 1
        by["(all)"][(la, ra)] += 1
    cols = [("accepts", "runs"), ("refuses", "refuses"), ("refuses", "runs, says llama.cpp refuses"),
            ("accepts", "refuses"), ("refuses", "runs")]
    extra = sorted({c for k in by for c in by[k]} - set(cols))
    cols += extra
    head = " | ".join(f"llama.cpp {a} / refengine {b}" for a, b in cols)
    rows = [f"| kind | mutants | agree | {head} |", "|---" * (len(cols) + 3) + "|"]
    for k in [*KINDS, "(all)"]:
        if k in by:
            c = by[k]
            agree = c[("accepts", "runs")] + c[("refuses", "refuses")]
            rows.append(f"| {k} | {sum(c.values())} | {agree} | " + " | ".join(str(c[x]) for x in cols) + " |")
    return "\n".join(rows)


def disagreements(recs: list[dict], limit: int = 40) -> list[str]:
    """One example per (kind, direction, refengine error / llama.cpp reason prefix)."""
    seen, out = set(), []
    for r in recs:
        if "llamacpp" not in r:
            continue
        la = r["llamacpp"]["outcome"] == "accepted"
        if la == accepts(r) and r["refengine"]["outcome"] != "warned":
            continue
        key = (r["kind"], la, r["refengine"].get("error", r["refengine"]["outcome"]), r["llamacpp"]["msg"][:40])
        if key in seen:
            continue
        seen.add(key)
        out.append(f"{r['kind']} ({r['desc']}): llama.cpp {'accepts' if la else 'refuses: ' + r['llamacpp']['msg']}; "
                   f"refengine {r['refengine']['outcome']}: {r['refengine'].get('error', '')} "
                   f"{r['refengine'].get('msg', '')}")
        if len(out) >= limit:
            break
    return out


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m refengine.fuzz", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Seeds: " + ", ".join(SEEDS) + ". Kinds: " + ", ".join(KINDS) + ".")
    p.add_argument("-n", type=int, default=200, help="number of mutants (default 200)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--no-oracle", action="store_true", help="skip the llama.cpp column")
    p.add_argument("--out", default=None, help="write one JSON line per mutant here")
    p.add_argument("--table", default=None, help="write the markdown tables here")
    p.add_argument("--from-jsonl", default=None, help="only tabulate an earlier --out file")
    p.add_argument("-q", "--quiet", action="store_true")
    a = p.parse_args(argv)
    t0 = time.time()
    if a.from_jsonl:
        recs = [json.loads(line) for line in open(a.from_jsonl)]
    else:
        recs = _parallel(a)
    bad = [r for r in recs if r["refengine"]["outcome"] in ("untyped", "crash", "hang", "memory")]
    text = (f"{len(recs)} mutants, seed {a.seed}, {time.time() - t0:.0f} s\n\n## Outcomes\n\n{outcome_table(recs)}\n\n"
            f"## Differential (llama.cpp's loader)\n\n{differential_table(recs)}\n\n## Disagreements (one example each)\n\n"
            + "\n".join(f"- {x}" for x in disagreements(recs)) + "\n\n## Failures\n\n"
            + ("\n".join(f"- #{r['index']} {r['seed']} {r['kind']} ({r['desc']}): {r['refengine']}" for r in bad[:50])
               or "none") + "\n")
    if a.table:
        open(a.table, "w").write(text)
    print(text)
    return 1 if bad else 0


def _parallel(a) -> list[dict]:
    out = open(a.out, "w") if a.out else None
    if a.jobs <= 1:
        recs = campaign(a.n, seed=a.seed, oracle=not a.no_oracle, progress=not a.quiet, out=out)
    else:
        import multiprocessing as mp
        tmp = tempfile.mkdtemp(prefix="refengine-fuzz-seeds-")
        seeds = make_seeds(tmp)
        ctx = mp.get_context("fork")
        parts = [os.path.join(tmp, f"part{j}.jsonl") for j in range(a.jobs)]
        procs = [ctx.Process(target=_worker, args=(a, seeds, j, parts[j])) for j in range(a.jobs)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
        recs = sorted((json.loads(line) for f in parts for line in open(f)), key=lambda r: r["index"])
        if out:
            for r in recs:
                out.write(json.dumps(r) + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
    if out:
        out.close()
    return recs


def _worker(a, seeds, j, path):
    with open(path, "w") as f:
        campaign(a.n, seed=a.seed, seeds=seeds, oracle=not a.no_oracle, progress=not a.quiet and j == 0,
                 out=f, start=j, step=a.jobs)


if __name__ == "__main__":
    sys.exit(main())
