"""Hostile GGUFs: typed metadata reads, ggml's reader rules, a seeded fuzz run, the CLI on mutants."""
import struct

import numpy as np
import pytest

from gguf_edit import GGUFValueType, rewrite
from quant import ggml as qggml
from refengine import Model, fuzz
from refengine.config import LlamaCppWouldRefuse
from refengine.errors import InvalidKeyError, MalformedGGUFError, RefengineError, UnsupportedArchError
from refengine.gguf import open_gguf

FAILURES = ("untyped", "crash", "hang", "memory")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from refengine.synth import write_synth
    return write_synth("llama", tmp_path_factory.mktemp("f") / "base.gguf", seed=1)


@pytest.mark.parametrize("key,value,vtype,match", [
    ("llama.block_count", [1, 2], GGUFValueType.ARRAY, r"'llama\.block_count' must be an integer .* but is an array of 2"),
    ("llama.embedding_length", "256", GGUFValueType.STRING, r"'llama\.embedding_length' must be an integer.*string '256'"),
    ("llama.block_count", 4294967295, GGUFValueType.UINT32, r"'llama\.block_count' = 4294967295 is more than .* tensors"),
    ("llama.rope.freq_base", 0.0, GGUFValueType.FLOAT32, r"'llama\.rope\.freq_base' must be a finite float > 0.*0\.0"),
    ("llama.rope.scaling.factor", -2.0, GGUFValueType.FLOAT32, r"rope\.scaling\.factor' must be a finite float >= 0"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), GGUFValueType.FLOAT32, r"finite float >= 0, but is FLOAT32 nan"),
    ("llama.attention.head_count", ["a", "b"], GGUFValueType.ARRAY, r"head_count' must be an integer.*array of 2 STRING"),
    ("llama.context_length", 1.5, GGUFValueType.FLOAT32, r"context_length' must be an integer"),
    ("llama.attention.causal", "yes", GGUFValueType.STRING, r"causal' must be a bool"),
])
def test_typed_keys(base, tmp_path, key, value, vtype, match):
    """Each metadata read checks the GGUF type and range, naming file, key, what it must be and what it is."""
    f = rewrite(base, tmp_path / "k.gguf", drop_keys={key}, set_keys={key: (value, vtype)})
    with pytest.raises(InvalidKeyError, match=r"k\.gguf: metadata key .*" + match):
        Model(f)


def test_other_width_is_read_and_llamacpp_refusal_said(base, tmp_path):
    f = rewrite(base, tmp_path / "w.gguf", drop_keys={"llama.block_count"},
                set_keys={"llama.block_count": (2, GGUFValueType.UINT64)})
    with pytest.warns(LlamaCppWouldRefuse, match="wrong type uint64 but expected type uint32"):
        m = Model(f)
    assert m.cfg.n_layer == 2


def test_arch_must_be_a_string(base, tmp_path):
    f = rewrite(base, tmp_path / "a.gguf", drop_keys={"general.architecture"},
                set_keys={"general.architecture": (["llama"], GGUFValueType.ARRAY)})
    with pytest.raises(UnsupportedArchError, match="'general.architecture' must be a string, but is an array"):
        Model(f)


def _raw(path):
    return fuzz.parse(open(path, "rb").read())


def _write(raw, path):
    path.write_bytes(raw.encode())
    return path


def test_reader_rules_of_ggml(base, tmp_path):
    """What ggml's gguf.cpp refuses, refused here as MalformedGGUFError naming the key or tensor."""
    r = _raw(base)
    r.kvs.append(r.kvs[3])
    with pytest.raises(MalformedGGUFError, match=f"key '{r.kvs[3][0].decode()}' appears twice"):
        open_gguf(_write(r, tmp_path / "dk.gguf"))
    r = _raw(base)
    r.tensors[2].name = r.tensors[1].name
    with pytest.raises(MalformedGGUFError, match=f"tensor '{r.tensors[1].name.decode()}' appears twice"):
        open_gguf(_write(r, tmp_path / "dt.gguf"))
    r = _raw(base)
    r.relayout = False
    r.tensors[0].offset, r.tensors[1].offset = r.tensors[1].offset, r.tensors[0].offset
    with pytest.raises(MalformedGGUFError, match=f"tensor '{r.tensors[0].name.decode()}' has data offset .* expected 0"):
        open_gguf(_write(r, tmp_path / "o.gguf"))
    r = _raw(base)
    r.tensors[4].ne = [2**40, 2**40]
    with pytest.raises(MalformedGGUFError, match=f"tensor '{r.tensors[4].name.decode()}' has shape .* int64"):
        open_gguf(_write(r, tmp_path / "ov.gguf"))
    r = _raw(base)
    r.kvs.append((b"general.alignment", fuzz.U64, struct.pack("<Q", 32)))
    with pytest.raises(MalformedGGUFError, match="'general.alignment' must be UINT32 but is UINT64"):
        open_gguf(_write(r, tmp_path / "al.gguf"))
    r = _raw(base)
    r.tensors[0].name = b"x" * 64
    with pytest.raises(MalformedGGUFError, match="at most 63"):
        open_gguf(_write(r, tmp_path / "n.gguf"))


def test_split_count_typed(base, tmp_path):
    f = rewrite(base, tmp_path / "s.gguf", set_keys={"split.count": ("2", GGUFValueType.STRING)})
    with pytest.raises(MalformedGGUFError, match="'split.count' must be an integer in 0..65535, but is STRING '2'"):
        open_gguf(f)


def test_trailing_unit_dims_as_llamacpp(base, tmp_path):
    """A norm stored as ne [256, 1] is the [256] llama.cpp's check_tensor_dims accepts."""
    r = _raw(base)
    t = next(t for t in r.tensors if t.name == b"blk.0.attn_norm.weight")
    t.ne = t.ne + [1]
    f = _write(r, tmp_path / "u.gguf")
    assert np.array_equal(Model(f).forward([1, 2]), Model(base).forward([1, 2]))


def test_seeded_fuzz_run(tmp_path):
    """One mutant of every kind on every seed: only typed errors or runs; every file llama.cpp
    refuses but refengine runs carries a note saying so."""
    oracle = qggml.available()
    seeds = fuzz.make_seeds(str(tmp_path / "seeds"))
    recs = fuzz.campaign(len(fuzz.SEEDS) * len(fuzz.KINDS), seed=0, seeds=seeds, oracle=oracle)
    bad = [r for r in recs if r["refengine"]["outcome"] in FAILURES]
    assert not bad, bad[:3]
    assert {r["kind"] for r in recs} == set(fuzz.KINDS)
    assert sum(r["refengine"]["outcome"] == "typed" for r in recs) > len(recs) // 2
    if oracle:
        silent = [r for r in recs if r["llamacpp"]["outcome"] != "accepted" and r["refengine"]["outcome"] == "ran"]
        assert not silent, silent[:3]


def test_cli_on_mutants(tmp_path, capsys):
    """info and run on one mutant of every kind: exit 0, or exit 2 with one line naming the problem."""
    from refengine.cli import main
    seeds = fuzz.make_seeds(str(tmp_path / "seeds"), names=["dense-f32", "split3-q8_0"])
    n2 = 0
    for i, kind in enumerate(fuzz.KINDS):
        rng = np.random.default_rng([7, i])
        d = tmp_path / f"m{i}"
        d.mkdir()
        path, desc = fuzz.mutate(seeds[["dense-f32", "split3-q8_0"][i % 2]], kind, rng, str(d))
        for cmd in (["info", path], ["run", path, "--tokens", "1,2,3", "-n", "2", "-q"]):     # -q: no progress lines
            rc = main(cmd)
            err = capsys.readouterr().err.strip().splitlines()
            assert rc in (0, 2), (kind, desc, cmd[0], rc)
            assert all(e.startswith("refengine: warning: ") for e in err[:-1]), (kind, desc, err)
            if rc == 2:
                n2 += 1
                assert err[-1].startswith("refengine: error: "), (kind, desc, err)
    assert n2 >= len(fuzz.KINDS)


@pytest.mark.oracle
def test_compare_on_refused_mutant(base, tmp_path, capsys):
    """compare on a file refengine reads but llama.cpp refuses: exit 2, llama.cpp's reason in one line."""
    from refengine.cli import main
    f = rewrite(base, tmp_path / "t.gguf", drop_keys={"tokenizer.ggml.model"})
    rc = main(["compare", str(f), "--tokens", "1,2,3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("refengine: error: ") and "tokenizer.ggml.model" in err[-1]
    assert err[:-1] == [e for e in err[:-1] if e.startswith("refengine: warning: ") and "llama.cpp refuses" in e]


def test_errors_are_refengine_errors():
    assert issubclass(InvalidKeyError, RefengineError)


def _alloc(path):
    return {"outcome": "ran", "n": int(np.ones(2**31, dtype=np.uint8).sum())}     # 2 GiB: over the bound


def _spin(path):
    while True:
        pass


def _abort(path):
    import os
    os.abort()


def _bug(path):
    return {}["missing"]


@pytest.mark.parametrize("fn,outcome", [(_alloc, "memory"), (_spin, "hang"), (_abort, "crash"), (_bug, "untyped")])
def test_bounded_child_classifies(fn, outcome):
    """The child's bounds hold: 1 GiB more address space, the deadline; an abort or a bug is an outcome."""
    res = fuzz.run_bounded(fn, "x.gguf", deadline=1.0)
    assert res["outcome"] == outcome, res


_COMPARE_ALL = r"""
import contextlib, io, json, sys
from refengine.cli import main
for path in sys.argv[1:]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(["compare", path, "--tokens", "1,2,3", "--json"])
    print(json.dumps({"path": path, "rc": rc, "err": err.getvalue()}), flush=True)
"""


@pytest.mark.oracle
def test_cli_compare_on_mutants(tmp_path):
    """compare on one mutant of every kind: exit 0/1, or 2 with one error line. One fresh interpreter runs them all
    (llama.cpp's decode must not run in a child forked from a process whose OpenMP threads exist: it can hang);
    a llama.cpp abort ends it, and fails the test."""
    import json
    import subprocess
    import sys
    seeds = fuzz.make_seeds(str(tmp_path / "seeds"), names=["moe-q8_0", "split3-q8_0"])
    paths, descs = [], {}
    for i, kind in enumerate(fuzz.KINDS):
        d = tmp_path / f"m{i}"
        d.mkdir()
        path, desc = fuzz.mutate(seeds[["moe-q8_0", "split3-q8_0"][i % 2]], kind, np.random.default_rng([8, i]), str(d))
        paths.append(path)
        descs[path] = (kind, desc)
    p = subprocess.run([sys.executable, "-c", _COMPARE_ALL, *paths], capture_output=True, text=True, timeout=300,
                       check=False)
    res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0 and len(res) == len(paths), (p.returncode, p.stderr[-2000:])
    for r in res:
        err = r["err"].strip().splitlines()
        assert r["rc"] in (0, 1, 2) and all(e.startswith("refengine: warning: ") for e in err[:-1]), (descs[r["path"]], r)
        assert r["rc"] != 2 or err[-1].startswith("refengine: error: "), (descs[r["path"]], r)
    assert {r["rc"] for r in res} >= {0, 2}
