"""quant/cuda/fastlaunch.py's launch key, without a GPU: which launches may take the short path and under which
signature. Two launches that numba would type differently must never share a key (the short path would pack one
with the other's compiled kernel): an array's layout is part of its key, a strided one served only by a kernel compiled
for any layout.
The launches themselves are checked on a GPU in tests/test_cuda_fastlaunch.py."""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
fl = pytest.importorskip("quant.cuda.fastlaunch")


def _key(args):
    return fl._fields_and_key(args)[1]


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
    keys = {_key([v]) for v in (1, 1.0, True, np.float32(1), np.float64(1), np.int32(1), np.int64(1))}
    assert len(keys) == 7


def test_arrays_keyed_by_dtype_rank_and_layout():
    a, b = FakeCupy((4, 8)), FakeCupy((4, 8), ptr=8192)
    assert _key([a]) == _key([b]) == (("array", "f", 2, "C"),)
    assert _key([FakeCupy((4, 8), np.float16)]) != _key([a])
    assert _key([FakeCupy((4, 8, 1))]) != _key([a])
    strided = _key([FakeCupy((4, 8), strides=(64, 4))])                # a row stride of 16 elements
    assert strided == (("array", "f", 2, "X"),) != _key([a])            # never a C kernel's key
    assert _key([FakeCupy((4, 8), strides=(4, 16))]) == strided         # Fortran order: served by an "A" kernel only
    assert _key([FakeCupy((0, 8))]) is None                           # empty
    assert _key([np.zeros((4, 8), np.float32)]) is None               # a host array: numba copies it
    assert _key([a, 3, np.zeros(3)]) is None                          # one argument out: the whole launch
    assert _key([1 << 63]) is None                                    # numba types it uint64
    # a dimension of size 1 with any stride (one token's columns of a stacked product, `y[:, a:b]`): its index is
    # always 0, so a kernel compiled for either layout reads the same bytes, and the packing carries the strides
    assert _key([FakeCupy((1, 8), strides=(640, 4))]) == _key([a])
    assert _key([FakeCupy((1, 2, 8), strides=(4000, 32, 4))]) == _key([FakeCupy((4, 2, 8))])
    assert _key([FakeCupy((2, 8), strides=(640, 4))]) == strided      # two rows of it: strided


def test_strided_short_path_can_be_turned_off(monkeypatch):
    """REFENGINE_FASTLAUNCH_STRIDED=0 (fastlaunch.STRIDED False): a strided array has no key (numba's path, as before
    session 30); a C one keeps its."""
    monkeypatch.setattr(fl, "STRIDED", False)
    assert _key([FakeCupy((4, 8), strides=(64, 4))]) is None
    assert _key([FakeCupy((1, 8), strides=(640, 4))]) == (("array", "f", 2, "C"),)


def test_a_strided_key_takes_only_a_kernel_compiled_for_any_layout(monkeypatch):
    """`_entry` keeps a kernel for a strided array's key only when numba compiled it for layout "A": one typed "F"
    (a transposed array's) or "C" would read another strided array of that key wrongly."""
    from numba.cuda import types

    class K:
        debug = cooperative = False

        def __init__(self, layout):
            self.argument_types = [types.Array(types.float32, 2, layout)]
            self._codelibrary = self

        def get_cufunc(self):
            return self

        kernel = "compiled"

    class D:
        specialized = False

        def __init__(self, layout):
            self.k = K(layout)
            self.overloads = {tuple(self.k.argument_types): self.k}

        def _select_launch_config_dispatcher(self, lc):
            return self

        def typeof_pyval(self, a):
            return self.k.argument_types[0]

    class LC:
        pre_launch_callbacks = []
    key = (("array", "f", 2, "X"),)
    assert fl._entry(D("A"), [object()], LC(), key)[0] == "compiled"
    assert fl._entry(D("F"), [object()], LC(), key) is None
    assert fl._entry(D("C"), [object()], LC(), key) is None
    assert fl._entry(D("C"), [object()], LC(), (("array", "f", 2, "C"),))[0] == "compiled"


def test_packed_parameters_are_numbas_layout():
    """An array packs as numba's `_prepare_args` does (meminfo 0, parent 0, size, itemsize, pointer, shape,
    strides in bytes), from the fields read once with the key; scalars as their kernel type's ctypes value."""
    import ctypes

    from numba.cuda import types
    a = FakeCupy((3, 5), ptr=123456)
    fields, key = fl._fields_and_key([a, 7, 0.5])
    assert key == (("array", "f", 2, "C"), "int", "float")
    out: list = []
    fl._packer(types.Array(types.float32, 2, "C"))(fields[0], out)
    assert out == [0, 0, 15, 4, 123456, 3, 5, 20, 4]
    fl._packer(types.int64)(fields[1], out)
    fl._packer(types.float32)(fields[2], out)
    assert isinstance(out[-2], ctypes.c_int64) and out[-2].value == 7
    assert isinstance(out[-1], ctypes.c_float) and out[-1].value == 0.5
    assert fl._packer(types.complex64) is None            # not served: numba's path


class FakeNumba:
    """A numba device array's interface (module numba.*), counting its `__cuda_array_interface__` reads."""
    __module__ = "numba.fake"

    def __init__(self, shape, strides=None, ptr=4096):
        self.dtype, self.reads = np.dtype(np.float32), 0
        self._cai = {"shape": tuple(shape), "strides": strides, "data": (ptr, False), "typestr": "<f4", "version": 3}

    @property
    def __cuda_array_interface__(self):
        self.reads += 1
        return self._cai


def test_numba_arrays_fields_read_once_and_keyed_as_cupys():
    """A numba array's fields are read from its interface once and kept on it (they never change); the key, the
    packed fields and the refusal of a strided array are the same at the first launch and every later one."""
    a = FakeNumba((3, 5), ptr=777)
    first = fl._fields_and_key([a, 2])
    again = fl._fields_and_key([a, 2])
    assert first == again and a.reads == 1
    assert first[1] == _key([FakeCupy((3, 5)), 2])
    assert first[0][0] == (777, (3, 5), (20, 4), np.dtype(np.float32))
    s = FakeNumba((3, 5), strides=(40, 4))                # every other row: the strided key, read once
    assert _key([s]) == _key([s]) == _key([FakeCupy((3, 5), strides=(40, 4))]) and s.reads == 1
    assert fl._fields_and_key([FakeNumba((0, 5))]) == (None, None)


def test_whole_way_launches_counted_by_kernel(monkeypatch):
    """A launch with no key (an empty array) goes numba's whole way every time, counted under the kernel's name in
    `slow_by` (benchmarks/profile_prefill.py prints them: where a prefill's host time per launch is ~10x); a keyed
    launch's first goes that way too, later ones the short path (a strided array's too, once its kernel is one for
    any layout); reset_stats zeroes both."""
    seen = []
    monkeypatch.setattr(fl, "_ORIG", lambda self, args, cfg: seen.append(args))
    monkeypatch.setattr(fl, "_entry", lambda self, args, cfg, key: ("kernel", [lambda f, p: p.append(f)]))
    monkeypatch.setattr(fl, "_launch", lambda *a: seen.append("short"))
    monkeypatch.setattr(fl, "_config", lambda cfg: cfg)

    class Kernel:
        def py_func(self):
            pass

    class Cfg:
        stream = 0

    k = Kernel()
    fl.reset_stats()
    empty = FakeCupy((0, 5))
    for _ in range(3):
        fl._call(k, [empty], Cfg())
    name = Kernel.py_func.__qualname__                  # (a factory's kernel: make.<locals>.kern, told apart)
    assert fl.stats == {"short": 0, "numba": 3} and fl.slow_by == {name: 3}
    fl.reset_stats()
    for _ in range(3):
        fl._call(k, [FakeCupy((3, 5))], Cfg())
    assert fl.stats == {"short": 2, "numba": 1} and fl.slow_by == {name: 1}
    for _ in range(3):                                  # strided: its own key, its own first launch
        fl._call(k, [FakeCupy((3, 5), strides=(40, 4))], Cfg())
    assert fl.stats == {"short": 4, "numba": 2} and fl.slow_by == {name: 2}
    fl.reset_stats()
    assert fl.stats == {"short": 0, "numba": 0} and fl.slow_by == {}
