"""quant/cuda/fastlaunch.py's launch key, without a GPU: which launches may take the short path and under which
signature. Two launches that numba would type differently must never share a key (the short path would pack one
with the other's compiled kernel); anything not exactly C-contiguous must have no key (numba's path every time).
The launches themselves are checked on a GPU in tests/test_cuda_fastlaunch.py."""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
fl = pytest.importorskip("quant.cuda.fastlaunch")


class _Ptr:
    def __init__(self, p):
        self.ptr = p


class FakeCupy:
    """The attributes fastlaunch reads from a CuPy array (module name cupy.*)."""
    __module__ = "cupy.fake"

    def __init__(self, shape, dtype=np.float32, strides=None, ptr=4096):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.strides = tuple(strides) if strides is not None else fl._c_strides(self.shape, self.dtype.itemsize)
        self.data = _Ptr(ptr)


def test_scalars_of_different_types_never_share_a_key():
    keys = {fl._key([v]) for v in (1, 1.0, True, np.float32(1), np.float64(1), np.int32(1), np.int64(1))}
    assert len(keys) == 7


def test_arrays_keyed_by_dtype_and_rank_only_when_exactly_c_contiguous():
    a, b = FakeCupy((4, 8)), FakeCupy((4, 8), ptr=8192)
    assert fl._key([a]) == fl._key([b]) == (("array", "f", 2),)
    assert fl._key([FakeCupy((4, 8), np.float16)]) != fl._key([a])
    assert fl._key([FakeCupy((4, 8, 1))]) != fl._key([a])
    assert fl._key([FakeCupy((4, 8), strides=(64, 4))]) is None          # a row stride of 16 elements
    assert fl._key([FakeCupy((4, 8), strides=(4, 16))]) is None          # Fortran order
    assert fl._key([FakeCupy((0, 8))]) is None                           # empty
    assert fl._key([np.zeros((4, 8), np.float32)]) is None               # a host array: numba copies it
    assert fl._key([a, 3, FakeCupy((4, 8), strides=(32, 8))]) is None    # one argument out: the whole launch
    assert fl._key([1 << 63]) is None                                    # numba types it uint64
