"""Grouped-query self-attention sub-block (Llama, Mistral, Qwen3): projections, q/k norms, RoPE, KV cache.

Legend: T new tokens, S cached positions, D model dim, H query heads, Hkv KV heads, K key head dim,
V value head dim, R rope dims.

    q, k, v = h @ Wq.T (*s_q) + b_q, ...   (or one fused attn_qkv)      Qcur/Kcur/Vcur [T, H|Hkv, K]
    q, k    = rms_norm(q) * q_norm, ...     (Qwen3: per-head norms)      Qcur_normed, Kcur_normed
    q, k    = rope(q), rope(k)              (first R dims, NORM or NEOX pairs)
    K, V    = cache <- k, v                                              [S, Hkv, K], [S, Hkv, V]
    o       = attention(q, K, V) (causal, 1/sqrt(K))                     kqv_out    [T, H*V]
    y       = o @ Wo.T (*s_o) + b_o                                      attn_out   [T, D]

Output gate (Qwen3-Next, `q_gate=True`): attn_q (or attn_qkv's q part) gives 2K per head, [q | gate], and
`o = o * sigmoid(gate)` before attn_output (src/models/qwen3next.cpp:236-312).

llama.cpp: `build_qkv` and `create_tensor_qkv` (src/llama-graph.cpp, src/llama-model.cpp:3396), the
generic `.scale` / `.input_scale` pass (src/llama-model.cpp:1620-1790), `build_attn`.
The layer's state is a `KVCache` (`new_state`).
"""
from __future__ import annotations

import numpy as np

from ..cache import KVCache
from ..ops import apply_rope_qk, rms_norm, rms_norm_rope_qk, sigmoid
from ..ops.arrays import fused_op
from ..ops.linear import linear, linear_many
from ..weights import W
from .mha import SparseMask, attend, causal_mask, keeps_scores, no_mask

D = lambda cfg, s: cfg.n_embd                                        # noqa: E731
QD = lambda cfg, s: s.n_head * cfg.head_dim_k                        # noqa: E731
KD = lambda cfg, s: s.n_head_kv * cfg.head_dim_k                     # noqa: E731
VD = lambda cfg, s: s.n_head_kv * cfg.head_dim_v                     # noqa: E731
ONE = lambda cfg, s: (1,)                                            # noqa: E731


def _vec(n):
    return lambda cfg, s: (n(cfg, s),)


def new_state() -> KVCache:
    return KVCache()


def gqa_table(gf, il: int, *, out_bias: bool = True, qk_norm: bool = False, q_gate: bool = False) -> list[W]:
    """The attention tensors of block il (without attn_norm, which the arch's block owns).
    q_gate: attn_q carries an output gate per head (2 * H * K rows, qwen3next.cpp:77)."""
    p = f"blk.{il}."
    QW = (lambda c, s: 2 * QD(c, s)) if q_gate else QD                   # noqa: E731  attn_q rows
    t = []
    if qk_norm:
        K = lambda c, s: (c.head_dim_k,)                             # noqa: E731
        t += [W("attn_q_norm", p + "attn_q_norm.weight", K, dense=True),
              W("attn_k_norm", p + "attn_k_norm.weight", K, dense=True)]
    if p + "attn_qkv.weight" in gf:
        QKV = lambda c, s: QW(c, s) + KD(c, s) + VD(c, s)           # noqa: E731
        t += [W("attn_qkv", p + "attn_qkv.weight", lambda c, s: (QKV(c, s), c.n_embd)),
              W("attn_qkv_bias", p + "attn_qkv.bias", _vec(QKV), required=False, dense=True),
              W("attn_qkv_scale", p + "attn_qkv.scale", ONE, required=False, dense=True),
              W("attn_qkv_input_scale", p + "attn_qkv.input_scale", ONE, required=False, dense=True)]
        if p + "attn_qkv.bias" not in gf:
            t += [W(f"attn_{x}_bias", p + f"attn_{x}.bias", _vec(n), required=False, dense=True)
                  for x, n in (("q", QW), ("k", KD), ("v", VD))]
    else:
        for x, n in (("q", QW), ("k", KD), ("v", VD)):
            t += [W(f"attn_{x}", p + f"attn_{x}.weight", lambda c, s, n=n: (n(c, s), c.n_embd)),
                  W(f"attn_{x}_bias", p + f"attn_{x}.bias", _vec(n), required=False, dense=True),
                  W(f"attn_{x}_scale", p + f"attn_{x}.scale", ONE, required=False, dense=True),
                  W(f"attn_{x}_input_scale", p + f"attn_{x}.input_scale", ONE, required=False, dense=True)]
    t += [W("attn_output", p + "attn_output.weight", lambda c, s: (c.n_embd, QD(c, s))),
          W("attn_output_scale", p + "attn_output.scale", ONE, required=False, dense=True),
          W("attn_output_input_scale", p + "attn_output.input_scale", ONE, required=False, dense=True)]
    if out_bias:
        t.append(W("attn_output_bias", p + "attn_output.bias", _vec(D), required=False, dense=True))
    return t


def project_qkv(h, w, cfg, spec, rt, il, q_gate: bool = False, add_bias: bool = True):
    """`build_qkv`: h [T, D] -> q [T, H, K] ([T, H, 2K]: q | gate with q_gate), k [T, Hkv, K], v [T, Hkv, V].
    add_bias False: the loaded q/k/v biases are not added (a graph that calls build_lora_mm alone though
    create_tensor_qkv loads them: qwen4exp.cpp:797-811)."""
    T = h.shape[0]
    H, Hkv, K, V = spec.n_head, spec.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    Kq = 2 * K if q_gate else K
    if getattr(w, "attn_qkv", None) is not None:
        bias = w.attn_qkv_bias
        if bias is None and getattr(w, "attn_q_bias", None) is not None \
                and w.attn_k_bias is not None and w.attn_v_bias is not None:
            bias = np.concatenate([w.attn_q_bias, w.attn_k_bias, w.attn_v_bias])
        qkv = linear(h, w.attn_qkv, w.attn_qkv_scale, None, rt)          # [T, H*K + Hkv*K + Hkv*V]
        rt.record("wqkv", il, qkv)
        if bias is not None:
            qkv = qkv + bias
            rt.record("wqkv_b", il, qkv)
        q = qkv[:, :H * Kq]
        k = qkv[:, H * Kq:H * Kq + Hkv * K]
        v = qkv[:, H * Kq + Hkv * K:]
    else:
        b = (lambda x: getattr(w, f"attn_{x}_bias")) if add_bias else (lambda x: None)  # noqa: E731
        q, k, v = linear_many(h, [(w.attn_q, w.attn_q_scale, b("q")),   # [T, H*K]
                                  (w.attn_k, w.attn_k_scale, b("k")),   # [T, Hkv*K]
                                  (w.attn_v, w.attn_v_scale, b("v"))], rt)   # [T, Hkv*V]
    return q.reshape(T, H, Kq), k.reshape(T, Hkv, K), v.reshape(T, Hkv, V)


def rope_append(q, k, v, state: KVCache, fixed: bool, cos, sin, n_rot: int, mode: int, norms=None,
                eps: float = 0.0):
    """q and k rotated, each first normed by its own weight where norms = (wq, wk) (`rope.rms_norm_rope_qk`, else
    `rope.apply_rope_qk`), then k and v appended to the layer's cache -> (q [T, H, K], every position's keys
    [S, Hkv, K], values [S, Hkv, V]). On a GPU at fixed shapes one launch writes q, the cache's new key and value rows
    and both counts (`fused.rope_append`), where the rotation and the append take two."""
    if (f := fused_op(q, "rope_append")) is not None and (got := state.append_by(
            k, v, fixed, lambda kb, kc, vb, vc: f(q, k, v, cos, sin, n_rot, mode, kb, kc, vb, vc, norms, eps))):
        return got
    if norms is None:
        q, k = apply_rope_qk(q, k, cos, sin, n_rot, mode)
    else:
        q, k = rms_norm_rope_qk(q, norms[0], k, norms[1], eps, cos, sin, n_rot, mode)
    return (q, *state.append(k, v, fixed))


def self_attention(h, w, *, cfg, spec, il, state: KVCache, step, cos, sin, rt, out_gate: bool = False,
                   sparse: SparseMask | None = None, view_names: tuple[str, str] = ("Qcur_view", "gate"),
                   qkv_bias: bool = True):
    """h [T, D] -> [T, D]. q/k norms run when the table loaded them (`w.attn_q_norm`).
    out_gate: attn_q gives [q | gate] per head and the output is o * sigmoid(gate) (table with q_gate=True);
    view_names: the names of its q and gate halves (qwen4exp: Qcur_reshaped, gate_reshaped).
    sparse: a sparse indexer's selection (attention/qsa.py), the whole mask (causal included) in place of the causal
        one: attended gathered, or masked-dense (`SparseMask.gather`, and always where a trace keeps the scores).
    qkv_bias: whether the loaded attn_q/k/v biases are added (project_qkv)."""
    T = h.shape[0]
    q, k, v = project_qkv(h, w, cfg, spec, rt, il, q_gate=out_gate, add_bias=qkv_bias)
    if out_gate:
        K = cfg.head_dim_k
        rt.record("Qcur_full", il, q.reshape(T, -1))                    # [T, H*2K]
        rt.record("Kcur", il, k)
        rt.record("Vcur", il, v)
        q, gate = q[..., :K], q[..., K:]                                 # [T, H, K] each
        rt.record(view_names[0], il, q)
        rt.record(view_names[1], il, gate)
    mask_fn = sparse if sparse is not None else causal_mask if cfg.causal_attn else no_mask
    fixed = rt.fixed_shapes and mask_fn is causal_mask or getattr(mask_fn, "fixed", False)   # over the capacity:
    #                                                              the mask hides the rest (`SparseMask.fixed`)
    norms = None
    if getattr(w, "attn_q_norm", None) is not None:                      # per-head norms, then the rotation
        norms = (w.attn_q_norm, w.attn_k_norm)                           # (the normed ones made for a trace only)
        rt.record("Qcur_normed", il, lambda: rms_norm(q, w.attn_q_norm, cfg.rms_eps))
        rt.record("Kcur_normed", il, lambda: rms_norm(k, w.attn_k_norm, cfg.rms_eps))
    q, k_all, v_all = rope_append(q, k, v, state, fixed, cos, sin, cfg.n_rot, cfg.rope_type, norms,
                                  cfg.rms_eps)                           # [T, H, K], [S, Hkv, K], [S, Hkv, V]
    n = state.n
    rt.record("Kcur", il, lambda: k_all[n - T:n])                       # (the rotated keys: the cache's new rows)
    rt.record("Qcur", il, q)
    rt.record("Vcur", il, v)
    o = attend(q, k_all, v_all, step.pos, 1.0 / np.sqrt(cfg.head_dim_k), mask_fn=mask_fn,
               one_shot=keeps_scores(rt, il), record=rt.record, il=il)  # [T, H, V]
    o = o.reshape(T, -1)                                                 # [T, H*V]
    rt.record("kqv_out", il, o)
    if out_gate:
        rt.record("attn_pregate", il, o)
        gate = sigmoid(gate.reshape(T, -1))                              # [T, H*K]  (K == V)
        rt.record("gate_sigmoid", il, gate)
        o = o * gate
        rt.record("attn_gated", il, o)
    return linear(o, w.attn_output, w.attn_output_scale, getattr(w, "attn_output_bias", None), rt)
