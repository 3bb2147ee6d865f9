"""Gated residual streams (Qwen3.8-Flash-Next's hyper-connections): hc parallel copies of the residual.

Legend: T tokens, D model dim, P streams (`hyper_connection.count`, > 1), Lr the mixer's low rank
(`hyper_connection.low_rank`).

The model carries R [T, P, D] instead of one [T, D] residual; it starts as P copies of the embedding. Before
each sub-layer (token mixer, MoE) a mixer reads one [T, D] input from the streams, and after it a combiner
adds the sub-layer's output back to every stream with a per-stream weight:

    xn      = rms_norm(R) * norm               norm per stream over D, gamma [P, D] (hc_*_norm)   hc_norm
    lo      = silu((xn.flat @ down.T) / P)     [T, Lr]                                            (hc_*_down)
    gate    = lo @ up.T                        [T, P*D] -> [T, P, D]                              hc_gate (hc_*_up)
    mixed   = mean_p(xn * sigmoid(gate))       [T, D]                                             hc_mixed
    inject  = xn.flat @ inject.T               [T, P]                                             hc_inject
    R'      = R + 2 sigmoid(inject / P)[:, :, None] * out[:, None, :]                           hc_combine

The output head's mixer (`output_hc_*`, no inject) is the model's final norm: there is no output_norm.

llama.cpp: `build_hc_mix` / `build_hc_combine` (src/models/qwen4exp.cpp:270-354); the fused
`ggml_dsv4_hc_pre_gated` and `ggml_dsv4_hc_post` compute the same sums. The authors' `Qwen4ExpTextGatedResidual`
(transformers 5.23, qwen4_exp) is the same math: a grouped RMSNorm (zero-centred, stored 1 + w by the converter).

What it shares with DeepSeek V4's mHC streams (residual/ on another branch): the [T, P, D] residual, the
norm-then-mix "pre" step that reduces the streams to one sub-layer input, and the "post" step that writes
the output back to every stream with per-stream weights (`ggml_dsv4_hc_pre*` / `ggml_dsv4_hc_post` are the
ops of both). Where they differ: mHC's weights come from a Sinkhorn-normalized P x P comb plus a pre/post
vector from one projection of the flattened streams; here the pre weights are a per-channel sigmoid gate from a
low-rank projection and the mean over streams, the post weights 2 sigmoid(inject / P) with an identity comb.
"""
from __future__ import annotations

import numpy as np

from ..ops import rms_norm, sigmoid, silu
from ..ops.arrays import fused_op
from ..weights import W


def streams_table(prefix: str, P: int, Lr: int, *, inject: bool = True) -> list[W]:
    """The four (three without inject) tensors of one mixer, fields named `{x}_norm`, `{x}_down`, `{x}_up`,
    `{x}_inject` after the GGUF tensors `{prefix}_norm.weight`, ... (prefix "blk.{il}.hc_attn", "output_hc").
    norm is ne {D, P} (a [P, D] gamma; llama.cpp allows the reshape of a flat [P*D])."""
    x = prefix.rsplit(".", 1)[-1]
    t = [W(f"{x}_norm", f"{prefix}_norm.weight", lambda c, s: (P, c.n_embd), dense=True, reshape=True),
         W(f"{x}_down", f"{prefix}_down.weight", lambda c, s: (Lr, P * c.n_embd)),
         W(f"{x}_up", f"{prefix}_up.weight", lambda c, s: (P * c.n_embd, Lr))]
    if inject:
        t.append(W(f"{x}_inject", f"{prefix}_inject.weight", lambda c, s: (P, P * c.n_embd), small=True))
    return t


def init_streams(x: np.ndarray, P: int) -> np.ndarray:
    """x [T, D] -> R [T, P, D]: P copies of the embedding (`hc_init`)."""
    return np.repeat(x[:, None, :], P, axis=1)


def mix(R: np.ndarray, norm, down, up, inject, *, eps: float, rt, il: int):
    """R [T, P, D] -> (mixed [T, D], inject logits [T, P] or None). norm: [P, D]; down/up/inject: QTensors."""
    T, P, D = R.shape
    xn = rms_norm(R, None, eps) * norm                                   # [T, P, D]
    xf = xn.reshape(T, P * D)                                            # [T, P*D] stream-major
    rt.record("hc_norm", il, xf)
    lo = silu(rt.matmul(xf, down) * np.float32(1.0 / P))                 # [T, Lr]
    gate = rt.matmul(lo, up)                                             # [T, P*D]
    rt.record("hc_gate", il, gate)
    mixed = gated_mean(xn, gate.reshape(T, P, D))                        # [T, D]
    rt.record("hc_mixed", il, mixed)
    inj = None
    if inject is not None:
        inj = rt.matmul(xf, inject)                                      # [T, P]
        rt.record("hc_inject", il, inj)
    return mixed, inj


def gated_mean(xn: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """xn, gate [T, P, D] -> mean_p(xn * sigmoid(gate)) [T, D]: the streams summed in order, then * (1 / P) (on a GPU
    one launch, `fused.gated_mean`)."""
    if (k := fused_op(xn, "gated_mean")) is not None and (y := k(xn, gate)) is not None:
        return y
    P = xn.shape[1]
    gated = xn * sigmoid(gate)                                           # [T, P, D]
    mixed = gated[:, 0]
    for p in range(1, P):                                                # llama.cpp's order of the sum
        mixed = mixed + gated[:, p]
    return mixed * np.float32(1.0 / P)                                   # [T, D]


def combine(R: np.ndarray, out: np.ndarray, inj: np.ndarray) -> np.ndarray:
    """R [T, P, D], out [T, D], inj [T, P] -> R + 2 sigmoid(inj / P) * out per stream  [T, P, D] (the caller
    traces it: llama.cpp names it hc_combine, and the last one of a block again l_last). On a GPU one launch
    (`fused.streams_combine`)."""
    if (k := fused_op(R, "streams_combine")) is not None and (y := k(R, out, inj)) is not None:
        return y
    P = R.shape[1]
    w = sigmoid(inj * np.float32(1.0 / P)) * np.float32(2.0)            # [T, P]
    return R + w[:, :, None] * out[:, None, :]                           # [T, P, D]
