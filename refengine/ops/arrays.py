"""Array conversions that keep an array where it lives (the host, or a device: refengine.devarray).

`np.asarray` / `np.ascontiguousarray` always return a host array: on a device array they read it back. The
forward's code converts its own activations with these instead; positions, token ids and other host-side
values still use NumPy's."""
from __future__ import annotations

import numpy as np


def fused_op(x, name: str):
    """The fused kernel for op `name` of the device x lives on (refengine/cuda/fused.py: a GPU's one-launch form of
    a small op whose NumPy statement takes several launches), or None: a host array, the sim device, `Device.fused`
    off, or this entry left out (`Device.fused_off`). The kernel itself returns None for a shape or dtype it does not
    take; the NumPy code then runs."""
    entry = getattr(getattr(x, "dev", None), "fused_entry", None)      # (`Device.fused_entry`)
    return None if entry is None else entry(name)


def row_kernel(op: str, fn, *args, **kw):
    """fn(*args, **kw) for an op whose NumPy statement `fn` walks rows on the host (a heap, a scan: no array form),
    where args live: host arrays -> fn itself; device arrays -> one kernel there (`Device.row_kernel`: a GPU's
    refengine/cuda/fused.py `op`; the sim device runs fn on its own arrays, as that kernel would, without a
    read-back). The first argument says where."""
    dev = getattr(args[0], "dev", None)
    return fn(*args, **kw) if dev is None else dev.row_kernel(op, fn, args, kw)


def as_array(x, dtype=None):
    """x as an array of `dtype` (None: its own), not copied when it already is one, on the device it lives on."""
    if not hasattr(x, "astype"):
        return np.asarray(x, dtype=dtype)
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)


def contiguous(x, dtype=None):
    """np.ascontiguousarray(x, dtype) that keeps a device array on its device."""
    if not hasattr(x, "astype"):
        return np.ascontiguousarray(x, dtype=dtype)
    return x.astype(x.dtype if dtype is None else dtype, order="C", copy=False)


def take_rows(table, ids):
    """table[ids] for a 2-D table [V, W] and ids [T] -> [T, W], computed where the ids live (a host table indexed by
    device ids is gathered on the device, the table a constant there; `table[ids]` would read the ids back)."""
    return np.take_along_axis(table, as_array(ids)[:, None], axis=0)                # [T, 1] broadcast over W


def copy_like(a, like, dtype=None):
    """A copy of `a` (in `dtype`, None: a's own) on the device `like` lives on (the host when it is a host array):
    a carried state joining a forward that runs on a device."""
    out = np.empty_like(like, shape=np.shape(a), dtype=dtype or a.dtype)
    out[...] = a
    return out


def known_all(cond) -> bool:
    """np.all(cond) for a host array; False for a device array, whose value is not read back (that would
    synchronise with the host): where a caller skips work when a condition holds everywhere (a tile the mask hides),
    a device does the work instead, which must then change nothing."""
    return isinstance(cond, (np.ndarray, np.generic, bool)) and bool(np.all(cond))
