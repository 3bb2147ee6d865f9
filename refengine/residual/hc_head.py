"""DeepSeek-V4's head over the hyper-connection streams: one learned, per-token weighting collapses them.

Legend: T tokens, D model dim, n streams.

    m    = rms_norm(X.reshape(T, n*D)) @ output_hc_fn.T            hc_head_mixes   [T, n]
    pre  = sigmoid(m * output_hc_scale + output_hc_base) + eps     hc_head_pre     [T, n]
    h    = sum_s pre[:, s] * X[:, s]                               hc_head         [T, D]

then the usual rms_norm * output_norm and output matmul. llama.cpp: `build_hc_head`
(src/models/deepseek4.cpp:448-468). The streams themselves are residual/hyper_connections.py's.

GLM-5.3-Flash (`glm5-next`) has no learned head: `hc_mean`, the plain mean of the streams, added in order and
scaled by 1/n (`build_hc_mean`, src/models/glm5-next.cpp:370-378), then the same norm and output.
"""
from __future__ import annotations

import numpy as np

from ..ops import sigmoid
from .hyper_connections import HCConfig, collapse, hc_table, mixes


def head_table(n: int):
    """output_hc_fn [n, n*D], output_hc_base [n], output_hc_scale [1]."""
    return hc_table("output_hc", "output_hc", n, head=True)


def hc_head(X: np.ndarray, g, hc: HCConfig, rt) -> np.ndarray:
    """X [T, n, D] -> [T, D]."""
    m = mixes(X, g.output_hc_fn, hc, rt)                                        # [T, n]
    rt.record("hc_head_mixes", -1, m)
    pre = sigmoid(m * g.output_hc_scale[0] + g.output_hc_base) + np.float32(hc.eps)   # [T, n]
    rt.record("hc_head_pre", -1, pre)
    h = collapse(X, pre)
    rt.record("hc_head", -1, h)
    return h


def hc_mean(X: np.ndarray, rt) -> np.ndarray:
    """X [T, n, D] -> (X[:, 0] + ... + X[:, n-1]) * (1/n)  [T, D]   (glm5-next's head, traced `hc_head`)."""
    n = X.shape[1]
    acc = X[:, 0]
    for s in range(1, n):
        acc = acc + X[:, s]
    h = (acc * np.float32(1.0 / n)).astype(np.float32)
    rt.record("hc_head", -1, h)
    return h
