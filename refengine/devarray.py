"""Device-resident activations for the readable NumPy forward: the same module code, arrays kept on a device.

    dev = Device("cupy")                 # a GPU through CuPy; Device("sim"): NumPy standing in for it (tests, CI)
    x = dev.put(host)                    # a DeviceArray: the residual, the caches, every intermediate
    y = np.exp(x) * w_norm + x           # NumPy calls dispatch to the device (NEP 13/18); `w_norm`, a host weight
                                         # vector, is uploaded once and kept (read-only host arrays are cached)
    dev.get(y)                           # back to the host

The concept modules (`attention/`, `moe/`, `ffn/`, `residual/`, the arch files) are the only statement of the
forward pass. Run on DeviceArrays they compute on the device: every ufunc and array function (`np.einsum`,
`np.concatenate`, `np.argpartition`, ...) reaches CuPy's implementation through `__array_ufunc__` /
`__array_function__`, weight products go through `Runtime.matmul` / `moe_ffn` to the numba-cuda kernels on the
device buffers, and the per-layer state (`cache.Rows`) grows on the device. Nothing else is written per arch.

What the module code does that a device cannot do silently is done anyway, correctly, and counted
(`dev.stats`, the numbers a device path is tuned from):

    uploads        a host array meeting a device array: a mask, a rope table, a freshly made index
    weight_uploads a read-only host array (a norm vector, a dense weight) uploaded on its first use, then reused
    downloads      a device array read on the host: `np.asarray(x)`, `float(x)`, a trace
    calls          NumPy calls dispatched to the device (each one kernel launch or more: what a decode step costs
                   in launches before any fusion)
    fallbacks      a NumPy function the device library lacks (CuPy): run on the host, the result put back

Two tools check that a span of work (a decode step) could be captured as one CUDA graph and replayed:

    with dev.strict():                   # an upload (a weight's first one too), a read-back, a host fallback or
        ...                              # an op sized by the data (np.nonzero, x[mask]: a count read back)
                                         # raises DeviceSyncError naming the op: nothing in the span syncs
    with dev.recording() as sig:         # sig: the list of ops the span ran, each with its arguments' shapes and
        ...                              # dtypes and its scalars' values (`signature`)

A span is capturable when it passes `strict()` and two consecutive runs of it (token n, token n + 1) record equal
signatures: the same ops on the same shapes with the same baked-in scalars (a Python int that changes per token,
such as a cache row written at `n`, shows as a different value). Weights are uploaded on their first use, so a
warm-up step runs before a strict one: a first-time weight upload inside `strict()` raises too (a copy from host
memory cannot be captured into a graph).

A host array is cached on the device only when no array in its `.base` chain is writeable (the weights: refengine
loads them read-only), so a cached copy can never go stale. On the "sim" device the arrays are NumPy's own: the
results are bit-identical to the plain host run, and the counters are the same as on the GPU, which is what CI
checks without a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import traceback
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from .cache import Rows
from .errors import DeviceSyncError

KINDS = ("cupy", "sim")
# NumPy functions that write into their first argument: given a host array there, they run on the host (the device
# arguments read back), so the host array is the one written, never an uploaded copy of it
INPLACE = frozenset({"put_along_axis", "put", "copyto", "place", "putmask", "fill_diagonal"})
# NumPy's array creation functions that reach a DeviceArray only through `like=` (`np.arange(S, like=x)`): made by
# the device library, on the device (those that copy data in, such as np.array, are left out: that is an upload)
CREATE = frozenset({"arange", "empty", "zeros", "ones", "full", "eye", "identity"})
# NumPy functions whose result's shape depends on the data: the device library reads a count back to size it (CuPy
# synchronises), so strict() refuses them, as it does indexing by a boolean device array (`x[mask]`)
SHAPE_FROM_DATA = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "extract", "compress"})


@dataclass
class DeviceStats:
    uploads: int = 0
    upload_bytes: int = 0
    weight_uploads: int = 0
    weight_bytes: int = 0
    downloads: int = 0
    download_bytes: int = 0
    calls: int = 0                                      # NumPy calls dispatched to the device (ufuncs, functions)
    fallbacks: dict = field(default_factory=dict)       # NumPy function name -> times run on the host

    def as_dict(self) -> dict:
        return dict(uploads=self.uploads, upload_bytes=self.upload_bytes, weight_uploads=self.weight_uploads,
                    weight_bytes=self.weight_bytes, downloads=self.downloads, download_bytes=self.download_bytes,
                    calls=self.calls, fallbacks=dict(self.fallbacks))

    def since(self, before: dict) -> dict:
        now = self.as_dict()
        out = {k: now[k] - before[k] for k in now if k != "fallbacks"}
        out["fallbacks"] = {k: v - before["fallbacks"].get(k, 0) for k, v in now["fallbacks"].items()
                            if v != before["fallbacks"].get(k, 0)}
        return out


_AS_IS = frozenset({int, float, bool, type(None), slice, str, type(Ellipsis)})   # leaves unwrap passes as they are


def _tree(v, leaf, dataclass_fields: bool = False):
    """leaf applied to every value inside tuples, lists and dicts (and dataclass instances' init fields when asked),
    the containers rebuilt; the one walk every conversion here takes."""
    if isinstance(v, (tuple, list)):
        return type(v)([_tree(e, leaf, dataclass_fields) for e in v])      # (a list made first: faster than a
                                                                          # generator, on every op of a forward)
    if isinstance(v, dict):
        return {k: _tree(e, leaf, dataclass_fields) for k, e in v.items()}
    if dataclass_fields and dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.replace(v, **{f.name: _tree(getattr(v, f.name), leaf, True)
                                         for f in dataclasses.fields(v) if f.init})
    return leaf(v)


def _immutable(a: np.ndarray) -> bool:
    """No array in a's base chain is writeable: its bytes cannot change while it lives."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return True


def _caller() -> str:
    """file:line of the innermost frame outside this file and NumPy: the line of the module that asked."""
    for f in reversed(traceback.extract_stack()[:-2]):
        if not f.filename.endswith("devarray.py") and "/numpy/" not in f.filename:
            return "/".join(f.filename.replace("\\", "/").split("/")[-2:]) + f":{f.lineno}"
    return "?"


def _op_name(func) -> str:
    """`np.add`, `np.add.reduce`, `np.einsum`: how strict() and recording() name a NumPy call."""
    name = getattr(func, "__name__", repr(func))
    owner = getattr(func, "__self__", None)
    if isinstance(owner, np.ufunc):                                                # a ufunc's __call__ or method
        return f"np.{owner.__name__}" + ("" if name == "__call__" else f".{name}")
    return f"np.{name}"


def tree_map(v, leaf):
    """leaf applied to every value inside tuples, lists, dicts and dataclass instances (a residual of several arrays),
    the containers rebuilt (public form of the module's one walk)."""
    return _tree(v, leaf, True)


def buffers(v, dataclass_fields: bool = False) -> list:
    """The device buffers (and host arrays) in v, containers walked (dataclass instances' fields too when asked),
    in order."""
    out = []
    _tree(v, lambda a: out.append(a.raw if isinstance(a, DeviceArray) else a)
          if isinstance(a, (DeviceArray, np.ndarray, np.generic)) else None, dataclass_fields)
    return out



def signature(v):
    """What a captured op depends on besides the bytes in its buffers: arrays as (where, shape, dtype), scalars,
    slices and dtypes by value, containers walked; anything else by its type's name."""
    if isinstance(v, DeviceArray):
        return ("dev", v.shape, v.dtype.str)
    if isinstance(v, np.ndarray):
        return ("host", v.shape, v.dtype.str)
    if isinstance(v, (tuple, list)):
        return tuple(signature(e) for e in v)
    if isinstance(v, dict):
        return tuple((k, signature(e)) for k, e in sorted(v.items()))
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    if v is None or isinstance(v, (bool, int, float, str, np.generic, np.dtype)) or v is Ellipsis:
        return v if not isinstance(v, np.dtype) else v.str
    if isinstance(v, type):
        return v.__name__
    return type(v).__name__


class Device:
    """Where a resident forward keeps its arrays: "cupy" (the GPU) or "sim" (NumPy, the same code path)."""

    def __init__(self, kind: str = "cupy"):
        if kind not in KINDS:
            raise ValueError(f"device kind {kind!r} is not one of {KINDS}")
        self.kind = kind
        if kind == "cupy":
            import cupy
            self.xp = cupy
            self.raw_type = cupy.ndarray
        else:
            self.xp = np
            self.raw_type = np.ndarray
        self.stats = DeviceStats()
        # "library": activations multiplied by the array library (cuBLAS under CuPy); "kernel": np.matmul / np.einsum
        # as one batched product of the project's (refengine/ops/products.py, quant/cuda/bmm.py), which a CUDA graph
        # capture can hold (CuPy refuses cuBLAS while a stream is captured). Runtime(fixed_shapes=True) on a GPU
        # sets it; on the sim device NumPy's matmul is the batched product (the lowering tested in CI).
        self.products = "library"
        # a GPU's fused kernels for small ops (refengine/cuda/fused.py, reached through ops.arrays.fused_op): one
        # launch each where the NumPy statement takes several; None: the NumPy code runs on the device op by op
        self.fused = None
        self.fused_off = frozenset()    # fused entries left to the NumPy statements (KernelPolicy.fused_off)
        self.gathered_prefill = None    # a prefill's gathered attention: "batched" / "fused" (None: fused.py's choice)
        self.prefill_attention = None   # a prefill's dense attention: "auto" / "rows" / "batched" (None: fused.py's)
        self.ticket = None              # fused.py's int32 [1] zero a launch's last block takes its turn from
        if kind == "cupy":
            try:
                from .cuda import fused
                self.fused = fused
            except Exception:                            # noqa: BLE001  (no numba-cuda: the ops as NumPy states them)
                pass
        self._cache: dict[tuple, tuple[np.ndarray, object]] = {}   # key -> (the host array, kept alive; its copy)
        self._strict = 0                                 # depth of `strict()` spans
        # the current step's positions (Model._step): (their DeviceArray, n_ctx: the bound they are checked below,
        # {key: the tables' rows gathered at them this step}); tables indexed by position (refengine/ops/rope.py):
        # key -> (keep-alive, tables)
        self.step_positions = None
        self.tables: dict[tuple, tuple] = {}
        self._recorders: list[list] = []                 # the open `recording()` spans' op lists
        self._tapes: list[list] = []                     # the open `taping()` spans (the sim device's graphs)
        self.probes: list = []                           # called with each op's name after it ran (a capture's check)

    # ------------------------------------------------------------ capture checks
    @contextlib.contextmanager
    def strict(self):
        """A span in which nothing may synchronise with the host: an upload (a weight's first included), a read-back
        or a host fallback raises DeviceSyncError naming the op (what a CUDA graph capture of the span needs)."""
        self._strict += 1
        try:
            yield self
        finally:
            self._strict -= 1

    @staticmethod
    @contextlib.contextmanager
    def _span(open_lists: list):
        """A new list, open (in `open_lists`) for the span: what `recording` and `taping` yield."""
        ops: list = []
        open_lists.append(ops)
        try:
            yield ops
        finally:
            open_lists.remove(ops)

    def recording(self):
        """Yields a list that receives, for every op run on this device in the span, (op, its arguments'
        `signature`, its result's): two spans that ran the same ops on the same shapes record equal lists."""
        return self._span(self._recorders)

    def note(self, op: str, args, result, redo=None) -> None:
        """Record one op (a NumPy call, an index, or a kernel the runtime launched: `matmul <weight>`) in the open
        recordings; and in the open tapes, with `redo`: a call that computes it again from the same buffers."""
        if self._recorders:
            entry = (op, signature(args), signature(result))
            for r in self._recorders:
                r.append(entry)
        if self._tapes:
            self.tape(op, redo, buffers(result), buffers(args))
        for p in self.probes:
            p(op)

    # ------------------------------------------------------------ tapes: the sim device's CUDA graphs
    def taping(self):
        """Yields a tape that receives every op run on this device in the span, each as a call that computes it again
        from the buffers it read into the buffers it wrote: `replay(tape)` then does what launching a CUDA graph
        captured from the span does (the same ops on the same buffers, whatever they hold now; no Python of the
        span runs). What the sim device has instead of stream capture (refengine/cuda/graph_step.py)."""
        return self._span(self._tapes)

    def tape(self, op: str, redo, outs, ins) -> None:
        """Add one op to the open tapes: redo() -> its results, copied into `outs` (the buffers it returned at the
        first run; those that are views of an input follow it and are not copied)."""
        if redo is None:
            raise DeviceSyncError(f"{op} cannot be replayed from a tape (no redo given), at {_caller()}")
        keep = [(k, o) for k, o in enumerate(outs) if not any(np.may_share_memory(o, i) for i in ins)]
        for t in self._tapes:
            t.append((op, redo, keep))

    @staticmethod
    def replay(tape) -> None:
        for op, redo, keep in tape:
            r = buffers(redo())
            for k, dst in keep:
                if k >= len(r):
                    raise RuntimeError(f"tape replay: {op} returned {len(r)} arrays, recorded more")
                np.copyto(dst, r[k])

    def _sync(self, what) -> None:
        """Inside strict(): raise, naming what() (a callable: the words are made only then)."""
        if self._strict:
            raise DeviceSyncError(f"strict device span: {what()}, at {_caller()}; a span that syncs with the host "
                                  f"cannot be captured as a CUDA graph (docs/device_path.md)")

    # ------------------------------------------------------------ moving arrays
    def adopt(self, state) -> int:
        """Make this device the home of the DeviceArrays a sequence's state holds that another Device of the same
        kind made (a state prefilled under one Runtime and continued under another: each Runtime has its own
        Device, over the same memory). No copy: each array's `dev` is set to this one, so that its ops run under
        this device's settings and its fused kernels, which take arrays of their own device only, take it (a GPU
        state continued from another Runtime otherwise left them for the NumPy statements: other sums, ~1e-7
        apart). The arrays are the state's leaves as a captured step finds them (`state_leaves`, below);
        returns how many were re-homed."""
        n = 0
        for _, _, v in state_leaves(state).values():
            if isinstance(v, DeviceArray) and v.dev is not self and v.dev.kind == self.kind:
                v.dev = self
                n += 1
        return n

    def put(self, host) -> "DeviceArray":
        """A host array (or anything np.asarray takes) as a DeviceArray (counted as an upload)."""
        if isinstance(host, DeviceArray):
            return host
        return DeviceArray(self._upload(np.asarray(host), "put"), self)

    def put_tree(self, v):
        """put() applied through lists, tuples and dataclass instances (a residual that is not one array: Kimi-K3's
        running sum and bank); other values as they are."""
        return _tree(v, lambda a: self.put(a) if isinstance(a, (np.ndarray, DeviceArray)) else a, True)

    def get(self, a) -> np.ndarray:
        """A DeviceArray's values on the host (counted as a download); a host array as it is."""
        if not isinstance(a, DeviceArray):
            return np.asarray(a)
        return self._download(a.raw, "get")

    def _upload(self, h: np.ndarray, op: str):
        what = lambda: f"{op} uploads a host array {h.dtype}{list(h.shape)}"        # noqa: E731  (strict's words)
        if _immutable(h):
            key = (h.__array_interface__["data"][0], h.shape, h.strides, h.dtype.str)
            hit = self._cache.get(key)
            if hit is not None:
                return hit[1]
            self._sync(lambda: what() + " (a read-only one, first use: run a warm-up step before the span)")
            raw = self._copy_in(h)
            self._cache[key] = (h, raw)
            self.stats.weight_uploads += 1
            self.stats.weight_bytes += h.nbytes
            return raw
        self._sync(lambda: what() + " (a writeable one: make it on the device, e.g. np.arange(n, like=x), or keep "
                                    "it read-only and made once)")
        self.stats.uploads += 1
        self.stats.upload_bytes += h.nbytes
        return self._copy_in(h)

    def _copy_in(self, h: np.ndarray):
        if self.kind == "cupy":
            return self.xp.asarray(h)
        return h if not h.flags.writeable else h.copy()

    def _download(self, raw, op: str) -> np.ndarray:
        self._sync(lambda: f"{op} reads a device array {raw.dtype}{list(raw.shape)} back to the host")
        self.stats.downloads += 1
        self.stats.download_bytes += raw.nbytes
        return raw.get() if self.kind == "cupy" else raw.copy()

    # ------------------------------------------------------------ wrapping
    def unwrap(self, v, op: str = "an op"):
        """Arguments for the device library: DeviceArrays -> their buffers, host arrays -> uploaded, containers
        walked (index tuples, lists of arrays); scalars, slices, dtypes as they are. op: named by strict()."""
        t = type(v)
        if t is DeviceArray:
            return v.raw
        if t is tuple or t is list:                       # the common case, a flat tuple of arrays and scalars,
            out = []                                      # without the walk's closures (~2x per op: every op of a
            for a in v:                                   # resident forward comes here, twice)
                ta = type(a)
                if ta is DeviceArray:
                    out.append(a.raw)
                elif ta in _AS_IS:
                    out.append(a)
                elif ta is list and all(type(e) is DeviceArray for e in a):    # np.concatenate([a, b]) and kin
                    out.append([e.raw for e in a])
                else:
                    break
            else:
                return out if t is list else tuple(out)
        elif t is dict and not v:
            return {}

        def leaf(a):
            return a.raw if isinstance(a, DeviceArray) else self._upload(a, op) if isinstance(a, np.ndarray) else a
        return _tree(v, leaf)

    def wrap(self, v):
        """A device library's result as DeviceArrays (containers walked)."""
        if type(v) is self.raw_type:                      # the common case: one array
            return DeviceArray(v, self)
        def leaf(a):
            if isinstance(a, self.raw_type):
                return DeviceArray(a, self)
            if self.kind == "sim" and isinstance(a, np.generic):     # a reduction's scalar: CuPy's is a 0-d array
                return DeviceArray(np.asarray(a), self)
            return a
        return _tree(v, leaf)

    def _host(self, v, op: str):
        """Arguments for a host fallback: DeviceArrays downloaded, containers walked."""
        return _tree(v, lambda a: self._download(a.raw, op) if isinstance(a, DeviceArray) else a)

    def call(self, func, args, kwargs, *, create: bool = False):
        """func(*args, **kwargs) on the device; a function the device library lacks runs on the host (counted).
        create: func is a NumPy creation function reached through `like=` (CREATE): the device library's own runs."""
        self.stats.calls += 1
        name = getattr(func, "__name__", None) or repr(func)
        op = _op_name(func) if self._strict or self._recorders else name
        if name in INPLACE and args and isinstance(args[0], np.ndarray):
            return self.on_host(f"{name} (into a host array)", func, args, kwargs)
        if name in SHAPE_FROM_DATA:
            self._sync(lambda: f"{op} sizes its result from the data (a count read back)")
        try:
            fn = getattr(self.xp, name) if create else func
            out = self.wrap(fn(*self.unwrap(args, op), **self.unwrap(kwargs, op)))
            self.note(op, (args, kwargs), out,
                      (lambda: fn(*self.unwrap(args, op), **self.unwrap(kwargs, op))) if self._tapes else None)
            return out
        except TypeError as e:
            if self.kind != "cupy" or "no implementation found" not in str(e) and "Unsupported type" not in str(e):
                raise
        self._sync(lambda: f"{op} has no device implementation: it runs on the host")
        self.stats.fallbacks[name] = self.stats.fallbacks.get(name, 0) + 1
        return self.put_tree(func(*self._host(args, op), **self._host(kwargs, op)))

    # ------------------------------------------------------------ ops with a row-walking statement
    def fused_entry(self, op: str):
        """The fused kernel `op` of this device (refengine/cuda/fused.py, or the sim's stand-ins), or None: `fused`
        off, or `op` one of `fused_off` (KernelPolicy.fused_off: left to the NumPy statements)."""
        return None if self.fused is None or op in self.fused_off else getattr(self.fused, op, None)

    def row_kernel(self, op: str, fn, args, kw):
        """fn(*args, **kw) for an op whose NumPy statement walks rows on the host (`ops.arrays.row_kernel`): a GPU
        runs `self.fused.<op>` (one kernel, the statement's steps; None: it does not take these arguments); the sim
        device runs fn on its own arrays, not counted as a read-back (the kernel's work, on the device), noted with
        a redo (a tape replays it). Where no kernel takes it, the arguments are read back (counted; strict()
        raises) and the result put on the device."""
        self.stats.calls += 1
        name = f"kernel {op}"
        if self.kind == "sim":
            def redo():
                return fn(*[a.raw if isinstance(a, DeviceArray) else a for a in args], **kw)
            out = self.wrap(redo())
            self.note(name, args, out, redo)
            return out
        f = self.fused_entry(op)
        out = None if f is None else f(*args, **kw)
        if out is not None:
            return out
        self._sync(lambda: f"{name} has no GPU kernel for these arguments: its rows are walked on the host")
        self.stats.fallbacks[op] = self.stats.fallbacks.get(op, 0) + 1
        return self.put_tree(fn(*self._host(args, name), **kw))

    # ------------------------------------------------------------ products of activations ("kernel")
    def _bmm(self, a, b):
        if self.kind == "cupy":
            from quant.cuda.bmm import bmm, bmm_parts, fits
            from quant.cuda.timing import graph_like
            if fits(a.shape[0], a.shape[1]):
                return bmm(a, b)
            if graph_like():                              # (CuPy's cuBLAS is refused in a capture: the kernel in
                return bmm_parts(a, b)                    # parts that fit its grid, in a capture's eager step too)
        return self.xp.matmul(a, b)

    def kernel_matmul(self, a, b, out=None, **kw):
        """np.matmul on raw device arrays through the batched product (`products`)."""
        from .ops import products
        if isinstance(out, tuple):                       # a ufunc's out= arrives as a tuple
            (out,) = out
        if kw:
            return self.xp.matmul(a, b, out=out, **kw)
        return products.matmul(self.xp, a, b, self._bmm, out=out)

    def kernel_einsum(self, subscripts, *operands, out=None, **kw):
        """np.einsum on raw device arrays through the batched product (`products`)."""
        from .ops import products
        return products.einsum(self.xp, subscripts, *operands, bmm=self._bmm, out=out, **kw)

    def on_host(self, label, func, args, kwargs):
        """func run on the host with the device arguments read back (counted as a fallback under `label`)."""
        self._sync(lambda: f"{label} runs on the host")
        self.stats.fallbacks[label] = self.stats.fallbacks.get(label, 0) + 1
        return func(*self._host(args, label), **self._host(kwargs, label))


class DeviceArray(NDArrayOperatorsMixin):
    """An array on a Device, used as a NumPy array: operators, ufuncs, NumPy functions, indexing and the array's
    methods run on the device; `np.asarray` / `float()` / iteration read it back (counted)."""

    __slots__ = ("raw", "dev")
    __array_priority__ = 100

    def __init__(self, raw, dev: Device):
        self.raw = raw
        self.dev = dev

    # NumPy protocols
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "at" and isinstance(inputs[0], np.ndarray):          # np.add.at(host, idx, v): in place
            return self.dev.on_host(f"{ufunc.__name__}.at (into a host array)", ufunc.at, inputs, kwargs)
        out = kwargs.get("out")
        if out is not None and any(isinstance(o, np.ndarray) for o in out):
            # in place into a host array (`host *= device`): computed on the device, written back (a download)
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
            r = self.dev.call(getattr(ufunc, method), inputs, kwargs)
            rs = r if isinstance(r, tuple) else (r,)
            for o, v in zip(out, rs):
                o[...] = self.dev._download(v.raw, f"np.{ufunc.__name__} into a host array") \
                    if isinstance(v, DeviceArray) else v
            return out if isinstance(r, tuple) else out[0]
        if ufunc is np.matmul and method == "__call__" and self.dev.products == "kernel":
            return self.dev.call(self.dev.kernel_matmul, inputs, kwargs)
        return self.dev.call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.einsum and self.dev.products == "kernel":
            return self.dev.call(self.dev.kernel_einsum, args, kwargs)
        return self.dev.call(func, args, kwargs, create=func.__name__ in CREATE)

    def __array__(self, dtype=None, copy=None):
        h = self.dev._download(self.raw, "np.asarray (or another host read of a device array)")
        return h if dtype is None else h.astype(dtype, copy=False)

    # the ndarray surface
    shape = property(lambda self: self.raw.shape)
    dtype = property(lambda self: self.raw.dtype)
    ndim = property(lambda self: self.raw.ndim)
    size = property(lambda self: self.raw.size)
    nbytes = property(lambda self: self.raw.nbytes)
    itemsize = property(lambda self: self.raw.itemsize)
    T = property(lambda self: DeviceArray(self.raw.T, self.dev))
    flags = property(lambda self: self.raw.flags)

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, idx):
        if any(isinstance(i, DeviceArray) and i.dtype == bool for i in (idx if isinstance(idx, tuple) else (idx,))):
            self.dev._sync(lambda: "getitem by a boolean mask sizes its result from the data (a count read back)")
        out = self.dev.wrap(self.raw[self.dev.unwrap(idx, "getitem")])
        self.dev.note("getitem", (self, idx), out, lambda: self.raw[self.dev.unwrap(idx, "getitem")])
        return out

    def __setitem__(self, idx, value):
        self.raw[self.dev.unwrap(idx, "setitem")] = self.dev.unwrap(value, "setitem")
        self.dev.note("setitem", (self, idx, value), None,
                      lambda: self.raw.__setitem__(self.dev.unwrap(idx, "setitem"), self.dev.unwrap(value, "setitem")))

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _scalar(self):
        if self.raw.size != 1:
            return self.__array__()
        return self.dev._download(self.raw, "float() / int() / bool() of a device array").reshape(-1)[0]

    def __float__(self):
        return float(self._scalar())

    def __int__(self):
        return int(self._scalar())

    def __index__(self):
        return int(self._scalar())

    def __bool__(self):
        return bool(self._scalar())

    def __getattr__(self, name):
        if name in ("raw", "dev") or name.startswith("__"):   # not set yet (copy / pickle); protocols such as
            raise AttributeError(name)                 # __array_interface__ are not the buffer's (sim: NumPy's)
        attr = getattr(self.raw, name)
        if callable(attr):
            dev = self.dev

            def method(*a, **k):
                if name in SHAPE_FROM_DATA:
                    dev._sync(lambda: f".{name} sizes its result from the data (a count read back)")
                out = dev.wrap(attr(*dev.unwrap(a, f".{name}"), **dev.unwrap(k, f".{name}")))
                dev.note(f".{name}", (self, a, k), out,
                         lambda: attr(*dev.unwrap(a, f".{name}"), **dev.unwrap(k, f".{name}")))
                return out
            return method
        return self.dev.wrap(attr)

    def __repr__(self):
        return f"DeviceArray({self.dev.kind}, shape={self.shape}, dtype={self.dtype})"

    def __copy__(self):
        return DeviceArray(self.raw.copy(), self.dev)

    def __deepcopy__(self, memo):
        return self.__copy__()


def to_host(v):
    """v with every DeviceArray read back (dicts, lists, tuples walked); other values as they are."""
    return _tree(v, lambda a: a.dev.get(a) if isinstance(a, DeviceArray) else a)


def _walk(v, path, out, seen):
    """(path, owner, key, value) of every attribute / item under v that is an int, a DeviceArray or a Rows."""
    if id(v) in seen:
        return
    seen.add(id(v))
    if isinstance(v, (list, tuple)):
        items = enumerate(v)
    elif isinstance(v, dict):
        items = v.items()
    elif hasattr(v, "__dict__") and not isinstance(v, (type, np.ndarray, DeviceArray)):
        items = vars(v).items()
    else:
        return
    for k, e in list(items):
        p = f"{path}.{k}"
        if isinstance(e, (bool, np.bool_)):
            continue
        if isinstance(e, (int, np.integer)) or isinstance(e, DeviceArray):
            out.append((p, v, k, e))
        elif isinstance(e, Rows):
            out.append((p, v, k, e))
            _walk(e, p, out, seen)
        else:
            _walk(e, p, out, seen)


def state_leaves(state) -> dict:
    """path -> (owner, key, value) of the state's ints, device arrays and Rows (tuples' items are not settable and
    are reported for reading only)."""
    out = []
    _walk(state, "state", out, set())
    return {p: (o, k, v) for p, o, k, v in out}
