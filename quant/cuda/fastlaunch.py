"""A shorter host path for numba-cuda's kernel launches: what a resident prefill's host time was spent on.

    install()          numba's CUDADispatcher.call takes the short path for launches it has seen (idempotent)
    numba_view(a)      a numba view of a CuPy array, cached by (pointer, shape, strides, dtype)

Why: a device-resident prefill launches a few hundred kernels, and on the H200 machine its host time exceeded
its GPU time (benchmarks/profile_prefill.py --sort cumulative, Qwen3-Next 4 blocks, 512 tokens: 94.5 ms wall,
23.6 ms of GPU time; numba's dispatch 56 ms and `cuda.as_cuda_array` 38 ms of the 166 ms profiled). numba
re-derives each argument's type, wraps each array in a new device-array object and re-checks the context on
every launch.

The short path: the first launch of a kernel with a given argument signature goes through numba unchanged (it
compiles); then the compiled kernel and a packer per argument are kept under a key of the arguments' kinds
(dtype and rank of each array, the Python type of each scalar). A later launch with the same key packs the
arguments as numba does (`_Kernel._prepare_args`: an array is meminfo 0, parent 0, size, itemsize, pointer, shape,
strides; an integer its ctypes type) and calls cuda.core's `launch` directly. An array's kind includes its layout
(`_layout`): C-contiguous (a dimension of size 1 with any stride included) or strided, a strided one served only
by a kernel numba compiled for layout "A" (a prefill's strided views: a rope of q's tail, a norm of a latent's
columns, took numba's whole path, ~170-260 us of host each, session 29's count). An empty or host array, another
argument type, a launch-config-sensitive or debug kernel goes the whole way through numba every time.

`numba_view` keeps the views it made (at most VIEW_CACHE): a view is only a pointer with a shape, so two CuPy
arrays at the same address with the same shape share one. The cached view holds no reference to a CuPy array; each
call returns a shallow copy of it that holds the caller's array (a view of a temporary, `_nb(cp.empty(n))`, keeps
the memory alive as numba's does; without that, the first version of this cache let CuPy's pool hand the memory
to the next allocation and four archs' GPU tests failed).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

VIEW_CACHE = 4096
STRIDED = os.environ.get("REFENGINE_FASTLAUNCH_STRIDED", "1") != "0"    # strided arrays on the short path (layout
#                                                                         "A" kernels); 0: numba's path, as before
_VIEWS: dict = {}
INSTALLED = False               # install() ran: launches take the short path, streams.numba_view the cached views
_ORIG = None
_launch = None                  # cuda.core's launch (set by install())
_CONFIGS: dict = {}
stats = {"short": 0, "numba": 0}
slow_by: dict = {}              # kernel name -> launches that went numba's whole way (a strided array, another
                                # argument type, the first of a signature): ~170-260 us of host time each


def numba_view(a):
    """numba's view of CuPy array a (no copy, no synchronisation): a shallow copy of the view made once for the same
    pointer, shape, strides and dtype, holding a reference to `a` (as numba's own view does: the CuPy array lives as
    long as the view, whoever drops it first)."""
    key = (a.data.ptr, a.shape, a.strides, a.dtype.char)
    v = _VIEWS.get(key)
    if v is None:
        from numba import cuda
        if len(_VIEWS) >= VIEW_CACHE:
            _VIEWS.clear()
        v = _VIEWS[key] = cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=None, sync=False)
        _numba_fields(v)                            # (kept in the view's __dict__: every copy below carries them)
    out = object.__new__(type(v))
    out.__dict__.update(v.__dict__)
    out._refengine_owner = a
    return out


def _c_strides(shape, itemsize):
    out, s = [], itemsize
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


def _layout(shape, strides, itemsize):
    """"C": laid out C-contiguous, a dimension of size 1 whatever its stride (an index into it is 0, so a kernel
    compiled for C reads the same bytes: a decode's row of a wider product, `y[:, a:b]` of one token); "X": any other
    strides (served by a kernel numba compiled for layout "A" only, `_entry`); None: empty (numba's path)."""
    if 0 in shape:
        return None
    c = all(n == 1 or st == cs for n, st, cs in zip(shape, strides, _c_strides(shape, itemsize)))
    return "C" if c else "X"


def _numba_fields(a):
    """(fields, C-contiguous) of a numba device array, computed once and kept in its __dict__ (a numba array's
    pointer, shape, strides and dtype never change: `__cuda_array_interface__` builds a dict and checks the
    context at every read, the largest part of a launch's host time with the weights' and the views' arrays)."""
    got = a.__dict__.get("_refengine_fields")
    if got is None:
        cai = a.__cuda_array_interface__
        shape = tuple(cai["shape"])
        st = cai["strides"]
        c = _c_strides(shape, a.dtype.itemsize)
        st = tuple(st) if st is not None else c
        got = a.__dict__["_refengine_fields"] = ((cai["data"][0], shape, st, a.dtype),
                                                 _layout(shape, st, a.dtype.itemsize))
    return got


def _array_fields(a):
    """((pointer, shape, strides, dtype), its `_layout`) of a CuPy array or a numba device array (its fields kept on
    it: `_numba_fields`); None for anything else."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        return (a.data.ptr, a.shape, a.strides, a.dtype), _layout(a.shape, a.strides, a.dtype.itemsize)
    if mod.startswith("numba"):
        return _numba_fields(a)
    return None


def _fields_and_key(args):
    """Each argument's fields (an array's from `_array_fields`, a scalar as it is) and the arguments' kinds, read
    once for both the cache key and the packing; (None, None) when a launch must go through numba."""
    fields, key = [], []
    for a in args:
        t = type(a)
        if t is int:
            if not -(1 << 63) <= a < (1 << 63):
                return None, None
            k = "int"
        elif t is float:
            k = "float"
        elif t is bool:
            k = "bool"
        elif isinstance(a, np.generic):             # a NumPy scalar: its dtype (np.float32(1) is not 1.0)
            k = ("scalar", a.dtype.char)
        else:
            got = _array_fields(a)
            if got is None or got[1] is None or (got[1] == "X" and not STRIDED):
                return None, None
            a = got[0]
            k = ("array", a[3].char, len(a[1]), got[1])
        fields.append(a)
        key.append(k)
    return fields, tuple(key)


def _packer(ty):
    """A function appending an argument's kernel parameters as numba's `_prepare_args` does, or None; it takes the
    argument's fields from `_fields_and_key` (an array's (pointer, shape, strides, dtype), a scalar itself)."""
    from numba.cuda import types
    if isinstance(ty, types.Array):
        def pack(f, out):
            ptr, shape, strides, dt = f
            size = 1
            for n in shape:
                size *= n
            out += (0, 0, size, dt.itemsize, ptr)
            out += shape
            out += strides
        return pack
    if isinstance(ty, types.Integer):
        c = getattr(ctypes, f"c_{ty}")
        return lambda v, out: out.append(c(v))
    if ty == types.float32:
        return lambda v, out: out.append(ctypes.c_float(v))
    if ty == types.float64:
        return lambda v, out: out.append(ctypes.c_double(v))
    if ty == types.boolean:
        return lambda v, out: out.append(v)
    return None


def _config(lc):
    key = (lc.griddim, lc.blockdim, lc.sharedmem)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        from cuda.core import LaunchConfig
        from numba.cuda._compat import CUDA_CORE_GE_1_0
        kw = {"is_cooperative": False} if CUDA_CORE_GE_1_0 else {"cooperative_launch": False}
        cfg = _CONFIGS[key] = LaunchConfig(grid=lc.griddim, block=lc.blockdim, shmem_size=lc.sharedmem, **kw)
    return cfg


def _entry(disp, args, lc, key=()):
    """(cuda.core kernel, packers) for this launch's compiled kernel, or None when it must stay on numba's path. A
    strided array (key layout "X") is served only by a kernel compiled for layout "A" (any strides: numba typed
    this launch's array so); one numba typed "F" or "C" would misread another strided array of the same key."""
    if lc.pre_launch_callbacks or disp.specialized or disp._select_launch_config_dispatcher(lc) is not disp:
        return None
    try:
        argtypes = tuple(disp.typeof_pyval(a) for a in args)
    except Exception:                                   # noqa: BLE001 - any doubt: numba's path
        return None
    k = disp.overloads.get(argtypes)
    if k is None or k.debug or k.cooperative or tuple(k.argument_types) != argtypes:
        return None
    if any(isinstance(kk, tuple) and kk[-1] == "X" and getattr(t, "layout", None) != "A"
           for kk, t in zip(key, k.argument_types)):
        return None
    packers = [_packer(t) for t in k.argument_types]
    if any(p is None for p in packers):
        return None
    return k._codelibrary.get_cufunc().kernel, packers


def _call(self, args, launch_config):
    fields, key = _fields_and_key(args)
    cache = self.__dict__.setdefault("_fastlaunch", {})
    ent = cache.get(key) if key is not None else None
    if ent:
        kern, packers = ent
        params: list = []
        for p, f in zip(packers, fields):
            p(f, params)
        stats["short"] += 1
        _launch(launch_config.stream, _config(launch_config), kern, *params)
        return
    stats["numba"] += 1
    name = getattr(getattr(self, "py_func", None), "__qualname__", None) or type(self).__name__
    slow_by[name] = slow_by.get(name, 0) + 1
    _ORIG(self, args, launch_config)
    if key is not None and key not in cache:
        cache[key] = _entry(self, args, launch_config, key) or False


def install() -> bool:
    """Route numba-cuda's launches through the short path; False (nothing changed) where numba-cuda's internals
    are not the ones this was written against (no cuda.core launch, no CUDADispatcher.call)."""
    global INSTALLED, _ORIG, _launch
    if INSTALLED:
        return True
    try:
        from cuda.core import LaunchConfig, launch  # noqa: F401  (LaunchConfig: _config's)
        from numba.cuda.core import config
        from numba.cuda.dispatcher import CUDADispatcher
    except ImportError:
        return False
    if not hasattr(CUDADispatcher, "call") or not hasattr(CUDADispatcher, "_select_launch_config_dispatcher"):
        return False
    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0           # a Python warning per small-grid launch: host time too
    _ORIG, _launch = CUDADispatcher.call, launch
    CUDADispatcher.call = _call
    INSTALLED = True
    return True


def reset_stats() -> None:
    """Zero `stats` and `slow_by` (a benchmark counts one run's launches)."""
    stats["short"] = stats["numba"] = 0
    slow_by.clear()


def uninstall() -> None:
    global INSTALLED
    if INSTALLED:
        from numba.cuda.dispatcher import CUDADispatcher
        CUDADispatcher.call = _ORIG
        INSTALLED = False
