"""DeepSeek-V4's MoE: sqrt-softplus gating, token-id hash routing in the first layers, clamped SwiGLU experts.

Legend: T tokens, D model dim, V vocabulary, E experts, A active experts per token, I expert hidden dim.

    logits = h @ W_gate_inp.T                                   ffn_moe_logits          [T, E]
    probs  = sqrt(softplus(logits))                             ffn_moe_probs           [T, E]
    ids    = tid2eid[token]          (hash layers: il < hash_layer_count; `ffn_gate_tid2eid` [V, A] I32)
           | top-A of probs + exp_probs_b      (the bias chooses, it does not weigh)   ffn_moe_topk [T, A]
    w      = probs[ids], normalized (expert_weights_norm), * expert_weights_scale                   [T, A]
    y      = sum_a w[t, a] * down_e(swiglu_clamp(gate_e(h), up_e(h), L_exp))   ffn_moe_swiglu_limited, ffn_moe_out
           + down_s(swiglu_clamp(gate_s(h), up_s(h), L_shexp))                  ffn_swiglu_limited, ffn_shexp
    swiglu_clamp(g, u, L) = silu(min(g, L)) * clip(u, -L, L)    (a limit <= 1e-6: plain SwiGLU)

L_exp / L_shexp are `swiglu_clamp_exp` / `swiglu_clamp_shexp` (per layer; shexp defaults to exp).
llama.cpp: the MoE part of src/models/deepseek4.cpp:1279-1321 (`ggml_get_rows(ffn_gate_tid2eid, tokens)` passed to
`build_moe_ffn` as its selected experts) and `build_moe_ffn` / `build_ffn` (src/llama-graph.cpp:1841-1862,
:2030-2175, :2236-2262, ggml_swiglu_clamp for LLM_ARCH_DEEPSEEK4).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import WeightError
from ..ffn import dense_ffn
from ..ops.arrays import take_rows
from ..ops.activations import silu, swiglu_clamp
from ..weights import W
from .router import GATING_SQRT_SOFTPLUS, expert_weights, gate_probs, route

CLAMP_EPS = 1e-6                 # a limit at or below this is "no clamp" (llama-graph.cpp:1846, :2240)


@dataclass(frozen=True)
class HashMoEConfig:
    n_expert: int               # expert_count
    n_expert_used: int          # expert_used_count
    n_ff_exp: int               # expert_feed_forward_length
    n_ff_shexp: int             # expert_feed_forward_length * expert_shared_count
    norm_w: bool                # expert_weights_norm (required)
    w_scale: float              # expert_weights_scale (required)
    hash_ids: bool              # il < hash_layer_count: routed by ffn_gate_tid2eid
    clamp_exp: float            # swiglu_clamp_exp[il]
    clamp_shexp: float          # swiglu_clamp_shexp[il] (default: clamp_exp)
    gating: int = GATING_SQRT_SOFTPLUS   # expert_gating_func: deepseek4 accepts sqrt-softplus only; glm5-next any
                                         # (sigmoid when absent), with the same clamped experts


def table(il: int, mc: HashMoEConfig) -> list[W]:
    """Router, tid2eid (hash layers) or exp_probs_b, routed experts, shared experts (deepseek4.cpp:150-172)."""
    p = f"blk.{il}."
    E, A, F, S = mc.n_expert, mc.n_expert_used, mc.n_ff_exp, mc.n_ff_shexp
    t = [W("ffn_gate_inp", p + "ffn_gate_inp.weight", lambda c, s: (E, c.n_embd), small=True)]
    if mc.hash_ids:
        t.append(W("ffn_gate_tid2eid", p + "ffn_gate_tid2eid.weight", lambda c, s: (c.n_vocab, A),
                   accepts=("I32",), refuse_others=True))
    else:
        t.append(W("exp_probs_b", p + "exp_probs_b.bias", lambda c, s: (E,), dense=True))
    t += [W("ffn_gate_exps", p + "ffn_gate_exps.weight", lambda c, s: (E, F, c.n_embd)),
          W("ffn_up_exps", p + "ffn_up_exps.weight", lambda c, s: (E, F, c.n_embd)),
          W("ffn_down_exps", p + "ffn_down_exps.weight", lambda c, s: (E, c.n_embd, F))]
    t += [W(f"ffn_{x}_shexp", p + f"ffn_{x}_shexp.weight", shape) for x, shape in (
        ("gate", lambda c, s: (S, c.n_embd)), ("up", lambda c, s: (S, c.n_embd)), ("down", lambda c, s: (c.n_embd, S)))]
    # the generic pass's .scale / .input_scale (llama-model.cpp:1634-1773): per expert for the routed experts, one
    # for the shared ones; loaded, never applied (build_moe_ffn and build_ffn are given none)
    for x, n in ([(f"{g}_exps", (E,)) for g in ("gate", "down", "up")]
                 + [(f"{g}_shexp", (1,)) for g in ("gate", "up", "down")]):
        t += [W(f"ffn_{x}_{k}_unapplied", p + f"ffn_{x}.{k}", lambda c, s, n=n: n, required=False, dense=True)
              for k in ("scale", "input_scale")]
    # deepseek4.cpp:163: the routing bias of image tokens (vision variant), TENSOR_NOT_REQUIRED; the graph takes it
    # for media input only (:1284-1288): loaded, never applied to text tokens
    t.append(W("exp_probs_b_vl_unapplied", p + "exp_probs_b_vl.bias", lambda c, s: (E,), required=False, dense=True))
    return t


def hash_route(logits: np.ndarray, tid2eid: np.ndarray, tokens: np.ndarray, *, norm_w: bool, w_scale: float,
               record=None, il: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Token-id routing: logits [T, E], tid2eid [V, A] int, tokens [T] -> ids [T, A] int32, weights [T, A].
    The router still weighs the chosen experts (sqrt-softplus probs); no bias is added."""
    rec = record or (lambda *a: None)
    probs = gate_probs(logits, GATING_SQRT_SOFTPLUS)                           # [T, E]
    rec("ffn_moe_probs", il, probs)
    ids = take_rows(tid2eid, tokens).astype(np.int32)                         # [T, A] (where the tokens live)
    rec("ffn_moe_topk", il, ids)
    return ids, expert_weights(probs, ids, gating=GATING_SQRT_SOFTPLUS, norm_w=norm_w, w_scale=w_scale,
                               record=rec, il=il)


def clamped_act(limit: float, name: str):
    """(fn(gate, up), llama.cpp's trace name) of the experts' activation: swiglu_clamp, or SwiGLU without a limit."""
    if limit > CLAMP_EPS:
        return (lambda g, u: swiglu_clamp(g, u, limit)), f"{name}_limited"
    return (lambda g, u: silu(g) * u), name


def hash_moe(h: np.ndarray, w, *, mc: HashMoEConfig, tokens, il: int, rt) -> np.ndarray:
    """h [T, D] (ffn_norm's output) -> routed + shared experts [T, D] (ffn_out)."""
    logits = rt.matmul(h, w.ffn_gate_inp)                                       # [T, E]
    rt.record("ffn_moe_logits", il, logits)
    if mc.hash_ids:
        ids, weights = hash_route(logits, tid2eid_rows(w), tokens, norm_w=mc.norm_w, w_scale=mc.w_scale,
                                  record=rt.record, il=il)
    else:
        ids, weights = route(logits, mc.n_expert_used, gating=mc.gating, bias=w.exp_probs_b,
                             norm_w=mc.norm_w, w_scale=mc.w_scale, record=rt.record, il=il)
    y = rt.moe_ffn(h, ids, weights, up=w.ffn_up_exps, gate=w.ffn_gate_exps, down=w.ffn_down_exps, il=il,
                   act=clamped_act(mc.clamp_exp, "ffn_moe_swiglu"))            # [T, D]
    rt.record("ffn_moe_out", il, y)
    s = dense_ffn(h, w, il=il, rt=rt, suffix="_shexp", scales=False,
                  glu=clamped_act(mc.clamp_shexp, "ffn_swiglu"))                # [T, D] (deepseek4.cpp:1311-1317)
    rt.record("ffn_shexp", il, s)
    out = y + s
    rt.record("ffn_out", il, out)
    return out


def tid2eid_rows(w) -> np.ndarray:
    """ffn_gate_tid2eid as an int array [V, A] (read once per loaded layer)."""
    t = getattr(w, "tid2eid_ids", None)
    if t is None:
        t = np.asarray(w.ffn_gate_tid2eid.raw).view(np.int32).reshape(w.ffn_gate_tid2eid.shape)
        n_expert = w.ffn_gate_exps.shape[0]
        bad = (t < 0) | (t >= n_expert)
        if bad.any():                             # an id outside the experts would index past ffn_*_exps
            v, a = (int(i) for i in np.argwhere(bad)[0])
            raise WeightError(f"{w.ffn_gate_tid2eid.name}: token {v} routes to expert id {int(t[v, a])}, outside "
                              f"[0, {n_expert}) ({int(bad.sum())} such entries)")
        w.tid2eid_ids = t
    return t
