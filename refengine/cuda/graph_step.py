"""Decode steps replayed from a CUDA graph: the device-resident forward (refengine.devarray on CuPy) of one token,
captured once and launched for every later token (issue 23, docs/device_path.md).

    dec = GraphDecoder(model, rt, state)       rt: Runtime(backend="cuda", fixed_shapes=True), resident on a GPU
    logits = dec.step(token)                   [V] float32 on the host; the state advanced by one token
    dec.reserve(n); dec.step(ids[i:i + U])     a prompt in ubatches of U tokens: a graph per token count, the
                                               last position's logits [V] (the head on that row only)

The first call runs the step eagerly (weights uploaded, kernels compiled, the caches at a fixed capacity); the
second captures its whole step (`Model.run_step`: the embedding, whose rows are decoded from the ids on the device,
every block and the head) on a stream of its own into a graph, then launches it; every later call writes the token
id and position into the captured step's two device input buffers, launches the graph and reads the logits and the
step's NaN/inf flags back (gathered into one array at the end of the graph, `Runtime.pack_deferred`: one read). The
modules are not changed: the span is the one `tests/test_capture.py` proves capturable on the "sim" device (no
upload, no read-back, no host fallback inside, the same op signature at every token), here on the GPU.

What a replay does not run is the Python of the step, so the driver repeats its effects on the host itself:
  - every int of the state that the captured step changed (a cache's row count `Rows.n`, `n_past`) by the same
    delta, found by comparing the state before and after the capture; the token ids' range check;
  - a state array the step replaced by a new one instead of writing into it: at the end of the captured step the
    new value is copied into the old array and the old array put back (a "write-back"), so every replay reads and
    writes the same buffers.
A cache whose next row would not fit its capacity ends the graph: that step runs eagerly (the cache grows) and the
next one is captured again. A capture that fails (an op the driver refuses while a stream is captured) leaves the
state as it was (nothing ran on the device; the Python's effects are undone), warns, and every step from then on runs
eagerly (`failed` says why). Steps of T tokens (a prompt's ubatches) have a graph of their own, kept beside the
one-token graph: both read the same cache buffers, and an eager step (a cache grown) drops them all. Inside a capture
the weight products of 128 tokens and more stay on the project's kernels (`quant.cuda.timing.capturing`): CuPy's
cuBLAS path is refused there. Activations are multiplied by the project's batched product (Runtime(fixed_shapes=True)
on a GPU sets `Device.products = "kernel"`: CuPy refuses cuBLAS inside a capture). Memory the captured launches
use comes from a CuPy pool of the decoder's own, which no other allocation shares.
"""
from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np

from ..cache import Rows
from ..devarray import DeviceArray, state_leaves
from ..errors import ConfigError


def _where(e: BaseException) -> str:
    """Where e came from: the innermost project frames of its traceback (the op that failed inside the capture),
    and the innermost frame of the model's code (a module or arch line: who asked for that op)."""
    import traceback
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if ("/refengine/" in f.filename or "/quant/" in f.filename) and not f.filename.endswith("graph_step.py")
              and "/timing.py" not in f.filename]
    if not frames:
        return "?"
    shown = frames[-2:]
    model = [f for f in frames
             if "/refengine/" in f.filename and not f.filename.endswith(("devarray.py", "runtime.py"))]
    if model and model[-1] not in shown:
        shown = [model[-1]] + shown
    return " <- ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {(f.line or '').strip()}"
                       for f in reversed(shown))


def _set(owner, key, value):
    if isinstance(owner, (list, dict)):
        owner[key] = value
    else:
        setattr(owner, key, value)


class _Tape:
    """The sim device's graph: the ops of the captured span, recomputed into the same buffers at each launch
    (`Device.taping` / `Device.replay`). The span ran while it was taped: the first launch is not needed."""
    ran_at_capture = True

    def __init__(self, dev, fn):
        with dev.taping() as tape, dev.strict():
            fn()
        self.dev, self.tape = dev, tape

    def launch(self, stream=None) -> None:
        self.dev.replay(self.tape)


class _Captured:
    """One captured step of T tokens: its graph, the step whose input buffers it reads, the logits and flags it
    rewrites, the host ints it advances (deltas), the caches it writes (rows)."""

    def __init__(self, graph, step, logits, flags, deltas, rows, writebacks, feed=None):
        self.graph, self.step, self.logits, self.flags = graph, step, logits, flags
        self.deltas, self.rows, self.writebacks = deltas, rows, writebacks
        self.feed = feed                                  # a greedy graph's (ring of ids, its count, flag pages)


class GraphDecoder:
    """Run one sequence a token (or a prompt's ubatch) at a time, the steps after the first of each token count
    replayed from a captured CUDA graph (the module docstring). `reserve(n)`: room for n positions in every cache, so
    that no step grows one (a growth ends every graph). `timing=True` (GPU) event-times each replay's graph into
    `gpu_ms` (milliseconds: the device's time for the blocks and head, without the host's part of a step) and splits
    each replayed step's wall time into `phases` (milliseconds a replay by REPLAY_PHASES). On the "sim" device the
    graph is a tape of the span's ops (`Device.taping`), replayed into the same buffers: the driver's logic (deltas,
    write-backs, recapture, a graph per token count) checked in CI. Counters: `eager`, `captures`, `replays`."""

    def __init__(self, model, rt, state, *, timing: bool = False):
        dev = rt.device
        if dev is None or not rt.fixed_shapes or rt.trace is not None:
            raise ConfigError("GraphDecoder needs a resident Runtime with fixed_shapes=True, untraced "
                             "(Runtime(backend='cuda', fixed_shapes=True) on a GPU)")
        self.model, self.rt, self.state, self.dev = model, rt, state, dev
        self.xp = dev.xp
        if dev.kind == "cupy":
            import cupy as cp
            from numba import cuda
            self.stream = cuda.stream()
            self.cps = cp.cuda.ExternalStream(int(self.stream.handle))
            self.pool = cp.cuda.MemoryPool()
        else:
            self.stream = self.cps = self.pool = None
        self.graphs: dict[int, _Captured] = {}            # T -> the captured step of T tokens
        self.warm: set[int] = set()                       # token counts run eagerly once (kernels compiled)
        self.eager = self.captures = self.replays = 0
        self.overshoot = 0                                # generate: ids fed past an eos in the last run
        self.writebacks = None                            # state arrays written back by the last capture
        self.reserved = 0                                 # positions every cache has room for (reserve)
        self.failed = None                                # why a capture failed (then every step is eager)
        self.timing = timing and self.stream is not None  # GPU: event-time each replay's graph (`gpu_ms`)
        self.time_phases = timing                         # each replay's wall time by phase (`phases`; the sim too)
        self.gpu_ms: list[float] = []
        self.phases: list[dict] = []                      # timing: REPLAY_PHASES of each replay, milliseconds
        self._marks: list | None = None
        self._events = None                               # timing: the two events around a replay's launch
        self._pinned: dict = {}                           # (device pointer, shape, dtype) -> its pinned host buffer

    def _context(self):
        if self.cps is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.cps)
        stack.enter_context(self.xp.cuda.using_allocator(self.pool.malloc))
        return stack

    # ------------------------------------------------------------ the step
    # a replayed step's wall time, phase by phase (timing=True): the token checked and written into the graph's
    # inputs; cuGraphLaunch; the wait for the GPU (the events' synchronize: 0 on the sim); the flag pages and the
    # logits read back (into pinned buffers, one wait) and the flags checked; the logits copied out of the staging
    REPLAY_PHASES = ("inputs", "launch", "gpu_wait", "read", "copy")

    def _mark(self) -> None:
        if self._marks is not None:
            self._marks.append(time.perf_counter())

    def step(self, tokens, out: np.ndarray | None = None) -> np.ndarray:
        """The next token (an int: a decode step) or ubatch (a sequence of T ids: a prompt's part) of the sequence
        -> the logits of its last position [V] (a ubatch's head runs on that row only), a new array, or written into
        `out` (float32 [V], the caller's: no new memory a step) and `out` returned. Steps of each token count have a
        graph of their own: the first of a count runs eagerly, the next is captured, later ones replay it."""
        toks = [int(tokens)] if isinstance(tokens, (int, np.integer)) else [int(t) for t in tokens]
        if not toks:
            raise ConfigError("GraphDecoder.step: no tokens given")
        self._marks = [time.perf_counter()] if self.time_phases else None
        with self._context():
            logits, replay = self._one(toks, len(toks), feed=False)
        if out is None:                                   # (a replay's logits are the pinned staging buffer, which
            out = logits[-1].copy() if replay else logits[-1]             # the next replay rewrites)
        else:
            np.copyto(out, logits[-1])
        self._mark()
        if replay and self._marks is not None and len(self._marks) == len(self.REPLAY_PHASES) + 1:
            m = self._marks
            self.phases.append({k: 1e3 * (m[i + 1] - m[i]) for i, k in enumerate(self.REPLAY_PHASES)})
        self._marks = None
        return out

    def _one(self, toks, key, feed: bool):
        """One step of toks through the graph under `key` (its token count, or GREEDY: the graph that feeds itself):
        replayed when it exists and the caches have room, captured at the second step of a token count, else eager
        (a cache grows). -> (the logits on the host, whether it was a replay)."""
        T = len(toks)
        g = self.graphs.get(key)
        if self.failed is not None:                       # a capture failed once: eager from then on
            out = self._eager(toks)
        elif g is not None and self._room(g.rows) >= T:
            return self._replay(g, toks), True            # (the logits read back with the flags: one wait)
        elif g is None and T in self.warm and self._room(self._all_rows()) >= T:
            out = self._capture_and_launch(toks, feed=feed)
        else:                                             # the first step of T tokens, or a cache full: eager
            out = self._eager(toks)
            self.warm.add(T)
        logits = self.rt.to_host(out)                     # (the deferred NaN/inf flags of an eager step too)
        if self.cps is not None:
            self.cps.synchronize()
        return logits, False

    def _eager(self, toks):
        m, rt, st = self.model, self.rt, self.state
        self._drop_graphs()                               # (a cache may grow: every graph's buffers may be gone)
        self.eager += 1
        with self._graph_kernels():                       # the capture's kernels (compiled, tables made here)
            out = m.run_step(m.prepare_step(toks, st, rt), st, rt, last_only=len(toks) > 1)
        if self.reserved:
            self.reserve(self.reserved)                   # (caches the step made)
        return out

    def _capture_and_launch(self, toks, feed: bool = False):
        m, rt, st, dev = self.model, self.rt, self.state, self.dev
        step = m.prepare_step(toks, st, rt)               # its ids / positions: the graph's input buffers
        rt.check_deferred()                               # (nothing pending: an eager step read its flags)
        before = state_leaves(st)
        box = {}
        if feed:                                          # made outside the graph: the replays keep what they hold
            box["ring"] = DeviceArray(dev.xp.zeros(self.RING, dtype=np.int64), dev)
            box["count"] = DeviceArray(dev.xp.zeros(1, dtype=np.int64), dev)
            n = -(-max(rt.flag_rows, 1) // rt.PAGE_ROWS) + 1            # the eager step's pages, and one to spare
            box["stock"] = [dev.xp.ones((rt.PAGE_ROWS, 2), dtype=bool) for _ in range(n)]
            rt.page_stock = list(box["stock"])            # flag pages no replay refills: a run's flags ANDed

        def body():
            rt.lazy_inputs = True                         # products' input flags: only when an output's says NaN
            try:                                          # embedding (rows decoded from the ids on the device) .. head
                box["logits"] = m.run_step(step, st, rt, last_only=len(toks) > 1)
            finally:
                rt.lazy_inputs = False
            box["flags"] = rt.pack_deferred()             # the step's NaN/inf flags in one array, rewritten by replays
            if feed:
                used = len(box["stock"]) - len(rt.page_stock)
                if box["flags"] is not None and len(box["flags"][2]) != used:
                    raise ConfigError(f"greedy graph: its step took {len(box['flags'][2])} flag pages, {used} of "
                                      f"them made ahead (a page made in the graph is refilled by every replay)")
                box["pages"] = [DeviceArray(p, dev) for p in box["stock"][:used]]
                self._feed_ops(step, box["logits"], box["ring"], box["count"])
            after = state_leaves(st)
            wb = []
            for p, (o, k, v) in after.items():            # replaced arrays: written back into the old ones
                old = before.get(p)
                if old is not None and isinstance(v, DeviceArray) and isinstance(old[2], DeviceArray) \
                        and v is not old[2]:
                    if v.shape != old[2].shape or v.dtype != old[2].dtype:
                        raise ConfigError(f"graph step: state array {p} changed shape {old[2].shape} -> {v.shape}")
                    dev.call(np.copyto, (old[2], v), {})
                    wb.append((o, k, old[2]))
            for o, k, v in wb:
                _set(o, k, v)
            box["writebacks"] = len(wb)

        try:
            if dev.kind == "cupy":
                from quant.cuda.timing import Graph
                dev.probes.append(self._capture_probe())
                try:
                    graph = Graph.capture(body, self.stream)
                finally:
                    dev.probes.pop()
            else:
                graph = _Tape(dev, body)
        except Exception as e:                            # (GPU: nothing ran on the device) undo the Python's effects
            rt.page_stock = None
            if dev.kind != "cupy":
                raise                                     # the sim ran part of the span: no state to go back to
            for p, (o, k, v) in before.items():
                if not isinstance(o, tuple):
                    _set(o, k, v)
            rt.discard_deferred()
            self.failed = f"{type(e).__name__}: {e} (at {_where(e)})"
            warnings.warn(f"{len(toks)}-token step not captured ({self.failed}): running eagerly", RuntimeWarning,
                          stacklevel=3)
            return self._eager(toks)
        rt.page_stock = None
        self.captures += 1
        after = state_leaves(st)
        deltas = [(o, k, int(v) - int(before[p][2])) for p, (o, k, v) in after.items()   # n_past, Rows.n, ..
                  if isinstance(v, (int, np.integer)) and p in before and int(v) != int(before[p][2])]
        rows = [v for _, _, v in after.values() if isinstance(v, Rows) and v._count is not None]
        g = _Captured(graph, step, box["logits"], box["flags"], deltas, rows, box["writebacks"],
                      (box["ring"], box["count"], box["pages"]) if feed else None)
        self.graphs[self.GREEDY if feed else len(toks)] = g
        self.writebacks = g.writebacks
        if not getattr(graph, "ran_at_capture", False):
            graph.launch(self.stream)
        self.rt.check_deferred(g.flags)
        return g.logits

    def _graph_kernels(self):
        """GPU: `quant.cuda.timing.graph_kernels` (an eager step takes the kernels its capture will: no compile
        and no upload inside the capture, and the replays compute what it computed); the sim: nothing to choose."""
        if self.cps is None:
            return contextlib.nullcontext()
        from quant.cuda.timing import graph_kernels
        return graph_kernels()

    def _capture_probe(self):
        """A check run after every op of a capture (`Device.probes`): an op the capture cannot record (work on the
        legacy default stream, a synchronous copy) invalidates it without an error of its own, and the capture then
        fails only at its end; this names the first op after which the stream's capture is invalidated."""
        from cuda.bindings import driver as cu
        h = cu.CUstream(int(self.stream.handle))
        bad = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED
        last = ["the step's start"]

        def probe(op: str) -> None:
            err, status = cu.cuStreamIsCapturing(h)
            if status == bad:
                raise ConfigError(f"the stream capture was invalidated by {op!r} or an op between it and "
                                  f"{last[0]!r} (work outside the capturing stream, or a synchronous call)")
            last[0] = op
        return probe

    GREEDY = "greedy"          # graphs' key of the one-token step that also feeds its own argmax back (greedy)
    RING = 256                 # ids a greedy run's replays write before the host reads them

    def _feed_ops(self, step, logits, ring, count) -> None:
        """The end of a greedy graph, on the device: the step's argmax becomes the next step's token and its position
        the next (the step's input buffers), and it is written to ring[count] (count advanced). (Its flag pages were
        made ahead, outside the graph: no replay refills them, so a run of replays leaves every step's flags ANDed.)"""
        nxt = np.argmax(logits[-1])                       # (NumPy's and CuPy's: the first largest, NaN first)
        step.tokens[...] = nxt
        step.pos[...] = step.pos + 1
        ring[count] = nxt
        count[...] = count + 1

    def greedy(self, token: int, n: int, *, chunk: int = RING) -> list[int]:
        """`Model.generate`'s greedy loop from `token` (the first new id, from the prompt's logits): n ids, every one
        but the last fed. Once its graph is captured, each replay feeds its own argmax to the next on the device:
        `chunk` replays are launched back to back (the host does not wait for a step's logits before launching the
        next) and their ids read back once. No eos: the n ids are decoded whatever they are. Returns the ids."""
        if n < 1:
            return []
        m_, st = self.model, self.state
        ids, t = [int(token)], int(token)
        chunk = max(1, min(int(chunk), self.RING))
        with self._context():
            while len(ids) < n:
                g = self.graphs.get(self.GREEDY)
                room = self._room(g.rows) if g is not None and self.failed is None else 0
                if room >= 1:
                    k = min(chunk, n - len(ids), room, m_.n_ctx - st.n_past)
                    if k < 1:
                        m_._check_tokens([t], st.n_past)  # (raises: the context is full)
                    new = self._pipelined(g, t, k)
                else:                                     # eager, or the capture of the greedy graph
                    logits, _ = self._one([t], self.GREEDY, feed=True)
                    new = [int(np.argmax(logits[-1]))]
                ids += new
                t = ids[-1]
        return ids[:n]

    GEN_CHUNK = 16             # generate's replays a launch run: at most 15 steps past an eos

    def generate(self, logits, n: int, *, eos: int | None = None, on_token=None, chunk: int = GEN_CHUNK) -> list[int]:
        """`Model.generate`'s greedy loop after a prefill (`logits`: its last position's, [V] or [T, V]), through
        `greedy`'s self-feeding graph in runs of `chunk` replays: the same ids, up to n, ending at the first `eos`;
        `on_token(id)` for each as it is read back (a run's ids come together). Without an eos in the middle the state
        ends as generate leaves it (every id fed but the last); a run that meets an eos has fed the ids after it in
        that run too (`overshoot` says how many), so a caller that keeps the state (a saved state file) decodes an
        eos-terminated sequence with `step` instead."""
        V = self.model.cfg.n_vocab
        logits = np.asarray(logits)
        if logits.size == 0 or logits.shape[-1] != V:
            raise ConfigError(f"GraphDecoder.generate: logits of shape {logits.shape}, expected [V] or [T, V] with V "
                              f"= {V} (the model's vocabulary)")
        self.overshoot = 0
        if n < 1:
            return []
        first = int(np.argmax(logits.reshape(-1, V)[-1]))
        out = [first]
        if on_token is not None:
            on_token(first)
        while len(out) < n and out[-1] != eos:
            new = self.greedy(out[-1], min(chunk, n - len(out)) + 1)[1:]    # (k new ids: the last one not fed)
            for i, t in enumerate(new):
                out.append(t)
                if on_token is not None:
                    on_token(t)
                if t == eos:
                    self.overshoot = len(new) - 1 - i
                    break
        return out

    def _pipelined(self, g: _Captured, t: int, k: int) -> list[int]:
        """k replays of the greedy graph from token t, launched back to back; the k ids they chose, read once."""
        m_, rt, st = self.model, self.rt, self.state
        ring, count, pages = g.feed
        self._write(g.step.tokens, m_._check_tokens([t], st.n_past))
        self._write(g.step.pos, np.array([st.n_past]))
        self._write(count, np.zeros(1))
        for pg in pages:                                  # filled once a run: its steps' flags ANDed into them
            self._write(pg, np.ones(pg.shape, dtype=bool))
        for _ in range(k):
            g.graph.launch(self.stream)
        self._advance(g, k)
        rt.check_deferred(g.flags)                        # (the views of those pages)
        self.replays += k
        return [int(i) for i in self.dev.get(ring)[:k]]

    def reserve(self, n: int) -> int:
        """Room for n positions in every cache of the state (`Rows.reserve`), and in every cache a later eager step
        makes (a module may make its caches at its first call): a prompt's ubatches and the tokens after them
        replay their graphs without a growth in between. Returns the caches reserved now."""
        self.reserved = max(self.reserved, int(n))
        rows = [v for _, _, v in state_leaves(self.state).values() if isinstance(v, Rows)]
        for r in rows:
            r.reserve(self.reserved)
        self._drop_graphs()                               # (a buffer may have grown)
        return len(rows)

    def _drop_graphs(self) -> None:
        """Every captured graph forgotten, and the pinned staging of their buffers."""
        self.graphs.clear()
        self._pinned.clear()

    @staticmethod
    def _room(rows) -> int:
        """The rows every cache of `rows` has free (unbounded when there are none)."""
        return min((r._buf.shape[0] - r.n for r in rows), default=1 << 62)

    @staticmethod
    def _advance(g: _Captured, times: int) -> None:
        """The state's ints (n_past, Rows.n, ..) moved as `times` replays of g move them on the device."""
        for o, k, d in g.deltas:
            _set(o, k, (o[k] if isinstance(o, (list, dict)) else getattr(o, k)) + times * d)

    def _all_rows(self) -> list:
        return [v for _, _, v in state_leaves(self.state).values() if isinstance(v, Rows) and v._buf is not None]

    def _replay(self, g: _Captured, toks):
        m, rt, st = self.model, self.rt, self.state
        tokens = m._check_tokens(toks, st.n_past)         # the ids checked as any step's, then written into the
        self._write(g.step.tokens, tokens)                # captured step's input buffers (two small copies)
        self._write(g.step.pos, np.arange(st.n_past, st.n_past + tokens.size))
        if self.timing:
            from numba import cuda
            if self._events is None:                      # (made once: making them is a host cost of its own)
                self._events = cuda.event(), cuda.event()
            ev = self._events
            ev[0].record(self.stream)
        self._mark()
        g.graph.launch(self.stream)
        self._mark()
        if self.timing:
            ev[1].record(self.stream)
            ev[1].synchronize()
            self.gpu_ms.append(cuda.event_elapsed_time(*ev))
        self._mark()
        self._advance(g, 1)
        pages, logits = self._read_back(g)                # the flag pages and the logits: one wait for both
        rt.check_deferred(g.flags, host_pages=pages)
        self._mark()
        self.replays += 1
        return logits                                     # (the staging buffer: step copies it out)

    def _host(self, raw) -> np.ndarray:
        """The page-locked host buffer (made once) that a device array of this decoder is read into or written
        from: an asynchronous copy from pinned memory is one DMA, where a pageable one is staged by the driver
        (0.40 ms for a [1, 151936] logits row read with `get()`, session 24's phases)."""
        key = (int(raw.data.ptr), raw.shape, raw.dtype.str)
        h = self._pinned.get(key)
        if h is None:
            import cupyx
            h = self._pinned[key] = cupyx.empty_pinned(raw.shape, dtype=raw.dtype)
        return h

    def _read_back(self, g: _Captured):
        """g's flag pages and logits on the host ([the pages], logits), copied after the replay on the decoder's
        stream into pinned buffers and waited for once (the sim: its own arrays)."""
        pages = g.flags[2] if g.flags is not None else []
        if self.cps is None:
            return [p.raw for p in pages], g.logits.raw
        out = []
        for a in [p.raw for p in pages] + [g.logits.raw]:
            h = self._host(a)
            self._copy_async(h.ctypes.data, a.data.ptr, a.nbytes, to_host=True)
            out.append(h)
        self.cps.synchronize()
        return out[:-1], out[-1]

    def _copy_async(self, dst: int, src: int, nbytes: int, *, to_host: bool) -> None:
        """cudaMemcpyAsync between a pinned host buffer and a device array on the decoder's stream."""
        import cupy as cp
        rt = cp.cuda.runtime
        rt.memcpyAsync(dst, src, nbytes, rt.memcpyDeviceToHost if to_host else rt.memcpyHostToDevice, self.cps.ptr)

    def _write(self, buf: DeviceArray, values: np.ndarray) -> None:
        """Host values into a device input buffer of the graph, on the decoder's stream (the sim: in place)."""
        values = np.asarray(values, dtype=buf.dtype).reshape(buf.shape)
        if self.cps is None:
            np.copyto(buf.raw, values)
            return
        a = buf.raw
        h = self._host(a)                                 # pinned: the copy is queued, not staged (the buffer is
        np.copyto(h, values)                              # rewritten only after the stream's next wait)
        self._copy_async(a.data.ptr, h.ctypes.data, a.nbytes, to_host=False)
