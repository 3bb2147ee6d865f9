"""Routed experts on the CPU kernels: tokens grouped by expert, only routed experts' bytes read.

Legend: T tokens, D model dim, E experts, A active experts per token, I expert hidden dim.

Same math, same trace records and same slot-order sum as the loop oracle
(`refengine.moe.experts.moe_ffn`, llama.cpp `build_moe_ffn`); the difference is the schedule:

    pairs (t, a) sorted by expert ids[t, a]          -> rows of xg [T*A, D], segments seg [E+1]
    u = xg @ up[e].T,  g = xg @ gate[e].T            one grouped kernel launch each   [T*A, I]
    h = silu(g) * u                                  (silu(u) when there is no gate)
    y = h @ down[e].T                                one grouped kernel launch        [T*A, D]
    out[t] = sum over a, in slot order, of weights[t, a] * y[t, a]

An expert that received no token is not touched; a grouped launch spreads (expert, row tile) work
items over the threads, so a decode step with A small expert matrices is one parallel region per
projection, not A of them. Experts with many tokens (prefill) go through dequantize + BLAS.
`quant` knows no model: trace records go through the `record(name, il, value)` callable.
"""
from __future__ import annotations

import numpy as np

from ..ref import QTensor, QuantError
from .matmul import BLAS_MIN_TOKENS, grouped_matmul


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x / (1 + exp(-x)) in float32, the same expression as the oracle's (ggml_vec_silu_f32)."""
    with np.errstate(over="ignore"):
        return (x / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def _scaled(y: np.ndarray, scale, expert_of_row: np.ndarray) -> np.ndarray:
    """Per-expert output scale (`build_lora_mm_id` scales): y [N, O] * scale[e(row)]."""
    if scale is None:
        return y
    s = np.asarray(scale, dtype=np.float32).reshape(-1)[expert_of_row]      # [N]
    return y * s[:, None]


def _suffix(scale) -> str:
    """llama.cpp names a scaled expert output `*_scaled` (build_moe_ffn): one name per tensor."""
    return "" if scale is None else "_scaled"


def _scatter(rows: np.ndarray, tok: np.ndarray, slot: np.ndarray, T: int, A: int) -> np.ndarray:
    """Rows [T*A, n] in expert order -> [T, A, n] in (token, slot) order."""
    out = np.zeros((T, A, rows.shape[1]), dtype=np.float32)
    out[tok, slot] = rows
    return out


def moe_ffn(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, *, up: QTensor, gate: QTensor | None,
            down: QTensor, up_scale=None, gate_scale=None, down_scale=None, mode: str = "exact",
            record=None, il: int = -1, blas_min_tokens: int = BLAS_MIN_TOKENS) -> np.ndarray:
    """x: [T, D], ids/weights: [T, A] -> [T, D].   up/gate: [E, I, D], down: [E, D, I]; gate may be None."""
    rec = record or (lambda *a: None)
    x = np.ascontiguousarray(x, dtype=np.float32)
    ids = np.asarray(ids)
    T, _ = x.shape                                                         # [T, D]
    A = ids.shape[1] if ids.ndim == 2 else -1
    E = up.shape[0]
    if ids.shape != (T, A) or np.shape(weights) != (T, A):
        raise QuantError(f"moe_ffn: ids {list(ids.shape)} and weights {list(np.shape(weights))} must both be "
                         f"[T={T}, A] for experts {up.name!r}")
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise QuantError(f"moe_ffn: expert id out of range [0, {E}) for {up.name!r}: {ids.min()}..{ids.max()}")
    flat = ids.reshape(-1).astype(np.int64)                                # [T*A], pair p = t*A + a
    order = np.argsort(flat, kind="stable")                                # pairs grouped by expert
    seg = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=E))]).astype(np.int64)  # [E+1]
    tok, slot = order // A, order % A                                      # [T*A] each
    e_row = flat[order]                                                    # expert of each grouped row
    xg = x[tok]                                                            # [T*A, D]
    kw = {"mode": mode, "blas_min_tokens": blas_min_tokens}

    u = _scaled(grouped_matmul(xg, up, seg, **kw), up_scale, e_row)        # [T*A, I]
    if record is not None:
        rec("ffn_moe_up" + _suffix(up_scale), il, _scatter(u, tok, slot, T, A))
    if gate is not None:
        g = _scaled(grouped_matmul(xg, gate, seg, **kw), gate_scale, e_row)  # [T*A, I]
        h = silu(g) * u
        if record is not None:
            rec("ffn_moe_gate" + _suffix(gate_scale), il, _scatter(g, tok, slot, T, A))
            rec("ffn_moe_swiglu", il, _scatter(h, tok, slot, T, A))
    else:
        h = silu(u)
        if record is not None:
            rec("ffn_moe_silu", il, _scatter(h, tok, slot, T, A))

    y = _scaled(grouped_matmul(h, down, seg, **kw), down_scale, e_row)    # [T*A, D]
    down_out = _scatter(y, tok, slot, T, A)                                # [T, A, D]
    rec("ffn_moe_down" + _suffix(down_scale), il, down_out)
    weighted = down_out * np.asarray(weights, dtype=np.float32)[:, :, None]  # [T, A, D]
    rec("ffn_moe_weighted", il, weighted)
    out = weighted[:, 0].copy()
    for a in range(1, A):                                                  # ggml adds the slots in order
        out += weighted[:, a]
    return out
