"""GPU timing with CUDA events, with the host's launch cost kept out of the measured timeline.

    t = Timer(); us = t.run(lambda i, stream: launch(i, stream), n)    # microseconds of each launch
    us = t.graph(lambda i, stream: launch(i, stream), n)                # per launch, from CUDA graph replays

`graph` is the one to trust for short kernels: n launches are captured in one CUDA graph and the
graph is replayed, so numba's host-side launch cost (tens of microseconds, more than a GEMV) is paid
once at capture; each replay is event-timed and divided by n. `run` queues eager launches behind a
spinning kernel; it measures the launch rate whenever the host is slower than the GPU.

Before the timed launches are queued, the stream is kept busy by `spin_kernel` (chains of dependent
FMAs on every SM, calibrated once against events), so the GPU runs the launches back to back; the
spin loads the whole chip so that its clocks stay up (a one-thread spin let them drop).
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
from numba import cuda, float32


@cuda.jit
def spin_kernel(n, out):
    """Every thread runs n dependent FMAs (a fixed GPU-side delay that keeps the SMs busy)."""
    x = float32(1.0)
    for _ in range(n):
        x = cuda.fma(x, float32(0.9999999), float32(1e-7))
    if cuda.grid(1) == 0:
        out[0] = x


GRID = 264                    # two blocks per SM of an H100 / H200


class Spinner:
    """Delays a stream by about `us` microseconds (calibrated on first use)."""

    def __init__(self):
        self.out = cuda.device_array(1, np.float32)
        self.ns_per_iter = None

    def _calibrate(self, stream):
        n = 1 << 20
        spin_kernel[GRID, 128, stream](1024, self.out)          # compile, warm
        e0, e1 = cuda.event(), cuda.event()
        e0.record(stream)
        spin_kernel[GRID, 128, stream](n, self.out)
        e1.record(stream)
        e1.synchronize()
        self.ns_per_iter = max(0.05, cuda.event_elapsed_time(e0, e1) * 1e6 / n)

    def __call__(self, stream, us: float) -> None:
        if self.ns_per_iter is None:
            self._calibrate(stream)
        spin_kernel[GRID, 128, stream](int(us * 1e3 / self.ns_per_iter) + 1, self.out)


_CAPTURING = [0]              # Graph.capture spans open now (this process)


def capturing() -> bool:
    """Whether a `Graph.capture` is recording launches now: a library call that a capture refuses (CuPy's cuBLAS
    matmul) must take a kernel of the project's instead."""
    return _CAPTURING[0] > 0


_GRAPH_KERNELS = [0]          # graph_kernels() spans open now


@contextlib.contextmanager
def graph_kernels():
    """A span whose launches take the kernels a capture would (`graph_like`), though nothing is captured: a graph
    decoder's eager step of T tokens, the step before the capture of the same T. Its kernels are compiled and its
    tables made there, outside the capture (a capture that compiles or uploads is slow or invalidated), and it
    computes what the replays compute, bit for bit."""
    _GRAPH_KERNELS[0] += 1
    try:
        yield
    finally:
        _GRAPH_KERNELS[0] -= 1


def graph_like() -> bool:
    """Whether launches now take a capture's kernels: inside a `Graph.capture` or a `graph_kernels()` span."""
    return _CAPTURING[0] > 0 or _GRAPH_KERNELS[0] > 0


class Graph:
    """A CUDA graph captured from the launches of one stream (through the CUDA driver API)."""

    def __init__(self, exe):
        self.exe = exe

    @staticmethod
    def _check(res, what):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError(f"{what} failed: {err}")
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    @classmethod
    def capture(cls, fn, stream) -> "Graph":
        from cuda.bindings import driver as cu
        h = cu.CUstream(int(stream.handle))
        cls._check(cu.cuStreamBeginCapture(h, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "begin capture")
        _CAPTURING[0] += 1
        try:
            fn()
        except BaseException:
            cu.cuStreamEndCapture(h)                      # (the stream leaves capture mode; fn's error is the one told)
            raise
        finally:
            _CAPTURING[0] -= 1
        graph = cls._check(cu.cuStreamEndCapture(h), "end capture")
        exe = cls._check(cu.cuGraphInstantiate(graph, 0), "instantiate graph")
        return cls(exe)

    def launch(self, stream) -> None:
        from cuda.bindings import driver as cu
        self._check(cu.cuGraphLaunch(self.exe, cu.CUstream(int(stream.handle))), "graph launch")


class Timer:
    def __init__(self, stream=None, warm_us: float = 200e3):
        self.s = stream or cuda.stream()
        self.spin = Spinner()
        self.warm_us = warm_us

    def run(self, launch, n: int, warm: int = 3) -> list[float]:
        """Microseconds of each of n launches (`launch(i, stream)`), queued behind a spinning kernel."""
        s = self.s
        for i in range(warm):
            launch(i, s)
        s.synchronize()
        t0 = time.perf_counter()
        for i in range(warm):
            launch(i, s)
        per_launch = (time.perf_counter() - t0) / warm             # host cost per launch (with GPU time)
        s.synchronize()
        ev = [cuda.event() for _ in range(n + 1)]
        self.spin(s, min(3e6, 2.0 * n * per_launch * 1e6 + 2000))
        for i in range(n):
            ev[i].record(s)
            launch(i, s)
        ev[n].record(s)
        s.synchronize()
        return [cuda.event_elapsed_time(ev[i], ev[i + 1]) * 1e3 for i in range(n)]

    def graph(self, launch, n: int = 50, replays: int = 15) -> list[float]:
        """Microseconds per launch: launches 0..n-1 captured in one graph, replayed; one figure per replay."""
        s = self.s
        for i in range(min(n, 3)):                      # compile, allocate caches: nothing may allocate in capture
            launch(i, s)
        s.synchronize()
        g = Graph.capture(lambda: [launch(i, s) for i in range(n)], s)
        g.launch(s)
        s.synchronize()
        ev = [cuda.event() for _ in range(replays + 1)]
        self.spin(s, self.warm_us)                      # clocks up: an idle H200 sits at 345 MHz
        ev[0].record(s)
        for r in range(replays):
            g.launch(s)
            ev[r + 1].record(s)
        s.synchronize()
        return [cuda.event_elapsed_time(ev[r], ev[r + 1]) * 1e3 / n for r in range(replays)]
