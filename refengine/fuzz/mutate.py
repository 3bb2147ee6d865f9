"""The mutations: one function per kind, each editing a parsed seed (`RawGGUF`) and describing what it did.

    path, desc = mutate(seed_files, kind, rng, outdir)      # seed_files[0] is the file to open

A kind's function takes (raw, rng, ctx) and returns a one-line description; `ctx` carries the other shards of
a split seed (`shards` edits them). `truncate` and `byteflip` work on the encoded bytes instead.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from .rawgguf import ARR, BOOL, F32, F64, I8, I32, I64, INT_TYPES, STR, U8, U16, U32, U64, RawGGUF, TInfo, \
    align_up, encode_value, parse

HUGE = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 10_000_000, 2**63 - 1, 2**63, 2**64 - 1, -1, -2**31, 513]
BAD_FLOATS = [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 1e30, -1e-30, 3.4e38]
OTHER_VALUES = [(STR, "abc"), (STR, ""), (STR, "12"), (ARR, (I32, [1, 2, 3])), (ARR, (STR, ["a", "b"])),
                (ARR, (F32, [])), (F32, 1.5), (F64, 2.0), (BOOL, 1), (U64, 2**40), (I8, -1), (U16, 7), (I64, -5),
                (ARR, (U8, [0] * 2)), (ARR, (ARR, [])), (13, None), (200, None),   # these two: no such type
                # one value per layer of the 2-4 layer seeds, some of them impossible
                (ARR, (I32, [-1, 4])), (ARR, (U32, [2**32 - 1, 4])), (ARR, (F32, [float("nan"), 4.0])),
                (ARR, (I64, [2, 2])), (ARR, (U32, [4, 4, 4, 4])), (ARR, (BOOL, [1, 0]))]
ARCH_NAMES = ["gpt2", "", "LLAMA", "llama ", "qwen3moe", "deepseek2", "llama\x00x", "x" * 300, "mamba", "bert"]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _keys(raw: RawGGUF, types=None) -> list[int]:
    return [i for i, (_, vt, _) in enumerate(raw.kvs) if types is None or vt in types]


def _set(raw: RawGGUF, i: int, vt: int, v) -> str:
    k = raw.kvs[i][0]
    raw.kvs[i] = (k, vt, b"\0" * 8 if vt > F64 else encode_value(vt, v))   # an unknown type id: 8 stray bytes
    return f"{k.decode(errors='replace')} := {vt}:{v!r}"[:120]


# ---------------------------------------------------------------- metadata

def value_type(raw, rng, ctx):
    """Any key given a value of another GGUF type (string, array, float, bool, other widths, no such type)."""
    vt, v = _pick(rng, OTHER_VALUES)
    return _set(raw, _pick(rng, _keys(raw)), vt, v)


def count(raw, rng, ctx):
    """An integer key set to 0, huge, or negative-looking values, in its own or another integer width."""
    i = _pick(rng, _keys(raw, INT_TYPES) or _keys(raw))
    v = _pick(rng, HUGE)
    vt = _pick(rng, [raw.kvs[i][1], U32, U64, I32, I64]) if raw.kvs[i][1] in INT_TYPES else U32
    if v < 0 and vt in (U32, U64) and rng.random() < .5:
        vt = I64
    return _set(raw, i, vt, v)


def float_value(raw, rng, ctx):
    """A float key set to NaN, inf, 0, a negative, or an extreme value (as f32 or f64)."""
    i = _pick(rng, _keys(raw, (F32, F64)) or _keys(raw))
    return _set(raw, i, _pick(rng, [F32, F64]), _pick(rng, BAD_FLOATS))


def dup_key(raw, rng, ctx):
    """A key written twice, with the same or another value."""
    k, vt, v = raw.kvs[_pick(rng, _keys(raw))]
    if rng.random() < .5 and vt in INT_TYPES + (F32,):
        v = encode_value(vt, 1)
    raw.kvs.insert(int(rng.integers(len(raw.kvs) + 1)), (k, vt, v))
    return f"{k.decode()} twice"


def drop_key(raw, rng, ctx):
    i = _pick(rng, _keys(raw))
    k = raw.kvs.pop(i)[0]
    return f"drop {k.decode()}"


def arch(raw, rng, ctx):
    """general.architecture: another arch, a near miss, an embedded NUL, an array, a number."""
    i = next(i for i, (k, _, _) in enumerate(raw.kvs) if k == b"general.architecture")
    if rng.random() < .2:
        vt, v = _pick(rng, [(ARR, (STR, ["llama"])), (U32, 1), (ARR, (I32, [1]))])
    else:
        vt, v = STR, _pick(rng, ARCH_NAMES)
    return _set(raw, i, vt, v)


# ---------------------------------------------------------------- tensor table

def dims(raw, rng, ctx):
    """One tensor's ne: huge (overflowing int64), zero, larger, reversed, an extra dim, or a lying n_dims."""
    t = _pick(rng, raw.tensors)
    j = int(rng.integers(len(t.ne)))
    how = _pick(rng, ["huge", "zero", "plus", "swap", "ndims", "extra"])
    if how == "huge":
        t.ne[j] = _pick(rng, [2**62, 2**63, 2**64 - 1, 2**32, 2**40, 2**31 * 3])
    elif how == "zero":
        t.ne[j] = 0
    elif how == "plus":
        t.ne[j] += _pick(rng, [1, 32, 256, t.ne[j]])
    elif how == "swap":
        t.ne.reverse()
    elif how == "ndims":
        t.n_dims = _pick(rng, [0, 5, 2**31, len(t.ne) + 1])
    else:
        t.ne.append(_pick(rng, [1, 2, 3]))
    return f"{t.name.decode()} {how} -> ne {t.ne} n_dims {t.n_dims}"


def tensor_type(raw, rng, ctx):
    """One tensor's ggml type id: another valid type (its bytes resized), a removed one, or out of range."""
    t = _pick(rng, raw.tensors)
    t.type = _pick(rng, [int(rng.integers(0, 42)), 4, 5, 39, 40, 41, 255, 2**31, 0, 1, 8, 12])
    return f"{t.name.decode()} type {t.type}"


def dup_tensor(raw, rng, ctx):
    a, b = (int(x) for x in rng.choice(len(raw.tensors), 2, replace=False))
    raw.tensors[b].name = raw.tensors[a].name
    return f"{raw.tensors[a].name.decode()} twice"


def tensor_name(raw, rng, ctx):
    """A name that is empty, too long for ggml, unknown to the arch, a layer past block_count, not UTF-8."""
    t = _pick(rng, raw.tensors)
    t.name = _pick(rng, [b"", b"x" * 64, b"y" * 63, t.name + b".extra", b"blk.99.attn_q.weight",
                         t.name.replace(b"blk.0", b"blk.7"), b"\xff\xfe", t.name.upper()])
    return f"name -> {t.name[:70]!r}"


def offset(raw, rng, ctx):
    """One tensor's data offset moved: by one byte, by the alignment, swapped, zero, huge, same as before."""
    raw.relayout = False
    off = 0
    for t in raw.tensors:
        t.offset = off
        off += align_up(len(t.blob), raw.alignment)
    i = int(rng.integers(len(raw.tensors)))
    t = raw.tensors[i]
    how = _pick(rng, ["+1", "+align", "-align", "swap", "zero", "huge", "same-as-prev"])
    if how == "+1":
        t.offset += 1
    elif how == "+align":
        t.offset += raw.alignment
    elif how == "-align":
        t.offset = max(0, t.offset - raw.alignment)
    elif how == "swap":
        k = (i + 1) % len(raw.tensors)
        t.offset, raw.tensors[k].offset = raw.tensors[k].offset, t.offset
    elif how == "zero":
        t.offset = 0
    elif how == "huge":
        t.offset = _pick(rng, [2**63, 2**64 - 32, 2**40])
    else:
        t.offset = raw.tensors[i - 1].offset if i else 64
    return f"{t.name.decode()} offset {how} -> {t.offset}"


def alignment(raw, rng, ctx):
    """general.alignment: not a power of two, 0, another type, or a valid one (laid out for it, or not)."""
    raw.kvs = [kv for kv in raw.kvs if kv[0] != b"general.alignment"]
    vt, v = _pick(rng, [(U32, 0), (U32, 1), (U32, 3), (U32, 64), (U32, 1 << 20), (U32, 48), (U64, 32),
                        (STR, "32"), (I32, -32), (U32, 2**31), (U16, 64)])
    raw.kvs.insert(int(rng.integers(len(raw.kvs) + 1)), (b"general.alignment", vt, encode_value(vt, v)))
    laid = vt == U32 and v and not v & (v - 1) and v < 1 << 24 and rng.random() < .7
    if laid:
        raw.alignment = v
    return f"general.alignment := {vt}:{v!r}" + (" (laid out)" if laid else "")


def header(raw, rng, ctx):
    """The header: tensor or key count off by one or huge, another version, another magic."""
    how = _pick(rng, ["n_tensors", "n_kv", "version", "magic"])
    if how == "n_tensors":
        raw.n_tensors = _pick(rng, [0, len(raw.tensors) - 1, len(raw.tensors) + 1, 2**63, 2**64 - 1, 2**31])
    elif how == "n_kv":
        raw.n_kv = _pick(rng, [0, len(raw.kvs) - 1, len(raw.kvs) + 1, 2**63, 2**64 - 1, 10**6])
    elif how == "version":
        raw.version = _pick(rng, [0, 1, 4, 2, 3 << 24, 2**32 - 1])
    else:
        raw.magic = _pick(rng, [b"GGUG", b"FUGG", b"\0\0\0\0", b"GGML"])
    return f"{how} -> {raw.magic if how == 'magic' else getattr(raw, how)!r}"


# ---------------------------------------------------------------- data and shards

def nonfinite(raw, rng, ctx):
    """NaN or inf in a weight: an F32 / F16 element, or the f16 scale d of a Q8_0 / Q4_K block."""
    t = _pick(rng, [t for t in raw.tensors if t.type in (0, 1, 8, 12)])       # F32, F16, Q8_0, Q4_K
    b = bytearray(t.blob)
    v = _pick(rng, [float("nan"), float("inf"), float("-inf")])
    if t.type == 0:
        j = int(rng.integers(len(b) // 4)) * 4
        b[j:j + 4] = struct.pack("<f", v)
    else:
        block = {1: 2, 8: 34, 12: 144}[t.type]                                # bytes per element / block
        j = int(rng.integers(len(b) // block)) * block
        b[j:j + 2] = np.float16(v).tobytes()
    t.blob = bytes(b)
    return f"{t.name.decode()} byte {j} := {v}"


def shards(raw, rng, ctx):
    """Split sets that disagree: split.no / count / tensors.count changed or mistyped, a shard missing, a tensor
    in two shards; on a single file, split keys that claim a set."""
    files, target = ctx["files"], ctx["target"]
    opts = ["split.no", "split.count", "split.tensors.count", "drop_file", "move_tensor", "add_split"]
    how = _pick(rng, opts if len(files) > 1 else ["add_split", "split.count", "split.no"])
    if how.startswith("split."):
        v = _pick(rng, [0, 1, 2, len(files), len(files) + 1, 65535, 2**31, 1.5, "2"])
        vt = STR if isinstance(v, str) else F32 if isinstance(v, float) else \
            _pick(rng, [U16, I32, U64]) if how != "split.tensors.count" else I32
        i = next((i for i, (k, _, _) in enumerate(raw.kvs) if k == how.encode()), None)
        if i is None:
            raw.kvs.append((how.encode(), vt, encode_value(vt, v)))
        else:
            _set(raw, i, vt, v)
        return f"shard {target}: {how} := {vt}:{v!r}"
    if how == "drop_file":
        ctx["drop"] = True
        return f"shard {target} missing"
    if how == "move_tensor":                       # one tensor of this shard also written into the next one
        other = (target + 1) % len(files)
        oraw = parse(ctx["bufs"][other])
        oraw.tensors.append(TInfo(**_pick(rng, raw.tensors).__dict__))
        ctx["bufs"][other] = oraw.encode()
        return f"a tensor of shard {target} also in shard {other}"
    raw.kvs = [kv for kv in raw.kvs if not kv[0].startswith(b"split.")]
    raw.kvs += [(b"split.count", U16, encode_value(U16, 2)), (b"split.no", U16, encode_value(U16, 0))]
    return "split.count = 2 on a file not named as a shard"


MUTATIONS = {"value_type": value_type, "count": count, "float": float_value, "dup_key": dup_key,
             "drop_key": drop_key, "arch": arch, "dims": dims, "tensor_type": tensor_type, "dup_tensor": dup_tensor,
             "tensor_name": tensor_name, "offset": offset, "alignment": alignment, "header": header,
             "truncate": None, "byteflip": None, "nonfinite": nonfinite, "shards": shards}
KINDS = tuple(MUTATIONS)


def _truncate(data: bytes, head: int, rng) -> tuple[bytes, str]:
    """Cut anywhere; 70% of cuts fall in the header, tensor table or first bytes of data."""
    cut = int(rng.integers(head + 64)) if rng.random() < .7 else int(rng.integers(len(data)))
    return data[:cut], f"cut at byte {cut} of {len(data)}"


def _byteflip(data: bytes, head: int, rng) -> tuple[bytes, str]:
    """1-8 random bit flips, 80% of them in the header and tensor table."""
    b = bytearray(data)
    n = int(rng.integers(1, 9))
    where = [int(rng.integers(head if rng.random() < .8 else len(b))) for _ in range(n)]
    for j in where:
        b[j] ^= 1 << int(rng.integers(8))
    return bytes(b), f"{n} bit flips at {sorted(where)[:4]}"


def mutate(files: list[str], kind: str, rng, outdir: str) -> tuple[str, str]:
    """Write one mutant of the seed set `files` into outdir; returns (the path to open, a description)."""
    target = int(rng.integers(len(files))) if kind in ("shards", "byteflip", "truncate") else 0
    bufs = [open(f, "rb").read() for f in files]
    raw = parse(bufs[target])
    ctx = {"files": files, "target": target, "bufs": bufs, "drop": False}
    if kind in ("truncate", "byteflip"):
        head = len(bufs[target]) - sum(len(t.blob) for t in raw.tensors)
        data, desc = (_truncate if kind == "truncate" else _byteflip)(bufs[target], head, rng)
        desc = f"shard {target}: {desc}" if len(files) > 1 else desc
    else:
        desc = MUTATIONS[kind](raw, rng, ctx)
        data = raw.encode()
    for i, f in enumerate(files):
        p = os.path.join(outdir, os.path.basename(f))
        if i != target:
            open(p, "wb").write(ctx["bufs"][i])
        elif not ctx["drop"]:
            open(p, "wb").write(data)
    return os.path.join(outdir, os.path.basename(files[0])), desc
