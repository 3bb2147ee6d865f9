"""DeepSeek-V4's rope: NORM pairs on the LAST R dims of a head, with per-layer parameters, and its inverse.

Legend: T tokens, H heads, K head dim, R rope dims (`rope.dimension_count`), off = K - R.

    x[..., off:] = rope(x[..., off:], pos)          ggml_rope_ext + ggml_rope_set_offset(x, off)
    x[..., off:] = rope_back(x[..., off:], pos)     ggml_rope_ext_back: the same rotation by -theta

Per layer (src/models/deepseek4.cpp:11-17, :902-909): a compressed layer (ratio 4 or 128, its pooled keys and
its indexer too) ropes with `attention.compress_rope_freq_base` and the context's YaRN (freq_scale, ext_factor,
beta_fast / beta_slow, n_ctx_orig), with attn_factor = 1 / (1 + 0.1 ln(1/freq_scale)) when ext_factor != 0, which
cancels YaRN's magnitude factor; a ratio-0 layer ropes with `rope.freq_base`, freq_scale 1, no YaRN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config import ROPE_NORM
from ..ops.arrays import as_array, fused_op
from ..ops.rope import apply_rope, rope_cos_sin


@dataclass(frozen=True)
class TailRope:
    """One layer's rope parameters (the arguments of its ggml_rope_ext calls)."""
    n_rot: int                  # rope.dimension_count
    base: float                 # rope.freq_base (ratio 0) | attention.compress_rope_freq_base (compressed)
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    n_ctx_orig: int = 0
    beta_fast: float = 0.0
    beta_slow: float = 0.0

    def cos_sin(self, pos) -> tuple[np.ndarray, np.ndarray]:
        """[T] -> cos, sin [T, R/2]."""
        return rope_cos_sin(as_array(pos), n_rot=self.n_rot, base=self.base, freq_scale=self.freq_scale,
                            ext_factor=self.ext_factor, attn_factor=self.attn_factor, n_ctx_orig=self.n_ctx_orig,
                            beta_fast=self.beta_fast, beta_slow=self.beta_slow)

    def apply(self, x: np.ndarray, pos, *, inverse: bool = False) -> np.ndarray:
        """x [T, H, K], pos [T] -> x with its last R dims rotated by +theta (or -theta: `inverse`)."""
        cos, sin = self.cos_sin(pos)
        return rotate_tail(x, cos, sin, self.n_rot, inverse)

    def apply_pair(self, x: np.ndarray, x2: np.ndarray, pos) -> tuple[np.ndarray, np.ndarray]:
        """(apply(x, pos), apply(x2, pos)) for x [T, H, K] and x2 [T, H2, K] (the queries and the key): on a GPU one
        launch."""
        cos, sin = self.cos_sin(pos)
        if (k := fused_op(x, "rope_tail")) is not None and (y := k(x, cos, sin, self.n_rot, False, x2)) is not None:
            return y
        return rotate_tail(x, cos, sin, self.n_rot), rotate_tail(x2, cos, sin, self.n_rot)


def rotate_tail(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, inverse: bool = False) -> np.ndarray:
    """x [T, H, K], cos / sin [T, R/2] -> x with its last R = n_rot dims rotated in NORM pairs by +theta (or -theta:
    `inverse`), float32."""
    if (k := fused_op(x, "rope_tail")) is not None and (y := k(x, cos, sin, n_rot, inverse)) is not None:
        return y                                                                # a GPU: one launch (cuda/fused.py)
    off = x.shape[-1] - n_rot
    out = as_array(x, np.float32).copy()
    out[..., off:] = apply_rope(x[..., off:], cos, -sin if inverse else sin, n_rot, ROPE_NORM)
    return out


def layer_rope(cfg, compress_base: float | None) -> TailRope:
    """The rope of a compressed layer (compress_base: attention.compress_rope_freq_base) or of a window-only
    layer (None), from the context's parameters."""
    if compress_base is None:
        return TailRope(n_rot=cfg.n_rot, base=cfg.rope_freq_base)
    ext = cfg.yarn_ext_factor
    fs = cfg.rope_freq_scale
    f32 = np.float32
    af = 1.0 if ext == 0.0 else float(f32(1.0) / (f32(1.0) + f32(0.1) * f32(math.log(1.0 / fs))))   # dsv4_rope_attn_factor
    return TailRope(n_rot=cfg.n_rot, base=compress_base, freq_scale=fs, ext_factor=ext, attn_factor=af,
                    n_ctx_orig=cfg.n_ctx_orig_yarn, beta_fast=cfg.yarn_beta_fast, beta_slow=cfg.yarn_beta_slow)
