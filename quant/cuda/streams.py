"""CuPy's current stream and arrays, seen from numba: the two handles every resident launch needs.

    current_stream()    numba's handle on CuPy's current stream (0: the legacy default stream, which both share)
    numba_view(a)       a numba view of a CuPy array: no copy, no stream synchronisation (`sync=False`)
    upload(a)           cuda.to_device(a), also while a stream is being captured into a graph
    scratch(n, dtype)   a work buffer of n elements for one launch: CuPy's pool where CuPy is (a captured step's
                        memory stays in the capturing pool), numba's device_array otherwise
"""
from __future__ import annotations

from numba import cuda

from . import fastlaunch
from .device import SIM

_STREAMS: dict = {}
_SIDE: list = []


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


def upload(a):
    """A host array copied to a new device array, whether or not a stream is being captured (`timing.capturing`):
    there the copy runs on a stream of its own and is waited for, since a copy on the legacy default stream (numba's
    plain `to_device`) would invalidate the capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: a dispatch table made at a
    captured ubatch's first product). For tables made once and kept (lru_cache): the graph reads them as constants."""
    from .timing import capturing
    if not capturing():
        return cuda.to_device(a)
    if not _SIDE:
        _SIDE.append(cuda.stream())
    d = cuda.to_device(a, stream=_SIDE[0])
    _SIDE[0].synchronize()
    return d


def scratch(n: int, dtype, stream=0):
    """A device buffer of n elements for work inside one launch sequence (numba array or view). From CuPy's pool on
    a GPU with CuPy (freed back to it when dropped: reused only by work queued after, as every resident buffer), so
    that a launch captured into a graph keeps its memory in the capturing pool; numba's allocator otherwise."""
    if not SIM:
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            return numba_view(cupy.empty(n, dtype=dtype))
    return cuda.device_array(n, dtype=dtype, stream=stream)
