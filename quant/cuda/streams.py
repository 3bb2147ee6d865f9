"""CuPy's current stream and arrays, seen from numba: the two handles every resident launch needs.

    current_stream()    numba's handle on CuPy's current stream (0: the legacy default stream, which both share)
    numba_view(a)       a numba view of a CuPy array: no copy, no stream synchronisation (`sync=False`)
"""
from __future__ import annotations

from numba import cuda

from . import fastlaunch

_STREAMS: dict = {}


def current_stream():
    import cupy
    ptr = int(cupy.cuda.get_current_stream().ptr)
    if ptr == 0:
        return 0
    s = _STREAMS.get(ptr)
    if s is None:
        s = _STREAMS[ptr] = cuda.external_stream(ptr)
    return s


def numba_view(a):
    if fastlaunch.INSTALLED:
        return fastlaunch.numba_view(a)
    return cuda.as_cuda_array(a, sync=False)
