"""A state that persists (refengine/state_file.py): save in the middle of a decode, load into a fresh Model, continue:
the logits equal the uninterrupted run's bit for bit, for every registered arch and attention form. A state of
another model, and a truncated or corrupt file, are refused with the state file's error type."""
import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from test_decode import TOKENS

from refengine import Model
from refengine.cache import ModelState, Rows, state_container
from refengine.errors import StateFileError, StateMismatchError
from refengine.state_file import load_state, read_manifest, read_state, save_state

PREFILL, SAVE_AT = 6, 2                    # prefill 6 tokens, decode 2, save; then decode the rest (4) after loading


def state_cases():
    """Every registered arch: each tiny preset, and each further attention form of the first. Adding an arch (or a
    container) adds its cases here with no edit."""
    from refengine.archs import ARCHS
    from refengine.synth import PRESETS
    cases = []
    for arch in ARCHS:
        tiny = [p for p in PRESETS.get(arch, {}) if p.startswith("tiny")]
        cases += [(arch, p, None) for p in tiny]
        cases += [(arch, tiny[0], form) for form in (ARCHS[arch].ATTN_FORMS[1:] if tiny else ())]
    return cases


def arrays(obj, path="state"):
    """Every array of a state by attribute path (Rows: the used rows), for a bit-for-bit comparison."""
    if isinstance(obj, Rows):
        yield path, obj.view()
    elif isinstance(obj, np.ndarray):
        yield path, obj
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from arrays(x, f"{path}.{i}")
    elif hasattr(obj, "__dict__"):
        for k, x in vars(obj).items():
            yield from arrays(x, f"{path}.{k}")


@pytest.mark.parametrize("arch,preset,form", state_cases(), ids=lambda v: str(v))
def test_save_load_mid_decode_is_bit_identical(synth_model, tmp_path, arch, preset, form):
    path = synth_model(arch, preset=preset)
    m = Model(path)
    st = m.new_state(form)
    want = [m.forward(TOKENS[:PREFILL], st)] + [m.forward([t], st) for t in TOKENS[PREFILL:]]

    st = m.new_state(form)
    m.forward(TOKENS[:PREFILL], st)
    last = [m.forward([t], st) for t in TOKENS[PREFILL:PREFILL + SAVE_AT]][-1]
    f = tmp_path / "s.safetensors"
    man = save_state(f, m, st, logits=last, tokens=TOKENS[:PREFILL + SAVE_AT])
    assert man["n_past"] == PREFILL + SAVE_AT and man["arch"] == arch

    m2 = Model(path)                                             # a fresh model of the same file
    saved = read_state(f, m2)
    got = dict(arrays(saved.state))
    for k, a in arrays(st):                                      # the state itself: every array, dtype and bit
        assert k in got, k
        assert (a is None and got[k] is None) or (a.dtype == got[k].dtype and np.array_equal(a, got[k])
                                                  and a.tobytes() == got[k].tobytes()), k
    assert np.array_equal(saved.logits, last[-1]) and saved.tokens.tolist() == TOKENS[:PREFILL + SAVE_AT]
    assert [type(x).__name__ for x in saved.state.layers] == [type(x).__name__ for x in st.layers]
    cont = [m2.forward([t], saved.state) for t in TOKENS[PREFILL + SAVE_AT:]]
    for i, (a, b) in enumerate(zip(want[1 + SAVE_AT:], cont)):
        assert np.array_equal(a, b), f"{arch} {preset} {form}: decode step {SAVE_AT + i} differs after loading"
    # saving the loaded state again gives the same tree and the same bytes
    m3 = save_state(tmp_path / "again.safetensors", m2, load_state(f, m2), logits=last,
                    tokens=TOKENS[:PREFILL + SAVE_AT])
    assert m3["tree"] == man["tree"] and m3["sha256"] == man["sha256"]


def test_mla_latent_cache_of_the_layout_before_loads(synth_model, tmp_path):
    """A state file written when MLA's latent cache kept c and k_pe in two Rows (before 2026-12-05's one buffer of
    [c | k_pe] rows) loads into the current layout (`LatentKV._restored`): the decode after it equals the
    uninterrupted run bit for bit."""
    from refengine.cache import LatentKV
    path = synth_model("deepseek2")
    m = Model(path)
    st = m.new_state()
    want = [m.forward(TOKENS[:PREFILL], st)] + [m.forward([t], st) for t in TOKENS[PREFILL:]]
    st = m.new_state()
    m.forward(TOKENS[:PREFILL], st)
    latent = [x for x in st.layers if isinstance(x, LatentKV)]
    assert latent
    for lk in latent:                                            # written as the layout before wrote it
        rows, C = lk.kv.view(), m.cfg.layers[0].attn_cfg.kv_lora_rank
        assert rows.shape[1] == C + m.cfg.layers[0].attn_cfg.qk_rope
        del lk.kv
        lk.c, lk.k_pe = Rows.holding(rows[:, :C].copy(), np.float32), Rows.holding(rows[:, C:].copy(), np.float32)
    f = tmp_path / "old.safetensors"
    man = save_state(f, m, st, tokens=TOKENS[:PREFILL])
    assert '"c"' in json.dumps(man["tree"]) and '"k_pe"' in json.dumps(man["tree"])
    loaded = load_state(f, Model(path))
    assert all(isinstance(x.kv, Rows) and not hasattr(x, "c") for x in loaded.layers if isinstance(x, LatentKV))
    got = [m.forward([t], loaded) for t in TOKENS[PREFILL:]]
    for i, (a, b) in enumerate(zip(want[1:], got)):
        assert np.array_equal(a, b), f"decode step {i} differs after loading the layout before"
    # neither layout's rows (a latent without its rope keys): the state file's error, naming the file and the place
    del latent[0].k_pe
    bad = tmp_path / "bad.safetensors"
    save_state(bad, m, st, tokens=TOKENS[:PREFILL])
    with pytest.raises(StateFileError, match=r"bad\.safetensors.*layers\.0.*LatentKV without its rows"):
        load_state(bad, Model(path))


def test_another_model_is_refused(synth_model, tmp_path):
    a = Model(synth_model("llama"))
    st = a.new_state()
    a.forward(TOKENS[:4], st)
    f = tmp_path / "llama.safetensors"
    save_state(f, a, st)
    with pytest.raises(StateMismatchError, match=r"llama.safetensors: a state of a llama model .* not of .*qwen3moe"):
        load_state(f, Model(synth_model("qwen3moe")))
    other = Model(synth_model("llama", seed=1))                  # the same arch and shapes, other weights
    with pytest.raises(StateMismatchError, match=r"llama.safetensors: a state of another model file: .*sha256"):
        load_state(f, other)
    short = Model(synth_model("llama"), n_ctx=3)
    with pytest.raises(StateMismatchError, match="n_ctx = 3"):
        load_state(f, short)
    assert isinstance(StateMismatchError("x"), StateFileError)


@pytest.fixture
def saved(synth_model, tmp_path):
    m = Model(synth_model("deepseek32"))
    st = m.new_state()
    m.forward(TOKENS[:5], st)
    f = tmp_path / "s.safetensors"
    save_state(f, m, st, logits=None)
    return m, f


def test_truncated_or_corrupt_file_is_refused(saved, tmp_path):
    m, f = saved
    data = f.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    bad = tmp_path / "bad.safetensors"
    for cut in (0, 5, 8 + hlen // 2, 8 + hlen, len(data) - 1):     # in the length, the header, the data
        bad.write_bytes(data[:cut])
        with pytest.raises(StateFileError, match="bad.safetensors"):
            load_state(bad, m)
    flipped = bytearray(data)                                    # one bit of the last tensor's bytes
    flipped[-1] ^= 1
    bad.write_bytes(bytes(flipped))
    with pytest.raises(StateFileError, match=r"bad.safetensors: corrupt state file: .* do not match their sha256"):
        load_state(bad, m)
    bad.write_bytes(b"not a state file at all")
    with pytest.raises(StateFileError, match="bad.safetensors"):
        load_state(bad, m)
    with pytest.raises(StateFileError, match="no such state file"):
        load_state(tmp_path / "missing.safetensors", m)


def _rewrite_manifest(f, out, edit):
    """The same tensors with an edited manifest."""
    from safetensors.numpy import load_file, save_file
    with open(f, "rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        meta = json.loads(fh.read(hlen))["__metadata__"]
    man = json.loads(meta["refengine.state"])
    edit(man)
    save_file(load_file(f), out, metadata={"refengine.state": json.dumps(man)})


def test_manifest_checks(saved, tmp_path):
    m, f = saved
    assert read_manifest(f)["version"] == 1
    bad = tmp_path / "bad.safetensors"
    _rewrite_manifest(f, bad, lambda man: man.update(version=99))
    with pytest.raises(StateFileError, match="format version 99"):
        load_state(bad, m)
    _rewrite_manifest(f, bad, lambda man: man["tree"]["fields"]["layers"]["list"][0].update(container="NoSuchCache"))
    with pytest.raises(StateFileError, match=r"state.layers.0 is a 'NoSuchCache', a state container this refengine"):
        load_state(bad, m)
    from safetensors.numpy import save_file
    save_file({"x": np.zeros(3, np.float32)}, bad)               # a safetensors file, but no state
    with pytest.raises(StateFileError, match="not a refengine state file"):
        load_state(bad, m)


# ---------------------------------------------------------------- what a container may hold

@state_container
@dataclass
class EveryKind:
    """A test container holding each attribute kind the format knows."""
    a: object = None


@state_container
class Pooled(Rows):
    """A Rows subclass adding no attribute: saved as rows (used rows only), restored as its class."""


class PooledUnregistered(Rows):
    pass


class PooledWithMore(Rows):
    def __init__(self):
        super().__init__()
        self.start = 0


@state_container
class Opaque:
    def __init__(self, x):
        self.x = x


def _every_kind(i):
    r = Rows(np.float16)
    r.append(np.arange(6, dtype=np.float16).reshape(3, 2) + i)
    empty = Rows(np.int32)
    empty.append(np.zeros((0, 4), np.int32))
    return EveryKind(a={"none": None, "bool": True, "int": -(2**62) - i, "str": "absorbed", "nan": float("nan"),
                        "neg0": -0.0, "f": 1 / 3 + i, "np": np.float16(2.5), "u8": np.uint8(200),
                        "dt": np.dtype(np.int8),
                        "arr": np.arange(12, dtype=np.int64).reshape(3, 4) * i, "zero_d": np.array(True),
                        "rows": r, "never": Rows(), "empty": empty,
                        "pooled": Pooled.holding(np.ones((2, 3)), np.float64),
                        "tuple": (1, [2.0, "x"]), "list": [],
                        "nested": Opaque(np.ones((2, 2), np.complex64) * i)})


def test_every_attribute_kind_round_trips(synth_model, tmp_path):
    m = Model(synth_model("llama"))
    st = ModelState(layers=[_every_kind(i) for i in range(m.cfg.n_layer)], n_past=0)
    f = tmp_path / "k.safetensors"
    man = save_state(f, m, st)
    back = load_state(f, m)
    for x, y in zip(st.layers, back.layers):
        a, b = x.a, y.a
        assert type(y) is EveryKind and set(a) == set(b)
        for k in ("none", "bool", "int", "str", "f", "tuple", "list"):
            assert type(a[k]) is type(b[k]) and a[k] == b[k], k
        assert np.isnan(b["nan"]) and str(b["neg0"]) == "-0.0"
        for k in ("np", "u8", "arr", "zero_d"):
            assert type(a[k]) is type(b[k]) and a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        assert b["dt"] == np.int8 and b["never"].view() is None and b["never"].dtype == np.float32
        assert b["empty"].view().shape == (0, 4) and b["empty"].dtype == np.int32
        assert b["rows"].dtype == np.float16 and np.array_equal(b["rows"].view(), a["rows"].view())
        assert b["rows"].append(np.zeros((1, 2), np.float16)).shape == (4, 2)      # it goes on growing
        assert type(b["pooled"]) is Pooled and np.array_equal(b["pooled"].view(), np.ones((2, 3)))
        assert type(b["nested"]) is Opaque and np.array_equal(b["nested"].x, a["nested"].x)
    assert "state.layers.0.a.rows" in man["sha256"] and "state.layers.0.a.never" not in man["sha256"]


@pytest.mark.parametrize("what,value,message", [
    ("a set", {1, 2}, r"state.layers.0.a: a builtins.set, which a state file cannot hold"),
    ("an unregistered class", type("Unregistered", (), {})(), r"state.layers.0.a: a .*Unregistered, which"),
    ("an object array", np.array([None, 1]), r"state.layers.0.a: an array of dtype object"),
    ("an int subclass", type("Flag", (int,), {})(1), r"state.layers.0.a: a .*Flag, which"),
    ("a non-str dict key", {1: 2}, r"state.layers.0.a: a dict with the key 1"),
    ("an unregistered Rows subclass", PooledUnregistered(),
     r"state.layers.0.a: a PooledUnregistered, a Rows subclass not registered"),
    ("a Rows subclass with more", PooledWithMore(), r"a Rows subclass with attributes of its own \(start\)"),
])
def test_unknown_attribute_is_refused_at_save(synth_model, tmp_path, what, value, message):
    m = Model(synth_model("llama"))
    st = ModelState(layers=[EveryKind(value)] + [EveryKind() for _ in range(m.cfg.n_layer - 1)])
    with pytest.raises(StateFileError, match=message):
        save_state(tmp_path / "x.safetensors", m, st)
    assert not os.path.exists(tmp_path / "x.safetensors")


def test_shared_object_is_refused(synth_model, tmp_path):
    m = Model(synth_model("llama"))
    shared = np.zeros(3, np.float32)
    st = ModelState(layers=[EveryKind(shared) for _ in range(m.cfg.n_layer)])
    with pytest.raises(StateFileError, match=r"state.layers.1.a: it is the same ndarray object as state.layers.0.a"):
        save_state(tmp_path / "x.safetensors", m, st)


# ---------------------------------------------------------------- the command line

def _run(*args):
    r = subprocess.run([sys.executable, "-m", "refengine.cli", "run", *map(str, args)], capture_output=True, text=True,
                       timeout=300, check=False)
    return r.returncode, r.stdout.split(), r.stderr


def test_cli_save_then_load_state(synth_model, tmp_path):
    """`run -n 6` == `run -n 3 --save-state F` then `run --load-state F -n 3` (the ids; the logits are the same
    floats: the same forwards in the same order)."""
    path = synth_model("qwen3next")
    prompt = ",".join(map(str, TOKENS[:PREFILL]))
    rc, whole, err = _run(path, "--tokens", prompt, "-n", 6)
    assert rc == 0, err
    f = tmp_path / "s.safetensors"
    rc, first, err = _run(path, "--tokens", prompt, "-n", 3, "--save-state", f)
    assert rc == 0, err
    assert "[state: 9 positions" in err
    rc, rest, err = _run(path, "--load-state", f, "-n", 3)
    assert rc == 0, err
    assert first + rest == whole
    # a continuation given: appended to the saved sequence
    rc, _, err = _run(path, "--load-state", f, "--tokens", "5,7", "-n", 2,
                         "--save-state", tmp_path / "t.safetensors")
    assert rc == 0, err
    assert read_manifest(tmp_path / "t.safetensors")["n_past"] == 9 + 2 + 2
    # another model: exit 2, one line naming the state file
    rc, _, err = _run(synth_model("llama"), "--load-state", f, "-n", 1)
    assert rc == 2 and err.strip().splitlines()[-1].startswith(f"refengine: error: {f}: a state of a qwen3next model")


def test_cli_help_names_the_state_options():
    r = subprocess.run([sys.executable, "-m", "refengine.cli", "run", "--help"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and "--save-state F" in r.stdout and "--load-state F" in r.stdout


def test_shared_tuple_is_fine(synth_model, tmp_path):
    """Immutable tuples may be shared (the empty tuple always is)."""
    m = Model(synth_model("llama"))
    st = ModelState(layers=[EveryKind(()) for _ in range(m.cfg.n_layer)])
    save_state(tmp_path / "x.safetensors", m, st)
    assert [x.a for x in load_state(tmp_path / "x.safetensors", m).layers] == [()] * m.cfg.n_layer


def test_model_sha256_cached_per_path_size_mtime(synth_model, tmp_path, monkeypatch):
    """Hashed once per (path, size, mtime): in the process, and on disk for big files (here: every file)."""
    import shutil

    from refengine import state_file
    from refengine.golden import write
    calls = []
    real = write.sha256_file
    monkeypatch.setattr(write, "sha256_file", lambda paths, progress=False: calls.append(paths) or real(paths))
    monkeypatch.setattr(state_file, "DISK_CACHE_MIN", 0)
    monkeypatch.setattr(state_file, "_SHA256", {})
    monkeypatch.setenv("REFENGINE_CACHE_DIR", str(tmp_path / "cache"))
    p = tmp_path / "m.gguf"
    shutil.copy(synth_model("llama"), p)
    h = state_file.model_sha256([str(p)])
    assert state_file.model_sha256([str(p)]) == h and len(calls) == 1
    monkeypatch.setattr(state_file, "_SHA256", {})                # a new process: read from the disk cache
    assert state_file.model_sha256([str(p)]) == h and len(calls) == 1
    assert os.path.exists(tmp_path / "cache" / "sha256.json")
    os.utime(p, ns=(0, 12345))                                    # another mtime: hashed again
    assert state_file.model_sha256([str(p)]) == h and len(calls) == 2
