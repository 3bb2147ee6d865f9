"""The GPU's fused ops as the modules reach them (`ops.arrays.fused_op`), checked without a GPU: the sim device is
given a stand-in for `refengine/cuda/fused.py` whose ops compute their NumPy statement on the device's arrays, so
what a GPU run relies on around the kernel is checked in CI: that the modules call the op where its NumPy steps
stood (`cache.Rows.append`'s fixed-shape write, `moe.router.expert_weights`), that the state advances as the steps
would have advanced it, and that a trace still gets every step's tensor under llama.cpp's name (the router computes
them from the NumPy steps only when a trace keeps one). The kernels themselves: tests/test_fused.py."""
import collections

import numpy as np
import pytest

from refengine.cuda.standin import rope_append_np
from refengine.model import Model
from refengine.moe.router import expert_weights
from refengine.runtime import Runtime
from refengine.trace import Trace

TOKENS = [3, 17, 101, 5, 250, 42, 7, 9, 44]


class StandIn:
    """The two ops, each its NumPy statement on the host views of the sim device's arrays."""

    def __init__(self):
        self.calls = collections.Counter()

    FLAG_BATCH = 8

    def all_finite_many(self, ys, page, cells):
        return [False] * len(ys)                          # (the runtime's own flags then)

    def expert_weights(self, probs, ids, norm_w, scale):
        self.calls["expert_weights"] += 1
        w = expert_weights(probs.raw, ids.raw, gating=1, norm_w=norm_w, w_scale=scale or 0.0)   # host arrays
        return probs.dev.wrap(w)

    def append_rows(self, buf, x, count, buf2=None, x2=None, count2=None):
        self.calls["append_rows"] += 1
        self.calls["append_rows pairs"] += buf2 is not None        # (k and v: `cache.append_rows`)
        for b, y, c in ((buf, x, count), (buf2, x2, count2)):
            if b is not None:
                n = int(c.raw[0])
                b.raw[n:n + y.shape[0]] = y.raw
                c.raw += y.shape[0]
        return True

    def rope_append(self, q, k, v, cos, sin, n_rot, mode, kbuf, kcount, vbuf, vcount, norms=None, eps=0.0):
        self.calls["rope_append"] += 1
        self.calls["rope_append normed"] += norms is not None
        qr = rope_append_np(*(a.raw for a in (q, k, v, cos, sin)), n_rot, mode,
                            *(a.raw for a in (kbuf, kcount, vbuf, vcount)), norms, eps)      # (refengine's twin)
        return q.dev.wrap(qr)


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_expert_weights_dispatch_keeps_the_trace(synth_model, arch):
    """A traced resident forward with the fused expert weights: the same logits and every tensor the plain run
    records (ffn_moe_weights, _sum, _sum_clamped, _norm, _scaled where the arch has them), equal."""
    m = Model(synth_model(arch, wtype="Q8_0"))
    t_plain, t_fused = Trace(), Trace()
    a = m.forward(TOKENS, rt=Runtime(trace=t_plain, resident=True))
    rt = Runtime(trace=t_fused, resident=True)
    rt.device.fused = stand = StandIn()
    b = m.forward(TOKENS, rt=rt)
    assert stand.calls["expert_weights"] > 0
    assert np.array_equal(a, b)
    assert list(t_plain) == list(t_fused) and any(k.startswith("ffn_moe_weights") for k in t_plain)
    for k in t_plain:
        assert np.array_equal(t_plain[k], t_fused[k]), k


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next", "llama"])
def test_append_rows_dispatch_advances_the_cache(synth_model, arch):
    """Fixed-shape appends through the fused write, a prompt then decode steps past a cache's growth: the same
    logits as the NumPy steps' run at every step, and the caches' host counts equal."""
    m = Model(synth_model(arch, wtype="Q8_0"))
    plain, fused = Runtime(resident=True, fixed_shapes=True), Runtime(resident=True, fixed_shapes=True)
    fused.device.fused = stand = StandIn()
    st_p, st_f = m.new_state(), m.new_state()
    steps = [TOKENS[:7]] + [[t] for t in [5, 9, 12, 40, 3, 77, 18, 2, 61, 30, 8, 14]]    # 7 + 12 > 16 rows
    for toks in steps:
        a, b = m.forward(toks, st_p, rt=plain), m.forward(toks, st_f, rt=fused)
        assert np.array_equal(a, b), len(toks)
    by_rope = stand.calls["rope_append"]
    assert stand.calls["append_rows"] + by_rope > 0 and st_p.n_past == st_f.n_past
    assert stand.calls["append_rows pairs"] + by_rope > 0              # a layer's k and v by one write
    if arch in ("qwen3moe", "llama"):      # the rotation (and q / k norms) with the cache write: `gqa.rope_append`
        assert by_rope == m.cfg.n_layer * len(steps)
        assert stand.calls["rope_append normed"] == (by_rope if arch == "qwen3moe" else 0)
