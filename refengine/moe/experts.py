"""Routed experts: the loop oracle (one expert at a time, only the tokens routed to it).

Legend: T tokens, D model dim, E experts, A active experts per token, I expert hidden dim.

    for each expert e that received tokens:
        h = silu(x_e @ gate[e].T) * (x_e @ up[e].T)          [n_e, I]
        y_e = h @ down[e].T                                   [n_e, D]
    out[t] = sum over slots a of weights[t, a] * y_{ids[t, a]}[t]   (summed in slot order, like ggml)

`ffn_*_exps` tensors are `[E, I, D]` (gate, up) and `[E, D, I]` (down) in NumPy order; each expert is a
packed `QTensor` view, dequantized only when tokens are routed to it. Optional per-expert `.scale`
vectors ([E]) multiply that expert's matmul output (`build_lora_mm_id`). llama.cpp: `build_moe_ffn`.
"""
from __future__ import annotations

import numpy as np

from ..ops.activations import silu


def moe_ffn(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, *, up, gate, down,
            up_scale=None, gate_scale=None, down_scale=None, matmul, record=None, il: int = -1,
            act=None) -> np.ndarray:
    """x: [T, D], ids/weights: [T, A] -> [T, D].   `gate` may be None (then act = silu(up)).

    act: None for SwiGLU, or (fn(gate [.., I], up [.., I]) -> [.., I], llama.cpp's trace name) for another
    gated activation (Kimi-K3's SiTU: `ffn_moe_situ`)."""
    rec = record or (lambda *a: None)
    T, D = x.shape
    A = ids.shape[1]
    n_ff = up.shape[1]
    up_out = np.zeros((T, A, n_ff), dtype=np.float32)                # [T, A, I]
    gate_out = np.zeros((T, A, n_ff), dtype=np.float32)              # [T, A, I]
    down_out = np.zeros((T, A, D), dtype=np.float32)                 # [T, A, D]
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)                              # tokens routed to e, and in which slot
        xe = x[tok]                                                   # [n_e, D]
        u = matmul(xe, up[int(e)])                                    # [n_e, I]
        if up_scale is not None:
            u = u * up_scale[e]
        up_out[tok, slot] = u
        if gate is not None:
            g = matmul(xe, gate[int(e)])
            if gate_scale is not None:
                g = g * gate_scale[e]
            gate_out[tok, slot] = g
    # llama.cpp renames a scaled expert output `*_scaled` (build_moe_ffn): one name per tensor
    rec("ffn_moe_up" + ("_scaled" if up_scale is not None else ""), il, up_out)
    if gate is not None:
        rec("ffn_moe_gate" + ("_scaled" if gate_scale is not None else ""), il, gate_out)
        fn, act_name = act if act is not None else (lambda g, u: silu(g) * u, "ffn_moe_swiglu")
        act = fn(gate_out, up_out)                                    # [T, A, I]
        rec(act_name, il, act)
    else:
        assert act is None, "a gated activation needs ffn_gate_exps"
        act = silu(up_out)
        rec("ffn_moe_silu", il, act)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        d = matmul(act[tok, slot], down[int(e)])                      # [n_e, D]
        if down_scale is not None:
            d = d * down_scale[e]
        down_out[tok, slot] = d
    rec("ffn_moe_down" + ("_scaled" if down_scale is not None else ""), il, down_out)
    weighted = down_out * weights[:, :, None]                         # [T, A, D]
    rec("ffn_moe_weighted", il, weighted)
    out = weighted[:, 0].copy()
    for a in range(1, A):                                             # ggml adds the slots in order
        out += weighted[:, a]
    return out
