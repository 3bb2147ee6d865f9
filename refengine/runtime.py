"""How a forward pass is executed: arithmetic mode, kernel backend, and an optional trace.

Every weight multiply in the model goes through `Runtime.matmul` and every routed-expert evaluation
through `Runtime.moe_ffn`, so switching the backend or the mode never touches the model math.

A backend is a module with the NumPy oracle's signatures:

    matmul(x, w, *, mode="exact")          x [T, I] float32, w QTensor [O, I] -> [T, O]
    moe_ffn(x, ids, weights, **kw)         optional; default: the loop oracle in refengine.moe

    numpy  -> quant.ref   (the reference)
    cpu    -> quant.cpu   (Numba kernels)
    cuda   -> quant.cuda  (numba-cuda kernels)

Teacher forcing (`force_inputs`, refengine.flips): name -> llama.cpp's value of a traced tensor. When the
forward records a tensor under a forced name, every matmul that then takes that tensor (the array itself,
one head of it [H, T, I] -> [T, I], or its transpose's head) takes llama.cpp's value instead, before the
activation rounding: the rounding then sees llama.cpp's bits. `NAME#k` forces the k-th recording (from 0) of
a name llama.cpp reuses (deepseek2's normed q_a is the 2nd `q`); `NAME` is `NAME#0`. A routed-expert slot
tensor (`ffn_moe_swiglu-IL`, `ffn_moe_situ-IL`: the down projection's input [T, A, I]) is matched to our slots
by expert id, with llama.cpp's `ffn_moe_topk-IL` given in the same dict; token slots whose expert llama.cpp
did not pick keep our value. A GGUF weight name as key forces that weight's input (one llama.cpp leaves
unnamed, found in its trace by refengine.flips). `forced_hits` counts, per key, the matmuls that took it.
"""
from __future__ import annotations


import copy
import importlib
import warnings
from dataclasses import dataclass

import numpy as np

import quant
from quant import QTensor

from .errors import ConfigError, NonFiniteError
from .trace import Trace

MODES = ("exact", "llamacpp")
NONFINITE_WHY = {"weight": "the tensor holds non-finite values",
                 "routed": "an expert that tokens were routed to holds non-finite values"}
BACKENDS = {"numpy": "quant.ref", "cpu": "quant.cpu", "cuda": "quant.cuda"}


class _StackLabel(str):
    """The NaN/inf label of a product by a `quant.QStack` (several weights, one launch): names every part, and
    `culprit()` the part whose values hold NaN/inf (read on the host, only once a flag said so)."""
    parts: tuple = ()

    @staticmethod
    def of(w) -> "_StackLabel":
        names = [repr(p.name) for p in w.parts]
        lb = _StackLabel(f"weight {', '.join(names[:-1])} or {names[-1]} ({w.type.name}, one product)")
        lb.parts = w.parts
        return lb

    def culprit(self) -> str:
        for p in self.parts:
            if not np.isfinite(quant.dequantize(p)).all():
                return f"weight {p.name!r} ({p.type.name})"
        return str(self)              # every part finite: the sum overflowed; which one made it is not known


def _stack_groups(ws) -> list[list[int]]:
    """The indices of ws grouped by (type, width) in first-seen order: the 2-D QTensors a `quant.QStack` can hold
    together; anything else alone."""
    groups: dict = {}
    for i, w in enumerate(ws):
        key = (w.type, w.shape[-1]) if isinstance(w, QTensor) and w.ndim == 2 else ("alone", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _weight_label(w) -> str:
    return _StackLabel.of(w) if isinstance(w, quant.QStack) else f"weight {w.name!r} ({w.type.name})"


def load_backend(name: str):
    if name not in BACKENDS:
        raise ConfigError(f"backend {name!r} is not available; choose one of {', '.join(BACKENDS)}")
    try:
        mod = importlib.import_module(BACKENDS[name])
    except ImportError as e:
        raise ConfigError(f"backend {name!r} cannot be loaded: {e}") from None
    check = getattr(mod, "check_available", None)          # e.g. cuda: is there a GPU?
    if check is not None:
        try:
            check()
        except RuntimeError as e:
            raise ConfigError(f"backend {name!r}: {e}") from None
    return mod


@dataclass
class Runtime:
    mode: str = "exact"       # "exact": f32 math on dequantized weights; "llamacpp": activations rounded
                              # to the weight's partner type first, as ggml-cpu does (quant.llamacpp)
    backend: str = "numpy"    # see BACKENDS
    trace: Trace | None = None
    check_finite: bool = True
    attn_form: str | None = None   # the form of a fresh state's attention where an arch has two (MLA:
                                   # "absorbed", llama.cpp's and the default, or "naive"; see Model.new_state)
    force_inputs: dict | None = None   # teacher forcing: llama.cpp name -> llama.cpp's value (module docstring)
    qsa_rule: str = "authors"  # QSA's selection (attention/qsa.py RULES): "authors" (whole top blocks plus the
                               # query's unfinished block, the default) or "llamacpp" (the top budget + r - 1 cells)
    resident: bool | None = None   # activations and per-layer state kept on a device (refengine.devarray): the same
                               # block code on DeviceArrays. None: on for the cuda backend on a GPU with CuPy (without
                               # CuPy, or in numba's simulator: op by op, warned), off otherwise; True on a host
                               # backend: the "sim" device (NumPy standing in, tests)
    kernel_policy: object = None   # cuda: a quant.cuda.policy.KernelPolicy every product of this runtime runs under
                               # (which kernel, which launch shape); None: the measured defaults
    expert_budget: object = None   # issue 24, resident runs only: routed experts through a GPU expert cache of this
                               # many bytes (refengine.expert_cache): an ExpertCache (ExpertCache.for_model: a
                               # fraction, a policy), or bytes / "8GiB" (slots sized at the first MoE layer)
    expert_stats: object = None    # a refengine.expert_trace.ExpertTrace: every moe_ffn call's (layer, expert ids)
    fixed_shapes: bool = False     # keep every op's shape the same from one decode token to the next where the
                               # modules allow it (attention under a causal mask over its cache's capacity, the unused
                               # rows zero: cache.Rows), as a decode step captured once and replayed needs (a CUDA
                               # graph, docs/device_path.md). The numbers are the same up to float summation order
                               # (BLAS sums a product of another shape in another order: tests/test_capture.py)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not available; choose one of {', '.join(MODES)}")
        from .attention.qsa import RULES
        if self.qsa_rule not in RULES:
            raise ConfigError(f"QSA rule {self.qsa_rule!r} is not available; choose one of {', '.join(RULES)}")
        self._be = load_backend(self.backend)
        if self.kernel_policy is not None:
            if self.backend != "cuda":
                raise ConfigError(f"a kernel policy chooses among the cuda kernels; backend {self.backend!r} has none")
            self._be = _UnderPolicy(self._be, self.kernel_policy)
        if self.resident is None:
            self.resident = self.backend == "cuda" and _cupy_gpu()
        if self.fixed_shapes and self.trace is not None:
            raise ConfigError("fixed_shapes attends over a cache's capacity; a trace records llama.cpp's shapes (the "
                              "positions so far): use one or the other")
        if self.resident and self.force_inputs:
            raise ConfigError("teacher forcing (force_inputs) runs on the host: use resident=False")
        self.device = None
        if self.resident:
            from .devarray import Device
            try:
                self.device = Device("cupy" if self.backend == "cuda" else "sim")
            except ImportError as e:
                raise ConfigError(f"backend {self.backend!r}: the device-resident forward needs CuPy ({e}); "
                                  f"pip install refengine[cuda], or pass resident=False") from None
        if self.fixed_shapes and self.device is not None and self.device.kind == "cupy":
            self.device.products = "kernel"             # capturable products (refengine/ops/products.py)
        if self.device is not None and not getattr(self.kernel_policy, "fused_ops", True):
            self.device.fused = None                    # the small ops as NumPy states them, op by op
        if self.device is not None and getattr(self.kernel_policy, "fused_off", ()):
            self.device.fused_off = _fused_entries(self.kernel_policy.fused_off)
        if self.device is not None and getattr(self.kernel_policy, "gathered_prefill", None) is not None:
            self.device.gathered_prefill = self.kernel_policy.gathered_prefill     # (refengine/cuda/fused.py)
        if self.device is not None and getattr(self.kernel_policy, "prefill_attention", None) is not None:
            self.device.prefill_attention = self.kernel_policy.prefill_attention   # (refengine/cuda/fused.py)
        self._expert_box = [None]                       # the expert cache, shared with untraced() copies
        if self.expert_budget is not None:
            if not self.resident:
                raise ConfigError("an expert budget needs the device-resident forward (the cuda backend, or "
                                  "resident=True for the sim device)")
            from .expert_cache import ExpertCache
            if isinstance(self.expert_budget, ExpertCache):
                self._expert_box[0] = self.expert_budget
        self._finite: list = []                         # resident: (weight label, its flags' row, x kept or None)
        self._finite_warn: list = []                    # resident: (warning, its flags' row) (the logits)
        self._pages: list = []                          # resident: this forward's flag pages [PAGE_ROWS, 2] (_flag_row)
        self._page_n = 0                                # rows of them taken
        self.page_stock: list | None = None             # pages made ahead (GraphDecoder.greedy): taken, not made
        self.flag_rows = 0                              # rows the last packed forward took (pack_deferred)
        self._flag_queue: list = []                     # resident on a GPU: flags not yet written (_write_flag)
        self._prefetched: dict = {}                     # id(w) -> (x, w, x @ w.T) made ahead (`prefetch`)
        self.lazy_inputs = False                        # a captured step: products' input flags computed on demand
        self._float_matrices: dict[str, np.ndarray] = {}   # resident on a GPU: small float matrices (_float_matrix)
        self._seen: dict[str, int] = {}                 # name -> times recorded (teacher forcing's `#k`)
        self._forced: list[tuple[str, np.ndarray, np.ndarray]] = []   # (label, ours, llama.cpp's as ours' shape)
        self.forced_hits: dict[str, int] = {}

    def _forced_input(self, x: np.ndarray) -> np.ndarray:
        """llama.cpp's value of x when x is (a head of) a forced tensor, else x."""
        for label, ours, ref in reversed(self._forced):
            cands = []
            if ours.size == x.size:
                cands.append((ours.reshape(x.shape), ref.reshape(x.shape)))
                if ours.ndim == 3 and x.ndim == 2 and ours.shape[1] == x.shape[0]:   # [H, T, I] heads side by side
                    cands.append((ours.transpose(1, 0, 2).reshape(x.shape), ref.transpose(1, 0, 2).reshape(x.shape)))
            elif ours.ndim == 3 and x.ndim == 2 and ours.shape[1:] == x.shape:        # one head [H, T, I] -> [T, I]
                cands += [(ours[k], ref[k]) for k in range(ours.shape[0])]
            elif ours.ndim == 3 and x.ndim == 2 and (ours.shape[0], ours.shape[2]) == x.shape:   # [T, H, I], head k
                cands += [(ours[:, k], ref[:, k]) for k in range(ours.shape[1])]
            elif x.ndim == 2 and ours.shape[0] == x.shape[0] and ours.size % x.size == 0 and ours.size > x.size:
                o2, r2, n = ours.reshape(x.shape[0], -1), ref.reshape(x.shape[0], -1), x.shape[1]
                cands += [(o2[:, k * n:(k + 1) * n], r2[:, k * n:(k + 1) * n])          # [T, G*I], group k
                          for k in range(o2.shape[1] // n)]
            for o, r in cands:
                if np.array_equal(o, x):
                    self.forced_hits[label] = self.forced_hits.get(label, 0) + 1
                    return np.ascontiguousarray(r, dtype=np.float32)
        return x

    def _forced_by_weight(self, x: np.ndarray, w: QTensor | None) -> np.ndarray:
        """llama.cpp's value of the input of weight w (a matmul's, or the routed experts' whole input) when it is
        forced by the weight's name (an input llama.cpp's graph names none), else x."""
        if w is None or w.name not in self.force_inputs:
            return x
        self.forced_hits[w.name] = self.forced_hits.get(w.name, 0) + 1
        return np.ascontiguousarray(np.reshape(self.force_inputs[w.name], x.shape), dtype=np.float32)

    # ------------------------------------------------------------ device residency
    def embed_rows(self, w: QTensor, tokens):
        """`ggml_get_rows(w, tokens)`: tokens [T] -> [T, cols] float32, on the device when the token ids are there
        (the sim device decodes on its buffers; a GPU with the rows kernel, quant/cuda/rows.py; a type it lacks reads
        the ids back, counted)."""
        from .devarray import DeviceArray
        if not isinstance(tokens, DeviceArray):
            return quant.dequantize_rows(w, tokens)
        dev = self.device
        if dev.kind == "sim":
            (th,) = self._host_args(tokens)
            y = self._from_host(quant.dequantize_rows(w, th))
            dev.note(f"get_rows {w.name}", tokens, y, lambda: quant.dequantize_rows(w, self._host_args(tokens)[0]))
            return y
        fn = getattr(self._be, "get_rows_resident", None)
        y = fn(w, tokens.raw) if fn is not None else None               # decoded on the device (quant/cuda/rows.py)
        if y is not None:
            y = dev.wrap(y)
            dev.note(f"get_rows {w.name}", tokens, y, lambda: fn(w, tokens.raw))
            return y
        return dev.put(quant.dequantize_rows(w, dev.get(tokens)))        # a type without a decoder: read back

    def warn_nonfinite(self, y, where: str) -> None:
        """A RuntimeWarning `where: ... NaN/inf` when y holds NaN or inf (the logits); a device array's flag is kept
        on the device and read with the deferred checks (`check_deferred`)."""
        if not self.check_finite:
            return
        from .devarray import DeviceArray
        if isinstance(y, DeviceArray):
            row = self._flag_row()
            self._write_flag(row, 0, y)
            self._finite_warn.append((where, row))
        elif not np.all(np.isfinite(y)):
            warnings.warn(where, RuntimeWarning, stacklevel=3)

    def to_device(self, x):
        """x on this runtime's device (a DeviceArray) when resident, else x."""
        return self.device.put_tree(x) if self.device is not None else x

    def to_host(self, x):
        """A DeviceArray read back (checking the deferred NaN/inf flags first), else x."""
        from .devarray import DeviceArray
        self.check_deferred()
        return self.device.get(x) if isinstance(x, DeviceArray) else x

    def check_deferred(self, packed=None, host_pages=None) -> None:
        """Resident runs check a product's output for NaN/inf on the device and read the flags back here, once per
        forward (one read): the first weight that produced NaN/inf from a finite input is named, as the host check
        does; then the warnings of `warn_nonfinite` (the logits). `packed`: flags `pack_deferred` gathered (a
        replayed graph's), read instead of the pending ones; an input kept without its flag (`lazy_inputs`) has it
        computed here, only for an output whose flag says NaN/inf. `host_pages`: the packed pages already read back
        (a graph decoder reads them with the logits, one wait for both)."""
        if packed is None:
            packed = self.pack_deferred()
            if packed is None:
                return
        labels, texts, pages, lazy, rows = packed
        flags = np.concatenate(host_pages if host_pages is not None else [self.device.get(pg) for pg in pages])[rows]
        if flags[:, 0].all():                # every output finite: nothing to name or warn of (42 flags walked one
            return                           # NumPy scalar at a time: 20.8 us; this: 0.9 us, the project machine)
        for label, (y_ok, x_ok), x in zip(labels, flags, lazy):
            if not y_ok and x is not None:
                x_ok = bool(self.device.get(self.device.wrap(self.device.xp.isfinite(x.raw).all())))
            if not y_ok and x_ok:
                named = label.culprit() if isinstance(label, _StackLabel) else label
                raise NonFiniteError(f"{named} produced NaN/inf from a finite input: {NONFINITE_WHY[label[:6]]}")
        for where, (y_ok, _) in zip(texts, flags[len(labels):]):
            if not y_ok:
                warnings.warn(where, RuntimeWarning, stacklevel=3)

    def pack_deferred(self):
        """The pending NaN/inf flags, the pending lists emptied -> (weight labels, warning texts, the flag pages (the
        last one's rows taken), lazy inputs, each label's and text's row) for `check_deferred(packed=)`, or None. A
        captured decode step ends with it: each replay rewrites the pages, read back a copy each; an eager forward's
        check packs its flags the same way after the step."""
        if self._flag_queue:
            self._flush_flags()
        checks, warns = self._finite, self._finite_warn
        if not checks and not warns:
            return None
        pages, n = self._pages, self._page_n
        self.flag_rows = n
        self.discard_deferred()
        last = n - (len(pages) - 1) * self.PAGE_ROWS
        views = [self.device.wrap(pg) for pg in pages[:-1]] + [self.device.wrap(pages[-1][:last])]
        return [lb for lb, _, _ in checks], [w for w, _ in warns], views, [x for _, _, x in checks], \
            [r for _, r, _ in checks] + [r for _, r in warns]

    def discard_deferred(self) -> None:
        """Forget the pending NaN/inf flags (a capture that failed: its launches never ran)."""
        self._finite, self._finite_warn, self._pages, self._page_n = [], [], [], 0
        self._flag_queue.clear()

    def _host_args(self, *a):
        """Host views of (possibly device) arrays: the sim device's own buffers, a GPU's read back."""
        from .devarray import DeviceArray
        return [(v.raw if v.dev.kind == "sim" else v.dev.get(v)) if isinstance(v, DeviceArray) else v for v in a]

    def _from_host(self, y):
        """A host result of a resident call, as a DeviceArray (the sim device's: the array itself, not counted)."""
        from .devarray import DeviceArray
        return DeviceArray(y, self.device) if self.device.kind == "sim" else self.device.put(y)

    def _matmul_resident(self, x, w: QTensor):
        dev = self.device
        y = None
        if dev.kind == "cupy":
            y = self._be.matmul_resident(x.raw, w, mode=self.mode)          # None: no device kernel for this type
            y = None if y is None else dev.wrap(y)
            kernels = y is not None
        else:
            kernels = self._kernels_serve(w)              # the sim device: what a GPU's kernels would take
        if not kernels and (wf := self._float_matrix(w)) is not None:
            y = x @ wf.T                                  # a small float matrix whose rows the kernels do not take:
            self._defer_finite(_weight_label(w), y, x)    # the device's own product (capturable)
            return y
        if not kernels:
            key = f"matmul {w.type.name}"
            dev.stats.fallbacks[key] = dev.stats.fallbacks.get(key, 0) + 1
            dev._sync(lambda: f"matmul {w.name} ({w.type.name} {list(w.shape)}): the GPU kernels do not take it, a "
                              f"GPU reads its input back (a host fallback)")
        if y is None:
            (xh,) = self._host_args(x)
            y = self._from_host(self._host_matmul(xh, w))
            redo = lambda: self._host_matmul(self._host_args(x)[0], w)                    # noqa: E731
        else:
            redo = lambda: self._be.matmul_resident(x.raw, w, mode=self.mode)             # noqa: E731
        dev.note(f"matmul {w.name}", x, y, redo)
        self._defer_finite(_weight_label(w), y, x)
        return y

    def _host_matmul(self, xh, w):
        """The host's product (the sim device's, or a fallback's): a QStack's parts one by one, side by side (each
        row's sums are the kernels' whichever rows share the launch)."""
        if isinstance(w, quant.QStack):
            return np.concatenate([self._be.matmul(xh, p, mode=self.mode) for p in w.parts], axis=1)
        return self._be.matmul(xh, w, mode=self.mode)

    def matmul_many(self, x, ws, strided: bool = False) -> list:
        """[x @ w.T for w in ws]: several weights multiplying one input (q, k and v; a FFN's up and gate). Resident,
        the weights of one type and width that the device's kernels take are one product by their `quant.QStack`,
        its output split into column views (a token's: C-contiguous rows, which every kernel takes on its short
        launch path; more tokens' copied out, a strided view being some kernels' decline, unless `strided`: the
        caller's consumers read strided rows, and it makes C-contiguous what else it passes on): one product and
        one NaN/inf flag (naming the part at fault) a group. Each row's sums are the separate products' (the
        kernels' rows are independent: the same numbers; on the cpu / numpy backends nothing changes). The others
        by `matmul`, one each (all of them so under `KernelPolicy(stacked_products=False)`)."""
        from .devarray import DeviceArray
        if self._prefetched:                              # products a `prefetch` made ahead: taken, the rest made
            got = [self._prefetched.pop(id(w), None) for w in ws]
            got = [g[2] if g is not None and g[0] is x and g[1] is w else None for g, w in zip(got, ws)]
            if any(g is not None for g in got):
                made = iter(self.matmul_many(x, [w for g, w in zip(got, ws) if g is None], strided))
                return [g if g is not None else next(made) for g in got]
        if len(ws) < 2 or self.device is None or self._forced or self.mode != "exact" \
                or not isinstance(x, DeviceArray) or not getattr(self.kernel_policy, "stacked_products", True):
            return [self.matmul(x, w) for w in ws]
        out = [None] * len(ws)
        for group in _stack_groups(ws):                   # one product per (type, width) among them
            st = quant.QStack(tuple(ws[i] for i in group)) if len(group) > 1 else None
            if st is None or not self._kernels_serve(st):
                for i in group:
                    out[i] = self.matmul(x, ws[i])
                continue
            y = self._matmul_resident(x, st)
            for i, (a, b) in zip(group, st.bounds()):
                self._router_hook(x, ws[i])
                out[i] = y[:, a:b] if x.shape[0] == 1 or strided else y[:, a:b].copy()     # (C order)
        return out

    def _kernels_serve(self, w: QTensor, heads: bool = False) -> bool:
        """Whether a GPU's kernels would multiply by w on the device: the sim device's model of the cupy branch above
        (heads: of `matmul_heads_resident`, a 3-D weight's heads in one launch), so that strict() on the sim names a
        fallback a capture on the GPU would meet. True when numba-cuda is not installed (nothing to ask)."""
        try:
            from quant.cuda.resident import serves_heads, serves_matmul
        except Exception:                                 # noqa: BLE001  (no numba-cuda: cannot tell)
            return True
        return (serves_heads if heads else serves_matmul)(w, self.mode)

    FLOAT_MATRIX_MAX = 64 << 20          # bytes of float32: larger float matrices keep the host fallback

    def _float_matrix(self, w: QTensor):
        """A float (F32 / F16 / BF16) matrix the device kernels refuse (rows not whole 32-value chunks: qwen4exp's
        tiny hc_*_up [P*D, 16]), as a read-only float32 host array made once (exact: these types widen without
        rounding) that the device uploads at its first use like any weight; None for other types, 3-D tensors, the
        llamacpp mode (activations rounded to the weight's type first) or one larger than FLOAT_MATRIX_MAX."""
        if w.type.name not in ("F32", "F16", "BF16") or len(w.shape) != 2 or self.mode != "exact" \
                or 4 * w.shape[0] * w.shape[1] > self.FLOAT_MATRIX_MAX:
            return None
        cache = self._float_matrices
        wf = cache.get(w.name)
        if wf is None:
            wf = np.array(quant.dequantize(w), dtype=np.float32).reshape(w.shape).copy()   # owns its bytes: no
            wf.flags.writeable = False                    # writeable base, so the device caches its upload (_upload)
            cache[w.name] = wf
        return wf

    PAGE_ROWS = 512          # NaN/inf flags of a forward's products: rows of one device array (more: another)
    FLAG_QUEUE_BYTES = 1 << 26   # the arrays waiting for their flags hold at most this much memory (a long prefill's
    #                              products are large: their batch is written sooner than FLAG_BATCH arrays)

    def _flag_row(self) -> int:
        """The next row of this forward's flag pages (y finite, x finite): a page [PAGE_ROWS, 2] of True is made on
        the device at the first flag and when one fills; the flags are written into it on the device (on a GPU in
        batches, `refengine/cuda/fused.py` all_finite_many: _write_flag) and read back in one copy a page
        (check_deferred)."""
        if self._page_n == len(self._pages) * self.PAGE_ROWS:
            dev = self.device
            if self.page_stock:                           # made ahead, outside a graph: no replay refills it, so a
                page = self.page_stock.pop(0)             # run of replays ANDs every step's flags into it
            else:
                make = lambda: dev.xp.ones((self.PAGE_ROWS, 2), dtype=bool)      # noqa: E731
                page = make()
                if dev._tapes:                            # a sim graph fills it again at every replay
                    dev.tape("flags page", make, [page], [])
            self._pages.append(page)
        self._page_n += 1
        return self._page_n - 1

    def _write_flag(self, row: int, col: int, a) -> None:
        """pages[row, col] = all of the device array a is finite, written on the device. On a GPU the flag waits in a
        queue and `fused.FLAG_BATCH` of them are written by one launch (`fused.all_finite_many`;
        KernelPolicy.flag_batch = 1: a launch each), or sooner when the queue holds FLAG_QUEUE_BYTES. A queued array
        is held until its flag is written (no other op gets its memory) and nothing writes into it meanwhile (the
        modules make new arrays; tests/test_flag_batch.py compares each array when its flag is written with its copy
        when it was queued, every arch)."""
        page = self._pages[row // self.PAGE_ROWS]
        r = row % self.PAGE_ROWS
        fused = self.device.fused
        if fused is not None:
            q = self._flag_queue
            q.append((a, page, 2 * r + col))
            if len(q) >= self._flag_batch(fused) or sum(e[0].raw.nbytes for e in q) >= self.FLAG_QUEUE_BYTES:
                self._flush_flags()
            return
        self._numpy_flag(page, r, col, a)

    def _flag_batch(self, fused) -> int:
        return max(1, min(fused.FLAG_BATCH, getattr(self.kernel_policy, "flag_batch", None) or fused.FLAG_BATCH))

    def _flush_flags(self) -> None:
        """Write the queued flags: one launch per batch of one page's arrays, the arrays the kernel does not take
        (not float32, not contiguous) by the NumPy path."""
        q = list(self._flag_queue)
        self._flag_queue.clear()                          # (in place: an untraced() copy shares the queue)
        fused = self.device.fused
        n = self._flag_batch(fused)
        batches = [[]]
        for e in q:                                       # in order, a batch ending at n arrays or a new page
            if batches[-1] and (len(batches[-1]) == n or e[1] is not batches[-1][0][1]):
                batches.append([])
            batches[-1].append(e)
        for group in batches:
            if not group:
                continue
            page = group[0][1]
            taken = fused.all_finite_many([a for a, _, _ in group], page, [c for _, _, c in group])
            for (a, _, cell), t in zip(group, taken):
                if not t:
                    self._numpy_flag(page, cell // 2, cell % 2, a)

    def _numpy_flag(self, page, r: int, col: int, a) -> None:
        dev = self.device
        xp = dev.xp
        cell = page[r:r + 1, col:col + 1]
        # ANDed into the cell, as the GPU's kernel writes False only: a page says what every write since its fill said
        flag = lambda: cell & xp.isfinite(a.raw).all().reshape(1, 1)            # noqa: E731
        cell[...] = flag()
        if dev._tapes:
            dev.tape("finite flag", flag, [cell], [])

    def _defer_finite(self, label: str, y, x) -> None:
        """Resident: y's and x's all-finite flags kept on the device (a row of the flag pages), read back once per
        forward (check_deferred). Inside a captured step (`lazy_inputs`, set by the graph driver) only y's flag is
        computed: x is kept and its flag computed after the replay when y's says NaN/inf (a launch a product fewer
        in the graph; x's buffer is the graph's own, alive while the graph is)."""
        if self.check_finite:
            row = self._flag_row()
            self._write_flag(row, 0, y)
            if self.lazy_inputs:
                self._finite.append((label, row, x))
                return
            self._write_flag(row, 1, x)
            self._finite.append((label, row, None))

    def matmul_heads(self, x, w: QTensor):
        """Per-head products, ggml_mul_mat of a 3-D weight: x [H, T, I], w [H, O, I] -> [H, T, O] (on a GPU one
        grouped launch with the heads as experts, else one product per head)."""
        from .devarray import DeviceArray
        if isinstance(x, DeviceArray):
            fn = getattr(self._be, "matmul_heads_resident", None)
            if x.dev.kind == "cupy" and fn is not None and not self._forced:
                y = fn(x.raw, w, mode=self.mode)
                if y is not None:
                    y = x.dev.wrap(y)
                    self._defer_finite(_weight_label(w), y, x)
                    return y
            if x.dev.kind == "sim" and not self._forced and self._kernels_serve(w, heads=True):
                return self._heads_sim(x, w)              # a GPU's one launch: one product, one NaN/inf flag
            return np.stack([self.matmul(x[h], w[h]) for h in range(x.shape[0])])
        return np.stack([self.matmul(np.ascontiguousarray(x[h]), w[h]) for h in range(x.shape[0])])

    def _heads_sim(self, x, w: QTensor):
        def host():
            (xh,) = self._host_args(x)
            return np.stack([self._be.matmul(np.ascontiguousarray(xh[h]), w[h], mode=self.mode)
                             for h in range(xh.shape[0])])
        y = self._from_host(host())
        x.dev.note(f"matmul_heads {w.name}", x, y, host)
        self._defer_finite(_weight_label(w), y, x)
        return y

    def prefetch(self, x, ws) -> None:
        """Make x's products by ws now, as `matmul_many` does (one launch a type on a device), for the `matmul(x, w)`
        calls that follow to take, each once: a sub-block whose projections of one input are spread over functions
        (MLA's q and kv latents, a sparse indexer's keys and weights) says so once at its start, and its functions
        stay as they read. Only resident (elsewhere each product is made where it is asked: the same numbers). A
        prefetch whose products are all made already (an outer one named them) keeps them; else the products not
        taken are dropped."""
        from .devarray import DeviceArray
        ws = [w for w in ws if w is not None]
        memo = self._prefetched
        if ws and all(id(w) in memo and memo[id(w)][0] is x for w in ws):
            return
        memo.clear()
        if self.device is None or not isinstance(x, DeviceArray) \
                or not getattr(self.kernel_policy, "stacked_products", True):
            return
        if len(ws) > 1:
            self._prefetched.update({id(w): (x, w, y) for w, y in zip(ws, self.matmul_many(x, ws))})

    def matmul(self, x: np.ndarray, w: QTensor) -> np.ndarray:
        """x: [T, I], w: [O, I] -> [T, O]. Raises NonFiniteError naming the weight if it produced NaN/inf."""
        if self.device is not None:
            from .devarray import DeviceArray
            if self._prefetched:
                got = self._prefetched.pop(id(w), None)
                if got is not None and got[0] is x and got[1] is w:
                    return got[2]
            if isinstance(x, DeviceArray):
                y = self._matmul_resident(x, w)
                self._router_hook(x, w)
                return y
        if self._forced:
            x = self._forced_input(x)
        if self.force_inputs:
            x = self._forced_by_weight(x, w)
        y = self._be.matmul(x, w, mode=self.mode)
        if self.check_finite and not np.all(np.isfinite(y)) and np.all(np.isfinite(x)):
            raise NonFiniteError(f"weight {w.name!r} ({w.type.name}) produced NaN/inf from a finite input: "
                                 f"{NONFINITE_WHY['weight']}")
        self._router_hook(x, w)
        return y

    def _router_hook(self, x, w: QTensor) -> None:
        """An expert cache with a prefetcher (refengine/expert_prefetch.py) sees every MoE router's input: it guesses
        the next MoE layer's experts from it. The concept modules need not know."""
        cache = self._expert_box[0]
        if cache is not None and cache.prefetcher is not None:
            il = cache.prefetcher.sources.get(w.name)
            if il is not None:
                cache.prefetcher.on_router_input(il, x, self)

    def side_product(self, x, w: QTensor) -> np.ndarray:
        """x [T, I] @ w [O, I].T -> [T, O] on the host, computed on this runtime's backend outside the model's
        computation: no trace, teacher forcing, NaN check or router hook (the expert prefetcher's speculative
        routing). A device x stays there: the product runs on the device and its result is read back (counted)."""
        from .devarray import DeviceArray
        if isinstance(x, DeviceArray):
            dev = x.dev
            y = self._be.matmul_resident(x.raw, w, mode=self.mode) if dev.kind == "cupy" else None
            if y is None:
                (xh,) = self._host_args(x)
                y = self._from_host(self._be.matmul(xh, w, mode=self.mode))
            else:
                y = dev.wrap(y)
            dev.note(f"matmul {w.name}", x, y)
            return dev.get(y)
        return self._be.matmul(x, w, mode=self.mode)

    def moe_ffn(self, x, ids, weights, record=None, slots: bool = False, **kw) -> np.ndarray:
        """Routed experts: x [T, D], ids/weights [T, A] -> [T, D] (see refengine.moe.experts).
        `record`: a caller's recorder in place of `self.record` (it must pass the tensors on to it). slots: -> [T, A',
        D] whose sum over A' in order is that output (`ops.slot_sum`): on a GPU the A weighted slots, unsummed (the
        next norm sums them in its launch, `ops.add_slots_rms_norm`), elsewhere the output as one slot (A' = 1)."""
        rec = record or self.record
        if self.expert_stats is not None:
            self.expert_stats.add(kw.get("il", -1), self._host_args(ids)[0], kw["up"].shape[0])
        if self.device is not None:
            from .devarray import DeviceArray
            if any(isinstance(v, DeviceArray) for v in (x, ids, weights)):
                y = self._moe_ffn_resident(x, ids, weights, rec, kw, slots)
                return y if len(y.shape) == 3 or not slots else y.reshape(y.shape[0], 1, y.shape[1])
        y = self._moe_ffn_host(x, ids, weights, rec, kw)
        return y.reshape(y.shape[0], 1, y.shape[1]) if slots else y

    def _moe_ffn_resident(self, x, ids, weights, rec, kw, slots: bool = False):
        """Routed experts on device arrays. The expert ids stay on the device where its kernels group the pairs
        there: one token (the one-token kernels read its A ids; a gated activation other than SwiGLU runs between
        the projections as the module's function on device arrays), or several (a prefill, eager or a fixed-shape
        ubatch: the group tables built by a kernel on the device, the kernel chosen by the average pairs a group and
        T as the bound, which at a prefill's sizes is the choice the real sizes give), no expert cache, no trace;
        otherwise they are read back (counted) and the grouping tables built on the host (`groups_from_ids`). A
        read-back in an eager prefill stops the host until the GPU has drained: a host-bound prefill pays it per MoE
        layer (`benchmarks/host_syncs.py`). The sim device's kernel is the host code on the device's buffers
        (reading the ids there, as a kernel does)."""
        from .devarray import DeviceArray
        dev = self.device
        fn = getattr(self._be, "moe_ffn_resident", None)
        y = None
        cache = self._expert_cache(kw)
        ids_stay = isinstance(ids, DeviceArray) and cache is None and self.trace is None
        names = ", ".join(repr(kw[k].name) for k in ("gate", "up", "down") if kw.get(k) is not None)
        if dev.kind == "cupy" and fn is not None and self.trace is None:
            x = self.to_device(x)
            act = kw.get("act")
            act_device = None if act is None else (
                lambda g, u: dev.put(act[0](dev.wrap(g), dev.wrap(u))).raw)   # the readable activation, on the device
            y = fn(x.raw, ids.raw if ids_stay else dev.get(ids), dev.put(weights).raw, mode=self.mode,
                   act_device=act_device, cache=cache, read_ids=lambda a: dev.get(dev.wrap(a)), slots=slots, **kw)
            if y is None:
                dev.stats.fallbacks["moe_ffn"] = dev.stats.fallbacks.get("moe_ffn", 0) + 1
        if y is not None:
            y = dev.wrap(y)
            dev.note(f"moe_ffn {names}", (x, ids, weights), y)
            self._defer_finite(f"routed experts ({names})", y, x)
            return y
        if dev.kind == "sim" and cache is None:
            if not ids_stay or not _gpu_keeps_ids(kw, ids.shape[0]):
                ids = dev.get(ids)                        # the grouping tables are built on the host: a read-back
            xh, idh, wh = self._host_args(x, ids, weights)
            y = self._from_host(self._moe_ffn_host(xh, idh, wh, rec, kw))
            dev.note(f"moe_ffn {names}", (x, ids, weights), y,
                     lambda: self._moe_ffn_host(*self._host_args(x, ids, weights), rec, kw))
            return y
        xh, idh, wh = self._host_args(x, ids, weights)
        if cache is not None and dev.kind == "sim":       # the sim device's slot pool (NumPy), the host path on it
            from quant.cuda.expert_slots import cached_experts
            idh, kw = cached_experts(cache, np.asarray(idh), kw, host=True)
            try:
                return self._from_host(self._moe_ffn_host(xh, idh, wh, rec, kw))
            finally:
                cache.release()
        if cache is not None:                             # the GPU's host API (a traced run) on the slot pool
            kw = dict(kw, cache=cache)
        return self._from_host(self._moe_ffn_host(xh, idh, wh, rec, kw))

    @property
    def expert_cache(self):
        """The ExpertCache of a run with an expert budget (None before the first MoE layer of a byte budget)."""
        return self._expert_box[0]

    def _expert_cache(self, kw):
        """The expert cache of a resident run with an expert budget (made at the first MoE layer), else None."""
        if self.expert_budget is not None and self._expert_box[0] is None:
            from .expert_cache import ExpertCache
            tensors = {r: kw.get(r) for r in ("gate", "up", "down")}
            self._expert_box[0] = ExpertCache.for_tensors(self.expert_budget, tensors)
        return self._expert_box[0]

    def _moe_ffn_host(self, x, ids, weights, rec, kw):
        fn = getattr(self._be, "moe_ffn", None)
        if self.force_inputs:
            from .moe import moe_ffn as fn
            if self._forced:
                x = self._forced_input(x)
            x = self._forced_by_weight(x, kw.get("gate") if kw.get("gate") is not None else kw.get("up"))
            return fn(x, ids, weights, matmul=self._expert_matmul(ids, kw), record=rec, **kw)
        if fn is None or (kw.get("act") is not None and not getattr(self._be, "MOE_GATED_ACTS", False)):
            # another activation than SwiGLU on a backend without it (cpu): the loop oracle, its matmuls
            # still through this backend (the cuda backend takes `act`: grouped dispatch, activation on the host)
            from .moe import moe_ffn as fn
            return fn(x, ids, weights, matmul=self.matmul, record=rec, **kw)
        y = fn(x, ids, weights, mode=self.mode, record=rec if self.trace is not None else None, **kw)
        if self.check_finite and not np.all(np.isfinite(y)) and np.all(np.isfinite(x)):
            names = ", ".join(repr(kw[k].name) for k in ("gate", "up", "down") if kw.get(k) is not None)
            raise NonFiniteError(f"routed experts ({names}) produced NaN/inf from a finite input: "
                                 f"{NONFINITE_WHY['routed']}")
        return y

    def _expert_matmul(self, ids: np.ndarray, kw: dict):
        """The loop oracle's matmul with the down projection's input forced to llama.cpp's slot tensor, when
        it is forced: expert e's rows are those of `np.nonzero(ids == e)`, as the loop takes them."""
        il, down = kw.get("il", -1), kw.get("down")
        act = kw["act"][1] if kw.get("act") is not None else ("ffn_moe_swiglu" if kw.get("gate") is not None
                                                              else "ffn_moe_silu")
        label = f"{act}-{il}"
        ref = (self.force_inputs or {}).get(label)
        ref_ids = (self.force_inputs or {}).get(f"ffn_moe_topk-{il}")
        if ref is None or ref_ids is None or down is None:
            return self.matmul
        T, A = ids.shape
        ref_ids = np.asarray(ref_ids).reshape(T, A)
        ref = np.asarray(ref, np.float32).reshape(T, A, -1)
        names = {f"{down.name}[{e}]": int(e) for e in np.unique(ids)}

        def mm(x, w):
            e = names.get(w.name)
            if e is None:
                return self.matmul(x, w)
            tok, _ = np.nonzero(ids == e)
            x = np.array(x, dtype=np.float32, copy=True)
            for i, t in enumerate(tok):
                a = np.flatnonzero(ref_ids[t] == e)
                if a.size:
                    x[i] = ref[t, a[0]]
            self.forced_hits[label] = self.forced_hits.get(label, 0) + 1
            return self.matmul(x, w)
        return mm

    def untraced(self) -> Runtime:
        """This runtime without its trace and teacher forcing (same mode, backend and device): the later
        ubatches of a traced forward call (Model.forward)."""
        rt = copy.copy(self)
        rt.trace, rt.force_inputs = None, None
        rt._seen, rt._forced, rt.forced_hits = {}, [], {}
        return rt

    def keeps(self, name: str, il: int) -> bool:
        """Whether a tensor recorded under `name` (layer il) is kept by the trace: an op with a cheaper form that
        never builds the tensor (blocked attention's [H, T, S] scores) runs it when nothing keeps them."""
        return self.trace is not None and self.trace.wants(name, il)

    def reads(self, name: str, il: int) -> bool:
        """Whether anything reads a tensor recorded under `name`: the trace keeps it, or teacher forcing checks the
        forward's tensors (`force_inputs`). A fused step that never makes the tensor (the conv's sum before its silu)
        runs only when nothing reads it."""
        return self.keeps(name, il) or bool(self.force_inputs)

    def record(self, name: str, il: int, value) -> None:
        """A named intermediate for the trace (compare, golden) and teacher forcing. `value` may be a callable of no
        arguments making it: called only when something reads it (a tensor llama.cpp names that the forward itself
        does not need, whose making would cost a device launch a step)."""
        if callable(value):
            if self.trace is None and not self.force_inputs:
                return
            value = value()
        if self.trace is not None:
            self.trace(name, il, value)
        if self.force_inputs:
            key = name if il < 0 else f"{name}-{il}"
            k = self._seen.get(key, 0)
            self._seen[key] = k + 1
            label = f"{key}#{k}"
            if label not in self.force_inputs:
                label = key if k == 0 else label
            ref = self.force_inputs.get(label)
            if ref is not None and name != "ffn_moe_topk" and not (name.startswith("ffn_moe_") and np.ndim(value) == 3):
                # (slot tensors are forced by moe_ffn; llama.cpp's expert ids only come with them)
                value = np.asarray(value)
                if np.size(ref) != value.size:
                    raise ValueError(f"forced {label}: llama.cpp's value has {np.size(ref)} values, ours {value.size}")
                self._forced.append((label, np.array(value, dtype=np.float32, copy=True),
                                     np.asarray(ref, np.float32).reshape(value.shape)))


def _gpu_keeps_ids(kw, T: int = 1) -> bool:
    """Whether a GPU serves T tokens' routed experts from their ids on the device (quant.cuda.resident
    `_ids_on_device`): several tokens always (group tables built on the device); one
    token always for SwiGLU (the fast one-token kernels, else those tables); a gated activation of its own (`act`:
    Kimi-K3's SiTU, DeepSeek-V4's clamp) needs the fast kernels to take gate, up and down (16-byte rows, one type for
    gate and up), else the ids are read back. The sim device's model of that refusal; True when numba-cuda is not
    installed (nothing to ask)."""
    if kw.get("act") is None or T > 1:
        return True
    try:
        from quant.cuda.fast_specs import fast_supported_tensor
    except Exception:                                     # noqa: BLE001
        return True
    up, gate, down = kw.get("up"), kw.get("gate"), kw.get("down")
    return gate is not None and gate.type == up.type and all(map(fast_supported_tensor, (up, gate, down)))


def _fused_entries(names) -> frozenset:
    """KernelPolicy.fused_off checked against refengine/cuda/fused.py's entries (the ones a call site reaches through
    `ops.arrays.fused_op` / `row_kernel`): an unknown name is a ConfigError naming the known ones."""
    try:
        from .cuda.standin import numpy_twins
        known = set(numpy_twins())
    except ImportError:                                   # no numba-cuda: no fused kernels to leave out
        return frozenset(names)
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigError(f"KernelPolicy.fused_off: no fused entry {unknown[0]!r}; the entries: "
                          f"{', '.join(sorted(known))}")
    return frozenset(names)


class _UnderPolicy:
    """A backend module whose callables run under a kernel policy (`KernelPolicy.applied`)."""

    def __init__(self, inner, policy):
        self._inner, self._policy = inner, policy

    def __getattr__(self, name):
        a = getattr(self._inner, name)
        if not callable(a):
            return a

        def under(*args, **kw):
            with self._policy.applied():
                return a(*args, **kw)
        return under


_CUPY_WARNED = []


def _cupy_gpu() -> bool:
    """The cuda backend's default residency: a real GPU (not numba's simulator) and CuPy importable."""
    import quant.cuda
    if quant.cuda.SIM:
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        if not _CUPY_WARNED:
            import warnings
            warnings.warn("CuPy is not installed: the cuda backend runs op by op (each product's input copied to the "
                          "GPU and back), far slower than the device-resident forward; pip install 'refengine[cuda]'",
                          stacklevel=3)
            _CUPY_WARNED.append(True)
        return False
    return True
