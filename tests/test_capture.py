"""A decode step that could be captured as one CUDA graph and replayed, proven on the "sim" device (NumPy standing in
for the GPU, refengine.devarray): docs/device_path.md, "The next step: a decode step as one CUDA graph".

A step is capturable when (a) nothing in it synchronises with the host: it runs under `Device.strict()`, where an
upload (a weight's first one included), a read-back or a host fallback raises DeviceSyncError naming the op; and
(b) two consecutive decode tokens run the same ops on the same shapes with the same baked-in scalars: equal
`Device.recording()` signatures. The span is `Model.run_step`: the embedding of the step's token ids (on the device)
through the head; the ids and positions are put on the device before it (`Model.prepare_step`: a graph's input
copies), the logits read after it.

- every arch of `CAPTURABLE`, tiny preset, after a prefill and a warm-up decode: two decode steps pass both checks,
  and their logits equal bit for bit the host run of the same shapes (`Runtime(fixed_shapes=True)`: attention over a
  cache's capacity, the rows past the last position zeros and hidden by the causal mask);
- the fixed-shape run against the ordinary one (attention over the positions so far): the same math summed in
  another order by BLAS (a product of another width takes another kernel for its last columns), relative RMS
  <= 1e-6 (TOL of tests/test_backends.py, the bound for summation order) and the same argmax; measured
  0 .. 5.5e-7 on these presets (0: deepseek32, glm-dsa, deepseek4);
- the other archs: xfail(strict=True), each naming the first thing the strict span stops at;
- controls that the checks can fail: an ordinary resident run (the cache grows a row per token) records different
  signatures, and strict() names the op of an upload, a read-back, a weight's first use and an op whose result's
  shape comes from the data (np.nonzero, a boolean mask: CuPy reads the count back).
"""
import numpy as np
import pytest

from refengine.devarray import Device
from refengine.errors import DeviceSyncError
from refengine.model import Model
from refengine.runtime import Runtime

from numerics import assert_close

TOKENS = [3, 17, 101, 5, 250, 42, 7] + list(range(40, 53))
TOL = 1e-6              # float summation order only (tests/test_backends.py)

CAPTURABLE = ["deepseek2", "llama", "qwen3moe", "qwen3next", "kimi-linear", "kimi-k3", "deepseek32", "glm-dsa",
              "qwen4exp", "deepseek4", "glm5-next"]
# arch -> the first thing its decode step's strict span stops at (docs/device_path.md, "What is capturable")
NOT_YET: dict = {}


def decode_checked(m, rt, st, tokens):
    """Decode `tokens` one at a time, each step's span under strict() and recorded -> (logits, signatures, counters
    inside the spans)."""
    dev = rt.device
    logits, sigs, inside = [], [], []
    for tok in tokens:
        step = m.prepare_step([tok], st, rt)                   # the ids and positions put on the device: outside
        before = dev.stats.as_dict()
        with dev.strict(), dev.recording() as sig:
            out = m.run_step(step, st, rt)
        inside.append(dev.stats.since(before))
        logits.append(rt.to_host(out))                         # the read-back (and the deferred NaN flags): outside
        sigs.append(sig)
    return logits, sigs, inside


def prefilled(m, rt, prompt=TOKENS):
    st = m.new_state()
    m.forward(prompt, st, rt=rt)
    m.forward([5], st, rt=rt)                                  # warm-up decode: every weight uploaded once
    return st


@pytest.mark.parametrize("arch, variant", [(a, None) for a in CAPTURABLE] + [("deepseek2", "yarn"),
                                                                           ("deepseek2", "tiny-groups")] + [
    pytest.param(a, None, marks=pytest.mark.xfail(raises=DeviceSyncError, strict=True, reason=why))
    for a, why in NOT_YET.items()])
def test_decode_step_capturable(synth_model, arch, variant):
    """Two features of the real presets the tiny ones lack: "yarn", DeepSeek-V3's rope scaling, whose mix is a
    constant on the device; "tiny-groups", group-limited routing (its row index made on the device: a host one was
    the first upload of the H200's DeepSeek-V3 cut)."""
    kw = {"yarn": {"rope_scaling": "yarn"}, "tiny-groups": {"preset": "tiny-groups"}, None: {}}[variant]
    m = Model(synth_model(arch, wtype="Q4_K", **kw))
    assert variant != "yarn" or m.cfg.yarn_ext_factor != 0.0
    assert variant != "tiny-groups" or any(getattr(s.moe, "n_groups", 0) > 1 for s in m.cfg.layers
                                           if getattr(s, "moe", None) is not None)
    check_capturable(m, arch, TOKENS)


UBATCH_NOT_YET: dict = {}          # arch -> what its ubatch step stops at (deepseek4's compressor: session 22)


@pytest.mark.parametrize("arch", [a for a in CAPTURABLE if a not in UBATCH_NOT_YET] + [
    pytest.param(a, marks=pytest.mark.xfail(raises=DeviceSyncError, strict=True, reason=why))
    for a, why in UBATCH_NOT_YET.items()])
def test_ubatch_step_capturable(synth_model, arch):
    """A step of 8 tokens (a prefill's ubatch) under the decode step's checks: nothing in it syncs with the host,
    two consecutive ubatches run the same ops on the same shapes, and its logits equal the host run of the same
    shapes. What a prefill captured once per ubatch size and replayed for every ubatch of that size needs. The
    routed experts' ids stay on the device in a fixed-shape run (their group tables built there on a GPU:
    quant/cuda/resident.py `_ids_on_device`); before session 22 every MoE arch stopped at their read-back, and
    deepseek4 also at its compressor's blocks listed on the host (kv_compressor.compress_fixed: now found from the
    ubatch's first position on the device)."""
    m = Model(synth_model(arch, wtype="Q4_K"))
    rt, host, plain = Runtime(resident=True, fixed_shapes=True), Runtime(fixed_shapes=True), Runtime()
    st_d, st_h, st_p = m.new_state(), m.new_state(), m.new_state()
    for r, st in ((rt, st_d), (host, st_h), (plain, st_p)):
        m.forward(TOKENS, st, rt=r)                            # 20 rows: the caches' capacity 40 holds two more
    dev, sigs = rt.device, []
    for chunk in (list(range(60, 67)), list(range(80, 87))):   # 7 tokens: ubatches that start inside a block
        step = m.prepare_step(chunk, st_d, rt)
        before = dev.stats.as_dict()
        with dev.strict(), dev.recording() as sig:
            out = m.run_step(step, st_d, rt)
        d = dev.stats.since(before)
        assert d["uploads"] == d["downloads"] == 0 and not d["fallbacks"], d
        got, want = rt.to_host(out), m.forward(chunk, st_h, rt=host)
        assert np.array_equal(got, want), arch
        ordinary = m.forward(chunk, st_p, rt=plain)
        assert_close(f"{arch} ubatch: fixed shapes vs positions so far", want, ordinary, TOL)
        assert np.array_equal(np.argmax(want, -1), np.argmax(ordinary, -1))
        sigs.append(sig)
    assert sigs[0] == sigs[1] and len(sigs[0]) > 100


@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa", "qwen4exp", "deepseek4", "glm5-next"])
def test_fewer_keys_than_top_k(synth_model, arch):
    """A sparse decode step at a context shorter than its indexer's budget (top-k 8 in the tiny presets; 5 and 6
    positions here): the fixed-shape selection fills its slots with rows past the last position (DSA: scored -inf
    by the causal mask, sorted last; QSA: blocks not complete, dead slots; DeepSeek-V4: blocks not finished, window
    slots before position 0; the k-pool indexer: no pool finished, the tail alone), which stay hidden: the same
    checks as above. (DeepSeek-V4's first CSA block is pooled by the warm-up decode here:
    `kv_compressor.compress_fixed`'s block 0.)"""
    m = Model(synth_model(arch, wtype="Q4_K"))
    budgets = {getattr(getattr(s.attn_cfg, "indexer", s.attn_cfg), "top_k", getattr(s.attn_cfg, "idx_top_k", None))
               for s in m.cfg.layers}
    assert budgets - {None} == {8}, budgets
    check_capturable(m, arch, TOKENS[:3])


@pytest.mark.parametrize("n_prompt", [len(TOKENS), 3])
def test_qsa_under_llamacpps_rule_capturable(synth_model, n_prompt):
    """qwen4exp's QSA under llama.cpp's selection rule (`Runtime(qsa_rule="llamacpp")`: ggml_top_k's heap per query,
    `ops.top_k.ggml_top_k_rows`, over the capacity's cells): the same checks as the default rule's, after 20 tokens
    and at a context shorter than the budget's B + r - 1 cells (every visible cell kept)."""
    check_capturable(Model(synth_model("qwen4exp", wtype="Q4_K")), "qwen4exp", TOKENS[:n_prompt], qsa_rule="llamacpp")


def check_capturable(m, arch, prompt, **kw):
    rt, host, plain = Runtime(resident=True, fixed_shapes=True, **kw), Runtime(fixed_shapes=True, **kw), Runtime(**kw)
    st_d, st_h, st_p = prefilled(m, rt, prompt), prefilled(m, host, prompt), prefilled(m, plain, prompt)
    got, sigs, inside = decode_checked(m, rt, st_d, (9, 11))
    for k, (tok, g) in enumerate(zip((9, 11), got)):
        want = m.forward([tok], st_h, rt=host)
        assert np.array_equal(g, want), f"{arch}: decode {k}: the device differs from the host run of its shapes"
        ordinary = m.forward([tok], st_p, rt=plain)
        assert_close(f"{arch} decode {k}: fixed shapes vs positions so far", want, ordinary, TOL)
        assert np.argmax(want) == np.argmax(ordinary)
    assert sigs[0] == sigs[1] and len(sigs[0]) > 100, f"{arch}: two decode steps ran different ops or shapes"
    for d in inside:
        assert d["uploads"] == d["weight_uploads"] == d["downloads"] == 0 and not d["fallbacks"], d


def test_growing_cache_changes_the_signature(synth_model):
    """The control: an ordinary resident run attends over the positions so far, one row more every token."""
    m = Model(synth_model("deepseek2", wtype="Q4_K"))
    rt = Runtime(resident=True)
    _, sigs, _ = decode_checked(m, rt, prefilled(m, rt), (9, 11))           # strict passes: nothing syncs ...
    diff = [(a, b) for a, b in zip(sigs[0], sigs[1]) if a != b]
    assert diff, "an ordinary resident run recorded equal signatures"    # ... but the cache is written at row n,
    (op, args, _), (_, args2, _) = diff[0]                                 # a host int baked into the write
    assert op == "setitem" and args[1] == ("slice", 21, 22, None) and args2[1] == ("slice", 22, 23, None), diff[0]
    assert any(a[0] == "getitem" and a[2] != b[2] for a, b in diff)       # and its view grows a row per token


def test_strict_names_what_syncs():
    d = Device("sim")
    x = d.put(np.ones(4, np.float32))
    w = np.arange(4, dtype=np.float32)
    w.flags.writeable = False
    with pytest.raises(DeviceSyncError, match=r"np\.add uploads a host array float32\[4\] \(a writeable one"):
        with d.strict():
            x + np.ones(4, np.float32)
    with pytest.raises(DeviceSyncError, match="first use"):          # a weight's first upload: before the span
        with d.strict():
            x * w
    x * w                                                             # the warm-up: uploaded once
    with d.strict(), d.recording() as sig:                            # now cached: no copy
        y = x * w + 1
    assert [op for op, _, _ in sig] == ["np.multiply", "np.add"]
    assert sig[0][1][0] == (("dev", (4,), "<f4"), ("host", (4,), "<f4")), sig[0]
    with pytest.raises(DeviceSyncError, match="reads a device array float32"):
        with d.strict():
            float(y.sum())
    with pytest.raises(DeviceSyncError, match="reads a device array"):
        with d.strict():
            np.asarray(y)
    for shaped_by_data in (lambda: np.flatnonzero(y), lambda: y.nonzero(), lambda: y[y > 1]):
        with pytest.raises(DeviceSyncError, match="sizes its result from the data"):  # CuPy reads a count back
            with d.strict():
                shaped_by_data()
    with d.recording() as a:                                          # a per-call Python int is in the signature
        x[1:2]
    with d.recording() as b:
        x[2:3]
    assert a != b
    with d.strict():                                                  # made on the device through like=
        r = np.arange(4, like=x)
    assert type(r).__name__ == "DeviceArray" and r.shape == (4,)
    assert d.stats.uploads == d.stats.weight_uploads == 1 and d.stats.downloads == 0, d.stats   # none got through


def test_strict_names_a_product_a_gpu_would_fall_back_on(synth_model, monkeypatch):
    """The sim device models the GPU's refusals: a weight the GPU kernels do not take (qwen4exp tiny's hc_attn_up,
    F16 [1024, 16]: rows not whole 32-value chunks) is a host fallback there, a read-back a capture cannot hold. With
    `Runtime._float_matrix` (the GPU's float32 copy on the device) it is served; without it strict() names it."""
    m = Model(synth_model("qwen4exp", wtype="Q4_K"))
    rt = Runtime(resident=True, fixed_shapes=True)
    st = prefilled(m, rt)
    monkeypatch.setattr(Runtime, "_float_matrix", lambda self, w: None)
    step = m.prepare_step([9], st, rt)
    with pytest.raises(DeviceSyncError, match=r"matmul blk\.0\.hc_attn_up\.weight \(F16 \[1024, 16\]\)"):
        with rt.device.strict():
            m.run_step(step, st, rt)


def test_strict_names_experts_a_gpu_would_read_ids_for(synth_model, monkeypatch):
    """Routed experts with a gated activation of their own (Kimi-K3's SiTU) keep one token's ids on a GPU only when
    the fast kernels take gate, up and down; the sim device models that refusal (`runtime._gpu_keeps_ids`): with the
    fast kernels refusing every type, strict() names the ids' read-back."""
    import quant.cuda.fast_specs as fs
    m = Model(synth_model("kimi-k3", wtype="Q4_K"))
    rt = Runtime(resident=True, fixed_shapes=True)
    st = prefilled(m, rt)
    step = m.prepare_step([9], st, rt)
    monkeypatch.setattr(fs, "fast_supported", lambda *a: False)
    with pytest.raises(DeviceSyncError, match="reads a device array int"):
        with rt.device.strict():
            m.run_step(step, st, rt)
