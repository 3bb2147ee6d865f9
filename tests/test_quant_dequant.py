"""Dequantization bit-exact with libggml's own decoders, for every type the vendored ggml defines.

Two kinds of input per type: real blocks (ggml's quantizer on seeded random floats) and random bytes
read as the format, which hit NaN / inf / subnormal scales (asserted, so the coverage cannot silently go).
Bitwise: float32 bit patterns equal, any NaN equal to any NaN. On failure: the worst block and its bytes.
"""
import numpy as np
import pytest

from quant import GGMLType, TYPES, dequantize, QTensor
from quant import ggml as qggml
from quant.decode import decode, has_decoder

pytestmark = pytest.mark.oracle

QUANTIZED = [t for t, i in TYPES.items() if i.block_size > 1]
NO_TO_FLOAT = {GGMLType.Q8_1, GGMLType.Q8_K}     # ggml-base's type traits have no to_float for these
N_RANDOM_BLOCKS = 4096


def ggml_decode(raw: np.ndarray, t: GGMLType, n: int) -> np.ndarray:
    if t == GGMLType.Q8_K:
        from quant import ggml_cpu
        return ggml_cpu.dequantize_row(raw, t, n)
    return qggml.to_float(raw, t, n)


def assert_bitwise(name: str, t: GGMLType, raw: np.ndarray, ref: np.ndarray, got: np.ndarray) -> None:
    info = TYPES[t]
    ref, got = ref.reshape(-1, info.block_size), got.reshape(-1, info.block_size)
    same = (ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))
    if same.all():
        return
    bad_per_block = (~same).sum(axis=1)
    worst = int(np.argmax(bad_per_block))
    blk = raw.reshape(-1, info.type_size)[worst]
    j = int(np.flatnonzero(~same[worst])[0])
    pytest.fail(f"{t.name} {name}: {int((~same).sum())} values differ in {int((bad_per_block > 0).sum())} blocks; "
                f"worst block {worst} ({int(bad_per_block[worst])} values), first at element {j}: "
                f"ggml {ref[worst, j]!r} vs ours {got[worst, j]!r}\nblock bytes: {blk.tobytes().hex()}")


def real_blocks(t: GGMLType, rows: int = 16) -> np.ndarray:
    info = TYPES[t]
    n = 2 * max(info.block_size, 256)
    x = np.random.default_rng(int(t)).standard_normal((rows, n)).astype(np.float32)
    if t == GGMLType.Q8_K:
        from quant import ggml_cpu
        return ggml_cpu.quantize_row_ref(x, t)
    imatrix = np.ones(n, dtype=np.float32) if qggml.requires_imatrix(t) else None
    return qggml.quantize(x, t, imatrix)


def test_type_table_matches_ggml():
    """Block size and bytes per block of every type, from ggml's own type traits (gguf-py says Q8_1 is 40)."""
    L = qggml.lib()
    for t, info in TYPES.items():
        tr = L.ggml_get_type_traits(int(t)).contents
        assert (tr.blck_size, tr.type_size) == (info.block_size, info.type_size), t.name


@pytest.mark.parametrize("t", [t for t in QUANTIZED if t != GGMLType.Q8_1], ids=lambda t: t.name)
def test_random_bytes(t):
    info = TYPES[t]
    raw = np.random.default_rng(1000 + int(t)).integers(0, 256, (N_RANDOM_BLOCKS, info.type_size), dtype=np.uint8)
    n = N_RANDOM_BLOCKS * info.block_size
    ref = ggml_decode(raw, t, n)
    if t == GGMLType.NVFP4:   # UE4M3 scales have no inf/NaN: 0x7F (E4M3's NaN) and 0xFF decode as finite
        assert {0x00, 0x7F, 0xFF} <= set(np.unique(raw[:, 0:4]).tolist())
    else:
        assert not np.all(np.isfinite(ref)), f"{t.name}: random bytes produced no NaN/inf scale; coverage lost"
    assert_bitwise("random bytes", t, raw, ref, decode(raw.reshape(1, -1), t))


@pytest.mark.parametrize("t", [t for t in QUANTIZED if t != GGMLType.Q8_1], ids=lambda t: t.name)
def test_real_blocks(t):
    raw = real_blocks(t)
    n = raw.shape[0] * raw.shape[1] // TYPES[t].type_size * TYPES[t].block_size
    ref = ggml_decode(raw, t, n)
    assert np.all(np.isfinite(ref))
    w = QTensor.from_raw("w", t, (raw.shape[0], n // raw.shape[0]), raw)
    assert_bitwise("real blocks", t, raw, ref, dequantize(w))


def test_q8_1_against_q8_0():
    """ggml has no Q8_1 decoder; a Q8_1 block is Q8_0's (d, qs) plus s, so decoding it must equal ggml's Q8_0
    to_float of the same bytes without s, for random bytes and for ggml's own Q8_1 quantizer output."""
    from quant import ggml_cpu
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    for name, q81 in [("real blocks", ggml_cpu.quantize_row_ref(x, GGMLType.Q8_1).reshape(-1, 36)),
                      ("random bytes", rng.integers(0, 256, (N_RANDOM_BLOCKS, 36), dtype=np.uint8))]:
        q80 = np.concatenate([q81[:, 0:2], q81[:, 4:36]], axis=1)
        ref = qggml.to_float(q80, GGMLType.Q8_0, q81.shape[0] * 32)
        assert_bitwise(name, GGMLType.Q8_1, q81, ref, decode(q81.reshape(1, -1), GGMLType.Q8_1))
    a = ggml_cpu.quantize_row_ref(x, GGMLType.Q8_1).reshape(-1, 36)
    b = qggml.quantize(x, GGMLType.Q8_0).reshape(-1, 34)
    assert np.array_equal(np.concatenate([a[:, 0:2], a[:, 4:]], axis=1), b)   # same d and qs as Q8_0


@pytest.mark.parametrize("t", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_types(t):
    size = TYPES[t].type_size
    raw = np.random.default_rng(int(t)).integers(0, 256, 8192 * size, dtype=np.uint8)
    ref = qggml.to_float(raw, t, 8192)
    assert_bitwise("random bytes", t, raw, ref, decode(raw.reshape(1, -1), t))


def test_every_quantized_type_has_a_decoder():
    assert [t.name for t in QUANTIZED if not has_decoder(t)] == []
