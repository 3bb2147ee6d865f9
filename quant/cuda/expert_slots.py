"""The expert cache's slot pool: N expert slots per role (gate, up, down), shaped like a DeviceWeight of N experts,
so the grouped kernels run on it unchanged with the batch's expert ids remapped to slot ids (issue 24).

Legend: T tokens, A active experts per token, E experts of a layer, N slots, O rows, I columns (packed: rowb bytes).

    pool = SlotPool(N, strides)              three byte buffers; role r: N * strides[r] bytes (+ PAD)
    pool.load(s, {"gate": g, ...}, e)        expert e's packed rows of each tensor -> slot s (host->device)
    pool.copy(s, {"gate": g, ...}, e)        the same, uncounted (a prefetch's worker thread; `count` later)
    pool.kernel_weight("up", u)              a DeviceWeight-shaped view: E = N, estride = the role's stride
    pool.qtensor("up", u)                    the host pool's bytes as a QTensor [N, O, I] ("sim": NumPy stands in)

The kernels address expert e of a weight at e * estride (quant/cuda/gemv.py, fast.py, tc.py): with ids remapped to
slots they read slot s at s * stride, the same bytes the fully resident tensor holds at e * estride, so the products
are the same bits. The group tables are built with the model's E (`gmax = min(E, T*A)`), not N, so the kernel the
"auto" dispatch picks is the one the resident run picks too. Gate and up share one stride: the GLU launch decodes
both at one estride.

`cached_experts(cache, ids, kw)` is the whole remapping: lookup (misses loaded into their slots), the slot ids, and
the moe_ffn arguments with the three tensors replaced by the pool's views and the per-expert `.scale` vectors
reindexed by slot. Used by `moe_ffn_resident(cache=...)` and `moe.moe_ffn(cache=...)` (a traced run) on the GPU,
and by the runtime's "sim" device path.
"""
from __future__ import annotations

import numpy as np

from ..ref import QTensor, QuantError

PAD = 16                      # as quant/cuda/weights.py: a 4-byte read at any offset stays inside the allocation
ROLES = ("gate", "up", "down")
SCALES = {"gate": "gate_scale", "up": "up_scale", "down": "down_scale"}


def expert_bytes(t: QTensor) -> int:
    return int(t.raw.size // t.shape[0])


def strides_of(tensors: dict) -> dict:
    """Per role the bytes of one expert; gate and up at the larger of the two (one estride in the GLU launch)."""
    s = {r: expert_bytes(t) if t is not None else 0 for r, t in tensors.items()}
    s["gate"] = s["up"] = max(s.get("gate", 0), s.get("up", 0))
    return s


class SlotWeight:
    """A DeviceWeight-shaped view of one role's slot buffer (the fields the kernels read: type, spec, tab, w32, w16,
    O, I, E, rowb, estride), for the tensor `t` whose experts are in the slots."""

    def __init__(self, d8, t: QTensor, n_slots: int, stride: int):
        from .decoders import spec
        from .weights import device_table
        self.qt = t
        self.type = t.type
        self.shape = (n_slots, *t.shape[1:])
        self.rowb = int(t.raw.shape[-1])
        self.E = n_slots
        self.O = t.shape[-2]
        self.I = t.shape[-1]
        self.estride = stride
        self.d8 = d8
        self.w32 = d8.view(np.uint32)
        self.w16 = d8.view(np.float16)
        self.spec = spec(t.type)
        self.tab = device_table(self.spec.table)


class SlotPool:
    """N expert slots per role on the device (numba device arrays), or on the host (`host=True`: NumPy, the "sim"
    device's stand-in). `loads` / `bytes_loaded` count what `load` copied."""

    def __init__(self, n_slots: int, strides: dict, *, host: bool = False):
        self.n_slots = int(n_slots)
        self.strides = {r: int(strides.get(r, 0)) for r in ROLES}
        self.host = host
        self.buf = {}
        for r in ROLES:
            n = self.n_slots * self.strides[r] + PAD
            n += (-n) % 16
            if host:
                self.buf[r] = np.zeros(n, dtype=np.uint8)
            else:
                from numba import cuda
                self.buf[r] = cuda.device_array(n, dtype=np.uint8)
        self.loads = 0
        self.bytes_loaded = 0

    @property
    def nbytes(self) -> int:
        return sum(int(b.size) for b in self.buf.values())

    def load(self, slot: int, tensors: dict, expert: int, stream=0) -> int:
        """Copy expert `expert` of each tensor (role -> QTensor [E, O, I] or None) into slot `slot`; bytes copied."""
        moved = self.copy(slot, tensors, expert, stream)
        self.count(1, moved)
        return moved

    def count(self, loads: int, moved: int) -> None:
        """Counts copies made by `copy` (a prefetch's, from another thread: counted by the thread that waited)."""
        self.loads += loads
        self.bytes_loaded += moved

    def copy(self, slot: int, tensors: dict, expert: int, stream=0) -> int:
        """`load` without counting: safe from a worker thread while the pool's owner runs kernels on other slots.
        On a GPU the copy is on `stream` (0: numba's default stream, the kernels' own: queued after the kernels
        already launched that read the slot)."""
        if not 0 <= slot < self.n_slots:
            raise QuantError(f"expert slot {slot} out of range for a pool of {self.n_slots}")
        moved = 0
        for r, t in tensors.items():
            if t is None:
                continue
            nb = expert_bytes(t)
            if nb > self.strides[r]:
                raise QuantError(f"tensor {t.name!r}: one expert is {nb} bytes, more than the {self.strides[r]}-byte "
                                 f"{r} slot (size the cache over every layer: ExpertCache.for_model)")
            src = np.ascontiguousarray(t.raw.reshape(t.shape[0], -1)[expert])          # [O * rowb] uint8
            o = slot * self.strides[r]
            if self.host:
                self.buf[r][o:o + nb] = src
            else:
                self.buf[r][o:o + nb].copy_to_device(src, stream=stream)
            moved += nb
        return moved

    def kernel_weight(self, role: str, t: QTensor) -> SlotWeight:
        return SlotWeight(self.buf[role], t, self.n_slots, self.strides[role])

    def qtensor(self, role: str, t: QTensor) -> QTensor:
        """The host slots as a QTensor [N, O, I] of t's type (expert s: the bytes at s * stride)."""
        O, rowb = t.shape[-2], int(t.raw.shape[-1])
        raw = self.buf[role][:self.n_slots * self.strides[role]].reshape(self.n_slots, self.strides[role])
        raw = raw[:, :O * rowb].reshape(self.n_slots, O, rowb)
        return QTensor(f"{t.name}@slots", t.type, (self.n_slots, *t.shape[1:]), raw)


def cached_experts(cache, ids: np.ndarray, kw: dict, *, host: bool, stream=0) -> tuple[np.ndarray, dict]:
    """ids [T, A] (host) and moe_ffn's keyword arguments (up, gate, down, the scales, il) -> (slot ids [T, A] int32,
    the arguments with the tensors as pool views: SlotWeight on the device, QTensor on the host, and the scales
    reindexed by slot). The batch's slots stay pinned until `cache.release()`."""
    il = kw.get("il", -1)
    tensors = {r: kw.get(r) for r in ROLES}
    if cache.pool is None:
        cache.pool = SlotPool(cache.n_slots, cache.strides or strides_of(tensors), host=host)
    pool = cache.pool
    slots = cache.lookup(il, ids, loader=lambda s, e: pool.load(s, tensors, e, stream)).astype(np.int32)
    e_of_s = cache.expert_of_slot(il) if any(kw.get(v) is not None for v in SCALES.values()) else None   # [N]
    out = dict(kw)
    for r, t in tensors.items():
        if t is not None:
            out[r] = pool.qtensor(r, t) if host else pool.kernel_weight(r, t)
        sc = kw.get(SCALES[r])
        if sc is not None:
            out[SCALES[r]] = np.asarray(sc)[e_of_s]                          # [E] -> [N]
    return slots, out
