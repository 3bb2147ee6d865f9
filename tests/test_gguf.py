"""The GGUF layer: one virtual file over shards, lazy mmapped tensors, one clear error per kind of bad file."""
import os
import shutil
import struct

import numpy as np
import pytest

import quant
from refengine.errors import (GGUFError, MalformedGGUFError, MissingShardError, ShardMismatchError,
                              TensorBoundsError, TruncatedFileError, UnknownTypeError)
from refengine.gguf import open_gguf, read_gguf
from refengine.synth import write_synth


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return write_synth("llama", tmp_path_factory.mktemp("g") / "one.gguf", wtype="Q8_0", seed=3)


@pytest.fixture(scope="module")
def split3(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    first = write_synth("llama", d / "model.gguf", wtype="Q8_0", seed=3, shards=3)
    return d, first


def test_reader_matches_gguf_py(single):
    """Metadata and tensor table agree with gguf-py's own reader, tensor bytes included."""
    from gguf import GGUFReader
    ref = GGUFReader(single)
    gf = open_gguf(single)
    assert {t.name for t in ref.tensors} == set(gf.tensors)
    for t in ref.tensors:
        mine = gf.tensor(t.name)
        assert mine.type.value == int(t.tensor_type)
        assert mine.shape == tuple(int(x) for x in reversed(t.shape.tolist()))
        assert np.array_equal(mine.raw.reshape(-1), np.asarray(t.data).reshape(-1).view(np.uint8))
    for f in ref.fields.values():
        if f.name.startswith("GGUF."):
            continue
        v = gf.get(f.name)
        if isinstance(v, str):
            assert v == bytes(f.parts[f.data[0]]).decode()
        elif np.ndim(v) == 0:
            assert v == pytest.approx(float(f.parts[f.data[0]][0]))


def test_tensors_are_lazy_mmapped_views(single):
    gf = open_gguf(single)
    t = gf.tensor("blk.0.attn_q.weight")
    assert not t.raw.flags.owndata and not t.raw.flags.writeable
    assert t.type == quant.GGMLType.Q8_0 and t.shape == (256, 256)


def test_split_set_loads_as_one_file(single, split3):
    d, first = split3
    names = sorted(os.listdir(d))
    assert names == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    one, many = open_gguf(single), open_gguf(first)
    assert len(many.shards) == 3
    assert set(one.tensors) == set(many.tensors)
    for n in one.tensors:
        assert np.array_equal(one.tensor(n).raw, many.tensor(n).raw), n
    # any shard opens the whole set
    assert set(open_gguf(d / names[1]).tensors) == set(one.tensors)


def test_split_model_runs_like_single(single, split3):
    from refengine import Model
    toks = [5, 17, 99, 3]
    a = Model(single).forward(toks)
    b = Model(split3[1]).forward(toks)
    assert np.array_equal(a, b)


@pytest.mark.oracle
def test_split_model_loads_in_llamacpp(single, split3):
    from refengine.oracle import run_llamacpp
    a = run_llamacpp(single, [1, 2, 3], trace=False).logits
    b = run_llamacpp(split3[1], [1, 2, 3], trace=False).logits
    assert np.array_equal(a, b)


def _copy_set(d, tmp_path):
    for f in os.listdir(d):
        shutil.copy(d / f, tmp_path / f)
    return tmp_path


def test_missing_shard(split3, tmp_path):
    d = _copy_set(split3[0], tmp_path)
    os.remove(d / "model-00002-of-00003.gguf")
    with pytest.raises(MissingShardError, match="model-00002-of-00003.gguf"):
        open_gguf(d / "model-00001-of-00003.gguf")


def test_truncated_shard(split3, tmp_path):
    d = _copy_set(split3[0], tmp_path)
    p = d / "model-00003-of-00003.gguf"
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(TensorBoundsError, match=r"model-00003-of-00003\.gguf: tensor '.*' .*truncated"):
        open_gguf(d / "model-00001-of-00003.gguf")


def test_truncated_header(single, tmp_path):
    p = tmp_path / "cut.gguf"
    data = open(single, "rb").read()
    for cut in (3, 10, 30, 200):
        p.write_bytes(data[:cut])
        with pytest.raises(TruncatedFileError, match="cut.gguf"):
            open_gguf(p)


def test_shard_count_mismatch(split3, tmp_path):
    d = _copy_set(split3[0], tmp_path)
    # rename shard 2 into a set that claims 3 shards but give it a wrong split.no
    p2 = d / "model-00002-of-00003.gguf"
    p3 = d / "model-00003-of-00003.gguf"
    os.replace(p2, d / "tmp")
    shutil.copy(p3, p2)
    with pytest.raises(ShardMismatchError, match="split.no"):
        open_gguf(d / "model-00001-of-00003.gguf")


def test_split_tensor_count_mismatch(split3, tmp_path):
    d = _copy_set(split3[0], tmp_path)
    p = d / "model-00001-of-00003.gguf"
    gf = read_gguf(p)
    raw = bytearray(open(p, "rb").read())
    key = b"split.tensors.count"
    i = raw.index(key) + len(key)
    vtype, val = struct.unpack_from("<Ii", raw, i)
    struct.pack_into("<Ii", raw, i, vtype, val + 1)
    open(p, "wb").write(raw)
    assert gf.kv["split.tensors.count"] == val
    with pytest.raises(ShardMismatchError, match="split.tensors.count"):
        open_gguf(p)


def test_bad_magic_and_version(single, tmp_path):
    raw = bytearray(open(single, "rb").read())
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + raw[4:])
    with pytest.raises(MalformedGGUFError, match="not a GGUF"):
        open_gguf(p)
    struct.pack_into("<I", raw, 4, 99)
    p.write_bytes(raw)
    with pytest.raises(MalformedGGUFError, match="version 99"):
        open_gguf(p)


def test_unknown_type(single, tmp_path):
    """Patch one tensor's ggml type id to an id ggml does not define."""
    gf = read_gguf(single)
    raw = bytearray(open(single, "rb").read())
    name = b"blk.0.attn_k.weight"
    i = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", raw, i)[0]
    struct.pack_into("<I", raw, i + 4 + 8 * n_dims, 77)
    p = tmp_path / "u.gguf"
    p.write_bytes(raw)
    assert gf.tensors["blk.0.attn_k.weight"].type == quant.GGMLType.Q8_0
    with pytest.raises(UnknownTypeError, match="blk.0.attn_k.weight.*77"):
        open_gguf(p)


def test_errors_share_one_family():
    for e in (TruncatedFileError, MalformedGGUFError, MissingShardError, ShardMismatchError,
              TensorBoundsError, UnknownTypeError):
        assert issubclass(e, GGUFError)


def test_missing_file(tmp_path):
    with pytest.raises(MalformedGGUFError, match="no such file"):
        open_gguf(tmp_path / "nope.gguf")
    with pytest.raises(MissingShardError):
        open_gguf(tmp_path / "nope-00001-of-00002.gguf")
