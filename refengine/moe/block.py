"""The MoE feed-forward block: router + routed experts + shared experts (`build_moe_ffn`, src/llama-graph.cpp).

Legend: T tokens, D model dim, E experts, A active experts per token, I expert hidden dim.

    logits     = h @ W_gate_inp.T                               ffn_moe_logits   [T, E]
    ids, wts   = route(logits, gating, exp_probs_b, groups)     (moe/router.py)  [T, A], [T, A]
    y          = sum_a wts[t, a] * expert_{ids[t, a]}(h[t])     (moe/experts.py: SwiGLU experts)
    y         += shared_experts(h)   (dense SwiGLU, ffn_*_shexp, when expert_shared_count > 0)   ffn_shexp
                   * sigmoid(h @ ffn_gate_inp_shexp)   (Qwen3-Next's shared-expert gate: one logit per token)

The expert activation is SwiGLU, or Kimi-K3's SiTU (`MoEConfig.act`, `ffn_moe_situ`); `routed_experts` is the
routing + experts half on its own, for blocks that compute the logits elsewhere (moe/latent.py: the router
reads the full-width input, the experts a down-projected one).

`MoEConfig` holds the routing and expert math, each field read from a named GGUF key by the arch (or fixed
by its graph). `MoETensors` holds what the arch's llama.cpp loader does with the block's tensors (which it
accepts, which it requires) and whether its graph applies the loaded `.scale` tensors: loader facts the arch
passes as data to `moe_table` and to the block, each citing its line.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant import QTensor

from ..ffn.dense import dense_ffn, dense_ffn_table
from ..ops.norm import slot_sum
from ..residual.pending import PendingAdd, SlotSum
from ..weights import W
from .router import GATING_NAMES, route as route_logits

GATING = GATING_NAMES                            # expert_gating_func value -> name (moe/router.py)
GATING_IDS = {v: k for k, v in GATING_NAMES.items()}


@dataclass(frozen=True)
class MoEConfig:
    """The routing and the experts' math of one MoE layer."""
    n_expert: int               # expert_count
    n_expert_used: int          # expert_used_count (scalar or per layer)
    n_ff_exp: int               # expert_feed_forward_length
    gating: str = "softmax"     # expert_gating_func (GATING); llama / qwen3moe: softmax, fixed by the graph
    norm_w: bool = True         # expert_weights_norm; llama / qwen3moe: true, fixed by the graph
    w_scale: float = 0.0        # expert_weights_scale (0 or 1: no scaling)
    n_groups: int = 0           # expert_group_count (0 / 1: no group-limited routing)
    n_group_used: int = 0       # expert_group_used_count
    n_shared: int = 0           # expert_shared_count
    n_ff_shexp: int = 0         # hidden size of the shared experts (n_ff_exp * n_shared for deepseek2)
    act: str = "silu"           # expert activation: "silu" (SwiGLU) | "situ" (Kimi-K3, ops.activations.situ)
    situ_beta: float = 0.0      # activation.situ_beta (act = "situ")
    situ_linear_beta: float = 0.0   # activation.situ_linear_beta (<= 0: the up branch is not capped)
    n_latent: int = 0           # expert_latent_length: routed experts run at this width (0: at D; moe/latent.py)
    shexp_gate: bool = False    # the shared experts' output is scaled by sigmoid(h @ ffn_gate_inp_shexp) [T, 1]
                                # (qwen3next.cpp:597-607)


PROBS_BIAS = ("absent", "optional", "required")     # MoETensors.probs_bias


@dataclass(frozen=True)
class MoETensors:
    """What one arch's llama.cpp loader does with the MoE block's tensors, and whether its graph applies the
    loaded `.scale` tensors: not math (the routing is the same whichever an arch has). The defaults are the plain
    block's; an arch states what differs, citing the create_tensor / build_moe_ffn line of its llama.cpp file."""
    optional_gate: bool = False     # ffn_gate_exps is created TENSOR_NOT_REQUIRED (llama.cpp's llama loader, for
                                    # Mixtral files without it: the graph then runs act = silu(up))
    probs_bias: str = "absent"      # exp_probs_b.bias: "absent" (not created: a file's copy is an unused tensor),
                                    # "optional" (created TENSOR_NOT_REQUIRED) | "required" (created with flags 0)
    fused_gate_up: bool = False     # the loader creates a fused ffn_gate_up_exps when the file has one (the graph
                                    # views one mul_mat_id result, llama-graph.cpp:2183-2201), else gate and up
    apply_scales: bool = True       # the experts' and shared experts' `.scale` (loaded by the generic pass,
                                    # llama-model.cpp:1634-1773) reach build_moe_ffn / build_ffn; False: passed NULL

    def __post_init__(self):
        if self.probs_bias not in PROBS_BIAS:
            raise ValueError(f"MoETensors.probs_bias {self.probs_bias!r} is not one of {', '.join(PROBS_BIAS)}")


def moe_table(gf, il: int, mc: MoEConfig, tensors: MoETensors) -> list[W]:
    """Router, routed experts (separate or fused gate+up), optional per-expert scales, exp_probs_b, shared experts;
    which of them the loader accepts or requires: `tensors`."""
    p = f"blk.{il}."
    E, F = (lambda c, s: mc.n_expert), (lambda c, s: mc.n_ff_exp)
    Dm = (lambda c, s: mc.n_latent) if mc.n_latent > 0 else (lambda c, s: c.n_embd)   # the experts' width
    PER_EXPERT = lambda c, s: (mc.n_expert,)                         # noqa: E731
    t = [W("ffn_gate_inp", p + "ffn_gate_inp.weight", lambda c, s: (E(c, s), c.n_embd), small=True)]  # full width
    if tensors.probs_bias != "absent":
        t.append(W("exp_probs_b", p + "exp_probs_b.bias", PER_EXPERT, required=tensors.probs_bias == "required",
                   dense=True))
    if tensors.fused_gate_up and p + "ffn_gate_up_exps.weight" in gf:
        t.append(W("ffn_gate_up_exps", p + "ffn_gate_up_exps.weight", lambda c, s: (E(c, s), 2 * F(c, s), Dm(c, s))))
    else:
        t += [W("ffn_gate_exps", p + "ffn_gate_exps.weight", lambda c, s: (E(c, s), F(c, s), Dm(c, s)),
                required=not tensors.optional_gate),
              W("ffn_up_exps", p + "ffn_up_exps.weight", lambda c, s: (E(c, s), F(c, s), Dm(c, s)))]
    t.append(W("ffn_down_exps", p + "ffn_down_exps.weight", lambda c, s: (E(c, s), Dm(c, s), F(c, s))))
    for x in ("gate", "down", "up"):
        t += [W(f"ffn_{x}_exps_scale", p + f"ffn_{x}_exps.scale", PER_EXPERT, required=False, dense=True),
              W(f"ffn_{x}_exps_input_scale", p + f"ffn_{x}_exps.input_scale", PER_EXPERT, required=False, dense=True)]
    if mc.n_shared > 0:
        t += dense_ffn_table(il, lambda c, s: mc.n_ff_shexp, suffix="_shexp")
    if mc.shexp_gate:        # ne {D} (or {D, 1}): loaded as a one-row matmul weight [1, D]
        t.append(W("ffn_gate_inp_shexp", p + "ffn_gate_inp_shexp.weight", lambda c, s: (1, c.n_embd), small=True))
    return t


def moe_matmul_inputs(norm: str = "ffn_norm", *, dense: bool, shared: bool) -> list:
    """`MATMUL_INPUTS` rows (refengine.flips) of an FFN sublayer with a SwiGLU MoE block: the normed input `norm`
    feeds the up projections and the router, the gated products feed the down projections. dense: other layers
    run a dense SwiGLU FFN (ffn_up / ffn_down); shared: the block has shared SwiGLU experts (ffn_*_shexp)."""
    up = (["blk.{il}.ffn_up.weight"] if dense else []) + ["blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight"]
    up += ["blk.{il}.ffn_up_shexp.weight"] if shared else []
    down = (["blk.{il}.ffn_down.weight"] if dense else []) + (["blk.{il}.ffn_down_shexp.weight"] if shared else [])
    rows = [(rf"{norm}-(\d+)", up)] + ([(r"ffn_swiglu-(\d+)", down)] if down else [])
    return rows + [(r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"])]


def shexp_gate(h, w, rt, il):
    """sigmoid(h @ ffn_gate_inp_shexp): h [T, D] -> [T, 1] (`build_lora_mm` of a {D} weight, then ggml_sigmoid)."""
    from ..ops import sigmoid
    g = rt.matmul(h, w.ffn_gate_inp_shexp)                              # [T, D] @ [1, D].T -> [T, 1]
    rt.record("shared_expert_gate", il, g)
    g = sigmoid(g)
    rt.record("shared_expert_gate_sigmoid", il, g)
    return g


def split_gate_up(w) -> tuple[QTensor, QTensor]:
    """The fused `ffn_gate_up_exps` [E, 2I, D] as gate = rows [0, I) and up = rows [I, 2I) of every expert
    (llama.cpp: views of one mul_mat_id result, src/llama-graph.cpp build_moe_ffn). The halves are views of the
    mapped file (expert e's rows contiguous, the experts 2I rows apart), made once per loaded layer: nothing is
    copied up front, whatever the model's size (the products take the experts a call uses, quant/cpu/matmul.py
    grouped_matmul; an upload to a GPU, or an expert cache's slot, copies what it moves)."""
    split = getattr(w, "ffn_gate_up_split", None)
    if split is None:
        t = w.ffn_gate_up_exps
        E, I2, D = t.shape
        I = I2 // 2
        split = w.ffn_gate_up_split = (QTensor(t.name + "[gate]", t.type, (E, I, D), t.raw[:, :I]),
                                       QTensor(t.name + "[up]", t.type, (E, I, D), t.raw[:, I:]))
    return split


def route(logits, w, mc: MoEConfig, k: int, *, record, il):
    """Router logits [T, E] -> ids [T, A], weights [T, A] (moe/router.py; exp_probs_b biases selection only)."""
    return route_logits(logits, k, gating=GATING_IDS[mc.gating], bias=getattr(w, "exp_probs_b", None),
                        norm_w=mc.norm_w, w_scale=mc.w_scale, n_groups=mc.n_groups,
                        n_group_used=mc.n_group_used, record=record, il=il)


def expert_act(mc: MoEConfig):
    """The routed experts' gated activation for `rt.moe_ffn(act=...)`: None (SwiGLU) or (fn, trace name)."""
    if mc.act == "silu":
        return None
    if mc.act == "situ":
        from ..ops.activations import situ
        return (lambda g, u: situ(g, u, mc.situ_beta, mc.situ_linear_beta)), "ffn_moe_situ"
    raise ValueError(f"expert activation {mc.act!r} is not one of silu, situ")


def routed_experts(h, logits, w, *, mc: MoEConfig, tensors: MoETensors, spec, il, rt, slots: bool = False):
    """Routing of `logits` [T, E] and the routed experts on h [T, Dm] -> [T, Dm] (`build_moe_ffn` given its
    logits; Dm = D, or the latent width of moe/latent.py). The experts' `.scale` apply if `tensors.apply_scales`.
    slots: -> [T, A', Dm], their sum over A' in order the output (`rt.moe_ffn(..., slots=True)`)."""
    ids, weights = route(logits, w, mc, spec.n_expert_used, record=rt.record, il=il)   # [T, A], [T, A]
    if getattr(w, "ffn_gate_up_exps", None) is not None:
        gate, up = split_gate_up(w)
    else:
        gate, up = w.ffn_gate_exps, w.ffn_up_exps
    sc = (lambda t: t) if tensors.apply_scales else (lambda t: None)
    kw = {} if mc.act == "silu" else {"act": expert_act(mc)}
    parts, record = {}, None
    if getattr(w, "ffn_gate_up_exps", None) is not None:
        def record(name, il_, value):            # keep gate and up: llama.cpp traces their fused product
            rt.record(name, il_, value)
            parts[name] = value
    y = rt.moe_ffn(h, ids, weights, up=up, gate=gate, down=w.ffn_down_exps,
                   up_scale=sc(w.ffn_up_exps_scale), gate_scale=sc(w.ffn_gate_exps_scale),
                   down_scale=sc(w.ffn_down_exps_scale), il=il, record=record, slots=slots, **kw)   # [T, Dm]
    if "ffn_moe_gate" in parts and "ffn_moe_up" in parts:   # one mul_mat_id, [T, A, 2I] (llama-graph.cpp:2183-2201)
        rt.record("ffn_moe_gate_up", il, np.concatenate([parts["ffn_moe_gate"], parts["ffn_moe_up"]], axis=-1))
    rt.record("ffn_moe_out", il, (lambda: slot_sum(y)) if slots else y)
    return y


def moe_block(h, w, *, mc: MoEConfig, tensors: MoETensors, spec, il, rt, pending: bool = False):
    """h [T, D] -> [T, D] (routed experts, plus the shared experts when the layer has them; their `.scale` apply
    if `tensors.apply_scales`). pending: -> the sum unmade, `SlotSum` (residual/pending.py: the routed slots and the
    shared experts' output, added by the next norm with the residual: one launch on a GPU)."""
    rt.prefetch(h, [w.ffn_gate_inp] + ([w.ffn_up_shexp, w.ffn_gate_shexp] if mc.n_shared > 0 else [])
                + ([w.ffn_gate_inp_shexp] if mc.shexp_gate else []))    # h's products, one a weight type on a GPU
    logits = rt.matmul(h, w.ffn_gate_inp)                                # [T, E]
    rt.record("ffn_moe_logits", il, logits)
    y = routed_experts(h, logits, w, mc=mc, tensors=tensors, spec=spec, il=il, rt=rt, slots=pending)
    s = None                                                             # [T, D] (pending: the slots [T, A', D])
    if mc.n_shared > 0:
        s = dense_ffn(h, w, il=il, rt=rt, suffix="_shexp", scales=tensors.apply_scales)   # [T, D]
        rt.record("ffn_shexp", il, s)
        if mc.shexp_gate:
            s = s * shexp_gate(h, w, rt, il)                             # [T, D] * [T, 1]
            rt.record("ffn_shexp_gated", il, s)
    if pending:
        y = SlotSum(y, s)                  # y + s unmade: the next norm sums the slots, s and the residual
        total = y.total
    elif s is not None:
        y = total = y + s
    if s is not None:
        rt.record("ffn_out", il, total)
    return y


def ffn_sublayer(x, w, *, cfg, spec, il, rt, moe_tensors: MoETensors, dense_scales: bool = True, a=None):
    """The second half of a pre-norm block: x + FFN(rms_norm(x) * ffn_norm), dense or MoE by the layer's kind.
    x [T, D] -> the sum handed on unmade, `PendingAdd(x, FFN(...))` (residual/pending.py: the next block's first
    norm or the head's makes it, `add_norm`: one launch on a GPU); traces ffn_norm, ffn_out (dense) / the MoE
    block's names, and l_out (the sum, made when read). dense_scales: the dense FFN applies its `.scale` tensors;
    moe_tensors: the arch's MoETensors. a: the token mixer's output, added to x here first (traced as ffn_inp) with
    the norm after it (`add_rms_norm`: one launch on a GPU)."""
    from ..ops import add_rms_norm, rms_norm
    if a is None:
        h = rms_norm(x, w.ffn_norm, cfg.rms_eps)
    else:
        x, h = add_rms_norm(x, a, w.ffn_norm, cfg.rms_eps)
        rt.record("ffn_inp", il, x)
    rt.record("ffn_norm", il, h)
    if spec.ffn == "dense":
        f = dense_ffn(h, w, il=il, rt=rt, scales=dense_scales)
        rt.record("ffn_out", il, f)
    else:
        f = moe_block(h, w, mc=spec.moe, tensors=moe_tensors, spec=spec, il=il, rt=rt, pending=True)
    x = PendingAdd(x, f)
    rt.record("l_out", il, x.total)
    return x
