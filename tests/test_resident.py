"""The device-resident forward (refengine.devarray, `Runtime(resident=True)`) on the "sim" device: NumPy standing
in for the GPU, the same code path as on CuPy (every NumPy call dispatched through DeviceArray, products through
`Runtime.matmul` / `moe_ffn` / `matmul_heads` on the device buffers, the caches grown where the activations live).

- every registered arch's tiny preset: resident == host, bit for bit, at prefill and at decode steps (the sim
  device runs NumPy's own functions on the same arrays, so nothing but the wrapping differs);
- a state saved from a resident run loads and decodes bit-identically on the host;
- NaN weights are found and named by the deferred check, as by the host check (tests/test_config_errors.py);
- DeviceArray: a read-only host array is uploaded once, a writeable one every time, reads are counted.
The GPU form of the first check (CuPy, rel-RMS <= 1e-5) is tests/test_cuda_resident.py.
"""
import numpy as np
import pytest

from refengine.devarray import Device, DeviceArray
from refengine.model import Model
from refengine.runtime import Runtime

TOKENS = [3, 17, 101, 5, 250, 42, 7] + list(range(40, 53))     # 20: past the DSA / pool top-k of the tiny presets


def arch_ids():
    from refengine.archs import ARCHS
    return list(ARCHS)


@pytest.mark.parametrize("arch", arch_ids())
def test_resident_sim_equals_host(synth_model, arch):
    m = Model(synth_model(arch, wtype="Q4_K"))
    host, dev = Runtime(), Runtime(resident=True)
    st_h, st_d = m.new_state(), m.new_state()
    a, b = m.forward(TOKENS, st_h, rt=host), m.forward(TOKENS, st_d, rt=dev)
    assert type(b) is np.ndarray and np.array_equal(a, b), f"{arch}: prefill differs"
    for tok in (5, 9):
        before = dev.device.stats.as_dict()
        a, b = m.forward([tok], st_h, rt=host), m.forward([tok], st_d, rt=dev)
        assert np.array_equal(a, b), f"{arch}: decode differs"
        moved = dev.device.stats.since(before)
        assert moved["downloads"] >= 1 and not moved["fallbacks"], moved          # the logits, at least
    # the caches grew on the device: every float buffer the layers' containers hold is a DeviceArray
    host = [name for name, v in state_arrays(st_d) if v.dtype.kind == "f" and not isinstance(v, DeviceArray)]
    assert not host, f"{arch}: state arrays left on the host: {host}"


def state_arrays(state):
    """(path, array) of every array a ModelState's containers hold (Rows buffers included), walked recursively."""
    from refengine.cache import Rows
    out = []

    def walk(v, path):
        if isinstance(v, (np.ndarray, DeviceArray)):
            out.append((path, v))
        elif isinstance(v, Rows):
            if v.view() is not None:
                out.append((path, v.view()))
        elif isinstance(v, (list, tuple)):
            for i, e in enumerate(v):
                walk(e, f"{path}.{i}")
        elif isinstance(v, dict):
            for k, e in v.items():
                walk(e, f"{path}.{k}")
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            for k, e in vars(v).items():
                walk(e, f"{path}.{k}")
    walk(state.layers, "layers")
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3next"])
def test_resident_state_rehomed(synth_model, arch):
    """A state prefilled under one Runtime and continued under another: its arrays become the running Runtime's
    Device's (Device.adopt; on a GPU the fused kernels take only their own device's arrays: tests/
    test_cuda_resident.py checks the bits there), and a state saved after carries no Device."""
    m = Model(synth_model(arch, wtype="Q4_K"))
    rt1, rt2 = Runtime(resident=True), Runtime(resident=True)
    st, ref = m.new_state(), m.new_state()
    m.forward(TOKENS[:9], st, rt=rt1)
    m.forward(TOKENS[:9], ref, rt=rt1)
    assert np.array_equal(m.forward([7], st, rt=rt2), m.forward([7], ref, rt=rt1))
    arrays = [(p, v) for p, v in state_arrays(st) if isinstance(v, DeviceArray)]
    assert arrays and all(v.dev is rt2.device for _, v in arrays), \
        [p for p, v in arrays if v.dev is not rt2.device]
    assert st.home() is rt2.device and rt1.device.adopt(st.layers) == len(arrays)     # and back, each array once


def test_resident_state_file_round_trip(synth_model, tmp_path):
    from refengine.state_file import load_state, save_state
    m = Model(synth_model("deepseek2", wtype="Q4_K"))
    dev, host = Runtime(resident=True), Runtime()
    st = m.new_state()
    m.forward(TOKENS[:9], st, rt=dev)
    save_state(tmp_path / "s.safetensors", m, st)
    ref = m.new_state()
    m.forward(TOKENS[:9], ref, rt=host)
    loaded = load_state(tmp_path / "s.safetensors", m)
    assert np.array_equal(m.forward([7], loaded, rt=host), m.forward([7], ref, rt=host))
    # and a loaded (host) state continued on the device: its caches move there once
    loaded, again = load_state(tmp_path / "s.safetensors", m), load_state(tmp_path / "s.safetensors", m)
    assert np.array_equal(m.forward([9], loaded, rt=dev), m.forward([9], again, rt=host))
    assert not [name for name, v in state_arrays(loaded) if v.dtype.kind == "f" and not isinstance(v, DeviceArray)]


def test_devicearray_uploads_and_reads():
    d = Device("sim")
    w = np.arange(4, dtype=np.float32)
    w.flags.writeable = False
    x = d.put(np.ones(4, np.float32))
    y = x * w + w
    assert isinstance(y, DeviceArray) and d.stats.weight_uploads == 1 and d.stats.uploads == 1
    m = np.ones(4, np.float32)                        # writeable: may change between uses, so never cached
    x + m, x + m
    assert d.stats.uploads == 3
    assert np.array_equal(np.asarray(y), np.arange(4) * 2) and d.stats.downloads == 1
    assert float(y.sum()) == 12.0 and d.stats.downloads == 2
    h = np.ones(4, np.float32)                        # in place into a host array: computed there, written back
    h *= x + 1
    assert np.array_equal(h, np.full(4, 2, np.float32)) and d.stats.downloads == 3
    m = np.full(4, -1.0, np.float32)                  # functions writing into a host array write into it
    np.put_along_axis(m, d.put(np.array([2])), 0.0, axis=0)
    np.add.at(m, d.put(np.array([0, 0])), x[:2])
    assert np.array_equal(m, [1, -1, 0, -1]), m
    assert "put_along_axis (into a host array)" in d.stats.fallbacks
    z = np.concatenate([x, w])                        # a list of arrays: dispatched, the host one uploaded
    assert isinstance(z, DeviceArray) and z.shape == (8,)
    assert isinstance(np.empty_like(x, shape=(3, 4)), DeviceArray)


@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa", "glm5-next", "qwen4exp"])
def test_resident_ubatches_equal_host(synth_model, arch):
    """Prompts of 1, 5 and 40 tokens in ubatches of 7: the first ubatch's selection has fewer keys than top-k (the
    DSA indexer's mask is then written into a host array from device positions: once computed into a copy)."""
    m = Model(synth_model(arch, wtype="Q4_K"), n_ubatch=7)
    toks = list(np.random.default_rng(0).integers(0, 200, 40))
    for T in (1, 5, 40):
        assert np.array_equal(m.forward(toks[:T], rt=Runtime()), m.forward(toks[:T], rt=Runtime(resident=True))), T


@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa"])
def test_resident_dsa_every_key_kept_equals_host(synth_model, arch):
    """A prompt whose DSA selection keeps every key (top-k 64 >= 20 keys, >= mha.DENSE_FROM queries) attends
    masked-dense: on the device as on the host (bit-identical, nothing run on the host), then a decode step
    (gathered again)."""
    m = Model(synth_model(arch, wtype="Q4_K", overrides={"idx_top_k": 64}))
    host, dev = Runtime(), Runtime(resident=True)
    st_h, st_d = m.new_state(), m.new_state()
    for toks in (TOKENS, [5]):
        before = dev.device.stats.as_dict()
        a, b = m.forward(toks, st_h, rt=host), m.forward(toks, st_d, rt=dev)
        assert np.array_equal(a, b), (arch, len(toks))
        assert not dev.device.stats.since(before)["fallbacks"]


@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next"])
def test_resident_trace_equals_host_trace(synth_model, arch):
    """`compare --backend cuda` traces a resident run: every recorded tensor is read back and equals the host's."""
    from refengine.trace import Trace
    m = Model(synth_model(arch, wtype="Q4_K"))
    t_host, t_dev = Trace(), Trace()
    a = m.forward(TOKENS[:9], rt=Runtime(trace=t_host))
    b = m.forward(TOKENS[:9], rt=Runtime(trace=t_dev, resident=True))
    assert np.array_equal(a, b)
    assert list(t_host) == list(t_dev) and len(t_host.tensors) > 20
    for k in t_host:
        assert type(t_dev[k]) is np.ndarray and np.array_equal(t_host[k], t_dev[k]), k


def test_float_matrix_for_the_device(synth_model):
    """A small float matrix the GPU kernels refuse (qwen4exp tiny's hc_attn_up, F16 [1024, 16]: rows not whole
    32-value chunks) is multiplied on the device as a float32 copy made once (`Runtime._float_matrix`), which equals
    the reference dequantization exactly (F16 widens without rounding); quantized types, the llamacpp mode and
    matrices past FLOAT_MATRIX_MAX keep the old path."""
    import quant
    m = Model(synth_model("qwen4exp", wtype="Q8_0"))
    up, down = m.gf.tensor("blk.0.hc_attn_up.weight"), m.gf.tensor("blk.0.hc_attn_down.weight")
    assert up.type.name == "F16" and down.type.name == "Q8_0"
    rt = Runtime()
    wf = rt._float_matrix(up)
    assert wf.dtype == np.float32 and not wf.flags.writeable and np.array_equal(wf, quant.dequantize(up))
    assert rt._float_matrix(up) is wf                                      # made once
    assert rt._float_matrix(down) is None and Runtime(mode="llamacpp")._float_matrix(up) is None
    small = Runtime()
    small.FLOAT_MATRIX_MAX = 4 * up.shape[0] * up.shape[1] - 1
    assert small._float_matrix(up) is None


@pytest.mark.parametrize("yarn", [False, True])
def test_rope_tables_gathered_at_the_steps_positions(yarn):
    """On a device, rope for the step's own positions (`Device.step_positions`, checked < n_ctx) is two gathers from
    tables of every position made once by the same code: bit-identical to computing it at those positions (YaRN and
    frequency factors included), far fewer device ops a step, and gathered once a step (a second call of the same
    parameters in the step launches nothing; a new step gathers again); other positions keep the per-step
    computation."""
    from refengine.ops import rope
    dev = Device("sim")
    kw = dict(n_rot=64, base=10000.0, freq_scale=0.025 if yarn else 1.0, ext_factor=1.0 if yarn else 0.0,
              attn_factor=1.0, n_ctx_orig=4096, freq_factors=np.linspace(1, 4, 32, dtype=np.float32))
    pos_h = np.array([0, 5, 4095, 777], np.int64)
    want = rope.rope_cos_sin(pos_h, **kw)                                   # the host, per position
    pos = dev.put(pos_h)
    dev.step_positions = (pos, 4096, {})
    rope.rope_cos_sin(pos, **kw)                                            # first use: the tables made
    assert len(dev.tables) == 1
    dev.step_positions = (pos, 4096, {})                                    # the next step
    with dev.recording() as ops:
        got = rope.rope_cos_sin(pos, **kw)
    assert len(ops) == 2, [op for op, _, _ in ops]                         # two gathers
    for g, w in zip(got, want):
        assert np.array_equal(dev.get(g), w)
    with dev.recording() as ops:
        again = rope.rope_cos_sin(pos, **kw)                                # the same step: the rows it has
    assert ops == [] and all(a is g for a, g in zip(again, got))
    other = dev.put(pos_h[:2])                                              # not the step's positions: per step
    with dev.recording() as ops:
        got = rope.rope_cos_sin(other, **kw)
    assert len(ops) > 60 and len(dev.tables) == 1
    assert all(np.array_equal(dev.get(g), w[:2]) for g, w in zip(got, want))


@pytest.mark.parametrize("x_finite", [True, False])
def test_lazy_input_flags(x_finite):
    """Inside a captured step (`Runtime.lazy_inputs`) a product keeps only its output's finite flag and its input;
    the input's flag is computed after the step, only for an output that holds NaN/inf: NaN from a finite input
    still names the weight, NaN carried in from the input still does not."""
    from refengine.errors import NonFiniteError
    rt = Runtime(resident=True)
    dev = rt.device
    x = dev.put(np.array([1.0, 2.0 if x_finite else np.nan], np.float32))
    y = dev.put(np.array([np.nan, 1.0], np.float32))
    rt.lazy_inputs = True
    with dev.recording() as ops:
        rt._defer_finite("weight 'w' (Q8_0)", y, x)
    rt.lazy_inputs = False
    assert rt._finite[0][2] is x and len(ops) == 0                   # (the flag: the library's ops, not recorded)
    packed = rt.pack_deferred()
    assert packed[3] == [x] and not rt._finite
    if x_finite:
        with pytest.raises(NonFiniteError, match="weight 'w'"):
            rt.check_deferred(packed)
    else:
        rt.check_deferred(packed)


# a prefill on the device reads back the NaN/inf flags and the logits, nothing else (glm5-next's pool selection and
# qwen4exp's QSA under llama.cpp's rule replay ggml_top_k's heap per row: a kernel, `ops.top_k.ggml_top_k_rows`)
SYNC_FREE = ("llama", "qwen3moe", "deepseek2", "deepseek32", "glm-dsa", "qwen3next", "kimi-linear", "kimi-k3",
             "deepseek4", "glm5-next", "qwen4exp")


@pytest.mark.parametrize("arch", SYNC_FREE)
@pytest.mark.parametrize("T", [24, 3])
def test_resident_prefill_reads_back_flags_and_logits_only(synth_model, arch, T):
    """A read-back stops the host until the GPU has drained (benchmarks/host_syncs.py): an eager resident prefill
    keeps the routing ids (group tables built on the device), the DSA selection (whole rows sorted) and the mask
    checks on the device. 24 tokens: glm-dsa / deepseek32 gather (their top-k below the keys); 3: the small-batch
    kernels. Two read-backs: the flags, then the logits; the logits equal the host run's."""
    m = Model(synth_model(arch, wtype="Q8_0"))
    rt = Runtime(resident=True)
    ids = [(7 * i + 3) % m.cfg.n_vocab for i in range(T)]
    m.forward(ids[:2], m.new_state(), rt=rt)                              # weights uploaded
    before = rt.device.stats.as_dict()
    y = m.forward(ids, m.new_state(), rt=rt, last_only=True)
    moved = rt.device.stats.since(before)
    assert moved["downloads"] == 2 and not moved["fallbacks"], (arch, moved)
    assert np.array_equal(y, m.forward(ids, m.new_state(), rt=Runtime(), last_only=True)), arch


def test_resident_prefill_under_llamacpps_qsa_rule_reads_back_nothing_more(synth_model):
    """qwen4exp's QSA under llama.cpp's rule (`Runtime(qsa_rule="llamacpp")`): ggml_top_k's heap per query
    (`ops.top_k.ggml_top_k_rows`, a kernel on a GPU) selects where the scores are: a 24-token prefill reads back the
    flags and the logits only (before: the scores once a layer, and before that 290 read-backs, every row's
    tests); logits equal to the host run's."""
    m = Model(synth_model("qwen4exp", wtype="Q8_0"))
    rt = Runtime(resident=True, qsa_rule="llamacpp")
    ids = [(7 * i + 3) % m.cfg.n_vocab for i in range(24)]
    m.forward(ids[:2], m.new_state(), rt=rt)
    before = rt.device.stats.as_dict()
    y = m.forward(ids, m.new_state(), rt=rt, last_only=True)
    moved = rt.device.stats.since(before)
    assert moved["downloads"] == 2 and not moved["fallbacks"], moved
    assert np.array_equal(y, m.forward(ids, m.new_state(), rt=Runtime(qsa_rule="llamacpp"), last_only=True))
