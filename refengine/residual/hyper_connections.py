"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4): hc parallel residual streams mixed around each
sub-layer by a doubly-stochastic matrix.

Legend: T tokens, D model dim, n = hc streams (`hyper_connection.count`, 4), M = (2 + n) * n mixes.

The residual is X [T, n, D], n copies of the embedding at the start (`expand`). Around a sub-layer f:

    m    = rms_norm(X.reshape(T, n*D)) @ fn.T                 (no weight)              hc_mixes    [T, M]
    pre  = sigmoid(m[:, :n] * scale[0] + base[:n]) + eps                                hc_pre      [T, n]
    post = 2 * sigmoid(m[:, n:2n] * scale[1] + base[n:2n])                              hc_post     [T, n]
    C    = sinkhorn(m[:, 2n:] * scale[2] + base[2n:])      C[t, src, dst]               hc_comb     [T, n, n]
    h    = sum_s pre[:, s] * X[:, s]                       the sub-layer's input        hc_*_pre    [T, D]
    X'   = post[:, :, None] * f(norm(h))[:, None] + einsum('tsk,tsd->tkd', C, X)      hc_*_post   [T, n, D]

    sinkhorn(c): c = softmax over dst + eps;  c /= (sum over src + eps);
                 iterations - 1 times: c /= (sum over dst + eps); c /= (sum over src + eps)

`fn` [M, n*D], `base` [M], `scale` [3] are `blk.N.hc_attn_*` / `blk.N.hc_ffn_*`; eps is `hyper_connection.epsilon`,
the Sinkhorn iteration count `hyper_connection.sinkhorn_iterations`, the norm's eps the model's rms eps.
llama.cpp: `build_hc_pre` / `build_hc_sinkhorn` / `build_hc_post` (src/models/deepseek4.cpp:289-446; the fused
`ggml_dsv4_hc_pre/comb/post` compute the same). What collapses the streams at the end is the model's own head
(DeepSeek-V4's: residual/hc_head.py), kept apart so another arch can bring its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import rms_norm, sigmoid
from ..ops.arrays import fused_op
from ..ops.softmax import softmax
from ..weights import W


@dataclass(frozen=True)
class HCConfig:
    n: int                      # hyper_connection.count (llama.cpp asserts 4)
    iters: int                  # hyper_connection.sinkhorn_iterations
    eps: float                  # hyper_connection.epsilon
    norm_eps: float             # attention.layer_norm_rms_epsilon (the mixes' rms_norm)


def hc_table(prefix: str, field: str, n: int, *, head: bool = False) -> list[W]:
    """`{prefix}_fn.weight` [M, n*D], `_base.weight` [M], `_scale.weight` [3] as fields `{field}_fn`, ...
    (a sub-layer's, M = (2 + n) * n); the head's (`head`): M = n and one scale."""
    n_mix, n_scale = (n, 1) if head else ((2 + n) * n, 3)
    return [W(f"{field}_fn", f"{prefix}_fn.weight", lambda c, s: (n_mix, n * c.n_embd)),
            W(f"{field}_base", f"{prefix}_base.weight", lambda c, s: (n_mix,), dense=True),
            W(f"{field}_scale", f"{prefix}_scale.weight", lambda c, s: (n_scale,), dense=True)]


def expand(x: np.ndarray, n: int) -> np.ndarray:
    """[T, D] -> X [T, n, D]: every stream starts as the embedding (`hc_init`)."""
    return np.repeat(x[:, None, :], n, axis=1).astype(np.float32)


def mixes(X: np.ndarray, fn, hc: HCConfig, rt) -> np.ndarray:
    """rms_norm(X.reshape(T, n*D)) @ fn.T: X [T, n, D] -> [T, M]."""
    T = X.shape[0]
    return rt.matmul(rms_norm(X.reshape(T, -1), None, hc.norm_eps), fn)        # [T, n*D] -> [T, M]


def sinkhorn(c: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """c [T, src, dst] (logits) -> an (almost) doubly-stochastic [T, src, dst] (`build_hc_sinkhorn`)."""
    e = np.float32(eps)
    c = softmax(c, axis=-1) + e                                                 # over dst
    c = c / (np.sum(c, axis=1, keepdims=True, dtype=np.float32) + e)            # "cols": over src
    for _ in range(iters - 1):
        c = c / (np.sum(c, axis=2, keepdims=True, dtype=np.float32) + e)        # "rows": over dst
        c = c / (np.sum(c, axis=1, keepdims=True, dtype=np.float32) + e)
    return c.astype(np.float32)


def collapse(X: np.ndarray, pre: np.ndarray) -> np.ndarray:
    """sum_s pre[:, s] * X[:, s], streams added in order: X [T, n, D], pre [T, n] -> [T, D]."""
    if (k := fused_op(X, "collapse")) is not None and (y := k(X, pre)) is not None:
        return y
    out = X[:, 0] * pre[:, 0:1]
    for s in range(1, X.shape[1]):
        out = out + X[:, s] * pre[:, s:s + 1]
    return out


def gates(m: np.ndarray, scale: np.ndarray, base: np.ndarray, hc: HCConfig):
    """The mixes m [T, M] -> (pre [T, n], post [T, n], comb [T, src, dst]): how a sub-layer reads and writes back."""
    if (k := fused_op(m, "hc_gates")) is not None and (r := k(m, scale, base, hc.n, hc.iters, hc.eps)) is not None:
        return r                                                                # a GPU: one launch (cuda/fused.py)
    T, n = m.shape[0], hc.n
    pre = sigmoid(m[:, :n] * scale[0] + base[:n]) + np.float32(hc.eps)        # [T, n]
    post = sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n]) * np.float32(2.0)  # [T, n]
    comb = sinkhorn((m[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(T, n, n), hc.iters, hc.eps)
    return pre, post, comb


def hc_pre(X: np.ndarray, fn, scale: np.ndarray, base: np.ndarray, hc: HCConfig, *, rt, il: int):
    """X [T, n, D] -> (h [T, D], post [T, n], comb [T, n, n]): the sub-layer's input and how to write back."""
    m = mixes(X, fn, hc, rt)                                                    # [T, M]
    rt.record("hc_mixes", il, m)
    pre, post, comb = gates(m, scale, base, hc)
    rt.record("hc_pre", il, pre)
    rt.record("hc_post", il, post)
    rt.record("hc_comb", il, comb)
    return collapse(X, pre), post, comb


def hc_post(y: np.ndarray, X: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
    """y [T, D] (the sub-layer's output), X [T, n, D] -> X' [T, n, D]:
    X'[:, dst] = y * post[:, dst] + sum_src comb[:, src, dst] * X[:, src], sources added in order."""
    if (k := fused_op(X, "hc_post")) is not None and (r := k(y, X, post, comb)) is not None:
        return r
    out = np.empty_like(X)
    for dst in range(X.shape[1]):
        acc = y * post[:, dst:dst + 1]
        for src in range(X.shape[1]):
            acc = acc + X[:, src] * comb[:, src, dst:dst + 1]
        out[:, dst] = acc
    return out


def sublayer(X: np.ndarray, w, kind: str, fn, *, hc: HCConfig, eps: float, rt, il: int, out_name: str) -> np.ndarray:
    """One sub-layer between the streams, X [T, n, D] -> X' [T, n, D]: `hc_pre` with the layer's
    `hc_{kind}_fn / _scale / _base`, the sub-layer's RMSNorm (`{kind}_norm`), y = fn(h) [T, D], `hc_post`.
    Traced as llama.cpp names it: `hc_{kind}_pre`, `{kind}_norm`, and `out_name` for X'."""
    h, post, comb = hc_pre(X, getattr(w, f"hc_{kind}_fn"), getattr(w, f"hc_{kind}_scale"),
                           getattr(w, f"hc_{kind}_base"), hc, rt=rt, il=il)
    rt.record(f"hc_{kind}_pre", il, h)
    h = rms_norm(h, getattr(w, f"{kind}_norm"), eps)
    rt.record(f"{kind}_norm", il, h)
    X = hc_post(fn(h), X, post, comb)
    rt.record(out_name, il, X)
    return X
