"""The sim device's stand-in for refengine/cuda/fused.py: `Device.fused` on a machine without a GPU.

    dev.fused = StandIn(dev)                every fused call site reaches an entry of the same name here
    StandIn(dev, note=True)                 ... and each call is noted on the device as the one launch it is on a GPU

Each entry checks its arguments against the real entry point's signature (`inspect.signature(fused.NAME).bind`),
then computes the op by the NumPy function it stands for on the device's buffers (`numpy_twins`). Two uses:
tests/test_fused.py proves that every call site passes what its kernel takes and that the dispatch adds nothing
(a forward through the stand-ins equals the forward without them bit for bit); benchmarks/launches.py counts a
step's launches as a GPU makes them (`note=True`: the twin's own NumPy ops are not recorded, one `fused NAME` op is).
"""
from __future__ import annotations

import inspect

from . import fused


def gdn_gates_np(b, a, r, bias, A):
    """gated_deltanet.decay_gates from the kernel's inputs (the fused projection [T, Hk, 2r] when r > 0)."""
    from ..attention.gated_deltanet import decay_gates
    if r > 0:
        b, a = b[..., :r], b[..., r:]
    T = b.shape[0]
    return decay_gates(b, a, bias, A, T, b.size // T)


def group_limited_np(s, G, n):
    """router.group_limited's masked scores and the groups it chose (its record)."""
    from ..moe.router import group_limited
    rec = {}
    masked = group_limited(s, G, n, record=lambda name, il, v: rec.__setitem__(name, v))
    return masked, rec["ffn_moe_group_topk"]


def append_rows_np(buf, x, count, buf2=None, x2=None, count2=None):
    """cache.Rows.append's fixed-shape write at the device count, the count advanced (the one-block kernel's); with
    buf2 a second cache's the same (`cache.append_rows`)."""
    import numpy as np
    for b, y, c in ((buf, x, count), (buf2, x2, count2)):
        if b is not None:
            b[c + np.arange(y.shape[0])] = y
            c += y.shape[0]
    return True


def expert_weights_np(probs, ids, norm_w, scale):
    """router.expert_weights' steps (any gating but the weights' softmax) from the kernel's arguments."""
    from ..moe.router import GATING_SOFTMAX, expert_weights
    return expert_weights(probs, ids, gating=GATING_SOFTMAX, norm_w=norm_w, w_scale=0.0 if scale is None else scale)


def _routed(logits, k, gating, bias, norm_w, scale, n_groups=0, n_used=0) -> dict:
    """router.route's NumPy steps on the kernel's arguments: its recorded tensors by name, and ids and weights."""
    from ..moe.router import route
    rec: dict = {}
    rec["ids"], rec["weights"] = route(logits, k, gating=gating, bias=bias, norm_w=norm_w,
                                       w_scale=0.0 if scale is None else scale, n_groups=n_groups,
                                       n_group_used=n_used, record=lambda n, il, v: rec.__setitem__(n, v))
    return rec


def route_softmax_np(logits, k, norm_w, scale):
    """router.route's softmax steps from the kernel's arguments: (probs, ids, weights)."""
    from ..moe.router import GATING_SOFTMAX
    r = _routed(logits, k, GATING_SOFTMAX, None, norm_w, scale)
    return r["ffn_moe_probs"], r["ids"], r["weights"]


def route_sigmoid_np(logits, k, bias, norm_w, scale, n_groups=0, n_used=0):
    """router.route's sigmoid steps from the kernel's arguments: (probs, selection, ids, weights), and with groups
    (masked, groups) after them."""
    from ..moe.router import GATING_SIGMOID
    r = _routed(logits, k, GATING_SIGMOID, bias, norm_w, scale, n_groups, n_used)
    sel = r.get("ffn_moe_probs_biased", r["ffn_moe_probs"])
    out = (r["ffn_moe_probs"], sel, r["ids"], r["weights"])
    return out + ((r["ffn_moe_probs_masked"], r["ffn_moe_group_topk"]) if n_groups > 1 else ())


def norm_rope_np(x, w, eps, c, s, n, mode, x2=None, w2=None):
    """rope.rms_norm_rope's NumPy statement from the kernel's arguments; with x2 the pair (rms_norm_rope_qk)."""
    from ..ops.norm import rms_norm
    from ..ops.rope import apply_rope
    y = apply_rope(rms_norm(x, w, eps), c, s, n, mode)
    return y if x2 is None else (y, apply_rope(rms_norm(x2, w2, eps), c, s, n, mode))


def rope_append_np(q, k, v, c, s, n, mode, kbuf, kcount, vbuf, vcount, norms=None, eps=0.0):
    """gqa.rope_append's fixed-shape write from the kernel's arguments: q rotated (normed first by norms' weights
    where given) and returned; k the same and v written at the device counts, both counts advanced (`append_rows`)."""
    from ..ops.rope import apply_rope
    if norms is None:
        q, k = apply_rope(q, c, s, n, mode), apply_rope(k, c, s, n, mode)
    else:
        wq, wk = (getattr(w, "raw", w) for w in norms)          # (the sim device's own buffers, or host arrays)
        q, k = norm_rope_np(q, wq, eps, c, s, n, mode, k, wk)
    append_rows_np(kbuf, k, kcount, vbuf, v, vcount)
    return q


def pool_at_np(all_kv, all_score, b, ratio, c, K):
    """kv_compressor.pool_blocks_at's NumPy statement (host arrays: no kernel)."""
    from ..attention.kv_compressor import pool_blocks_at
    return pool_blocks_at(all_kv, all_score, b, ratio, c, K)


def _paired(one, n: int):
    """The twin of an entry taking x and n - 1 parameters, then an optional second array x2 that the same
    parameters apply to (q and k in one launch): one(x, ...), and with x2 the pair (one(x, ...), one(x2, ...))."""
    def twin(*a):
        y = one(*a[:n])
        return y if len(a) == n or a[n] is None else (y, one(a[n], *a[1:n]))
    return twin


def numpy_twins() -> dict:
    """Each fused kernel's entry point -> the NumPy function it stands for (its arguments in the entry's order)."""
    from ..attention import delta_rule, mha
    from ..attention.rope_tail import rotate_tail
    from ..attention.short_conv import causal_conv
    from ..moe.router import topk_desc
    from ..ops.activations import sigmoid, silu, situ, softplus, swiglu, swiglu_clamp
    from ..attention.kda import gates as kda_gates
    from ..ops.norm import add_rms_norm, add_slots_rms_norm, layer_norm, rms_norm, rms_norm_gated
    from ..ops.rope import apply_rope, cos_sin
    from ..ops.softmax import softmax
    from ..residual import hyper_connections as hcm
    from ..residual.gated_streams import combine as streams_combine, gated_mean
    return {
        "rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "add_slots_rms_norm": add_slots_rms_norm,
        "l2_norm": delta_rule.l2_norm, "layer_norm": layer_norm,
        "rms_norm_gated": rms_norm_gated, "kda_gates": kda_gates,
        "softmax": softmax,
        "silu": silu, "sigmoid": sigmoid,
        "softplus": softplus, "swiglu": swiglu, "situ": situ, "swiglu_clamp": swiglu_clamp,
        "delta_rule": lambda q, k, v, g, b, S, scale: delta_rule.recurrent(q, k, v, g, b, S, scale=scale),
        "causal_conv": causal_conv, "apply_rope": _paired(apply_rope, 5),
        "attention_causal": lambda q, k, v, p, s, c: mha.attention_blocked(
            q, k, v, p, s, mask_fn=mha.causal_mask if c else mha.no_mask),
        "attention_gathered": lambda q, k, v, i, lv, s, sk: mha.attention_gathered(q, k, v, i, lv, s, sinks=sk),
        "collapse": hcm.collapse, "hc_post": hcm.hc_post, "top_k": topk_desc,
        "gated_mean": gated_mean, "streams_combine": streams_combine,
        "hc_gates": lambda m, s, b, n, it, eps: hcm.gates(m, s, b, hcm.HCConfig(n, it, eps, 0.0)),
        "group_limited": group_limited_np, "gdn_gates": gdn_gates_np,
        "append_rows": append_rows_np, "expert_weights": expert_weights_np,
        "rope_cos_sin": cos_sin,
        "rope_tail": _paired(rotate_tail, 5),
        "norm_rope": norm_rope_np, "rope_append": rope_append_np,
        "route_softmax": route_softmax_np, "route_sigmoid": route_sigmoid_np,
        "pool_at": pool_at_np,
    }


# The real entries' declines that depend on sizes a tiny preset reaches (a prefill's queries): the stand-in declines
# them too, so that a count sees the NumPy form's launches where a GPU runs that form.
DECLINES = {
    "attention_gathered": lambda dev, q, *a: not fused.takes_gathered(q.shape[0], dev),
    "attention_causal": lambda dev, q, *a: not fused.takes_causal(q.shape[0], dev, q.shape[2]),
    "rms_norm_gated": lambda dev, x, *a: x.shape[-1] > fused.WARP_ROW_MAX_D,
}


class StandIn:
    """Device.fused for the sim device (above); `hits` counts the calls per entry."""

    FLAG_BATCH = fused.FLAG_BATCH

    def __init__(self, dev, note: bool = False):
        self.dev, self.twins, self.hits, self.noting = dev, numpy_twins(), {}, note
        self.strided: dict = {}         # entry -> calls given a strided device array (a GPU's kernel compiled for
        #                                 any layout, quant/cuda/fastlaunch.py; entries needing C rows copy or decline)

    def all_finite_many(self, *a):
        inspect.signature(fused.all_finite_many).bind(*a)
        self.hits["all_finite_many"] = self.hits.get("all_finite_many", 0) + 1
        return [False] * len(a[0])                        # the flags then written by the NumPy path

    def __getattr__(self, name):
        if name not in self.twins:
            raise AttributeError(name)
        sig = inspect.signature(getattr(fused, name))

        def run(*args):
            sig.bind(*args)                               # the call site passes what the kernel's entry takes
            if name in DECLINES and DECLINES[name](self.dev, *args):
                return None                               # the real entry declines it: the NumPy form runs
            self.hits[name] = self.hits.get(name, 0) + 1
            if any(getattr(a, "dev", None) is self.dev and not a.raw.flags.c_contiguous for a in args):
                self.strided[name] = self.strided.get(name, 0) + 1
            twin = self.twins[name]
            if twin is None:
                return None
            raw = [a.raw if hasattr(a, "raw") and getattr(a, "dev", None) is self.dev else a for a in args]
            res = self.dev.wrap(twin(*raw))               # (on raw buffers: nothing of the twin is noted)
            if self.noting:
                self.dev.note(f"fused {name}", args, res, lambda: twin(*raw))
            return res
        return run
