"""Rotary position embedding, with YaRN and per-dimension frequency factors (`ggml_rope_ext`).

For pair i < n_rot/2 at position p (ggml-cpu `ggml_rope_cache_init` / `rope_yarn`, ops.cpp:6180-6220):

    theta_ext = p * base^(-2i/n_rot) / freq_factor[i]     (the power is built by repeated float32 multiply)
    theta     = freq_scale * theta_ext                      (linear scaling)
    yarn:       theta = theta * (1 - mix_i) + theta_ext * mix_i,  mix_i = ramp(i) * ext_factor
                mscale *= 1 + 0.1 * ln(1 / freq_scale)
    cos, sin  = cos(theta) * mscale, sin(theta) * mscale

NORM mode rotates (x[2i], x[2i+1]); NEOX mode rotates (x[i], x[i + n_rot/2]). Dims >= n_rot pass through.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..config import ROPE_NEOX, ROPE_NORM
from .arrays import as_array, fused_op
from .norm import rms_norm


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """`ggml_rope_yarn_corr_dims`: the dimension range over which YaRN ramps from interpolation to extrapolation."""
    def corr_dim(n_rot_b):
        return n_rot * math.log(n_ctx_orig / (n_rot_b * 2 * math.pi)) / (2 * math.log(base))
    lo = math.floor(corr_dim(beta_fast))
    hi = math.ceil(corr_dim(beta_slow))
    return float(max(0, lo)), float(min(n_rot - 1, hi))


@functools.lru_cache(maxsize=64)
def yarn_mix(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float,
             ext_factor: float) -> tuple[np.ndarray, np.ndarray]:
    """YaRN's per-pair weights of the interpolated and the extrapolated angle, (1 - mix, mix) with
    mix = ramp(i) * ext_factor, each [n_rot/2] float32: made once per set of parameters and read-only (constants: a
    device keeps one copy of each)."""
    lo, hi = yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow)
    i0 = np.arange(0, n_rot, 2, dtype=np.float32)
    y = (i0 / 2 - lo) / max(0.001, hi - lo)
    ramp = 1 - np.clip(y, 0, 1)
    mix = (ramp * ext_factor).astype(np.float32)
    keep = 1 - mix
    mix.flags.writeable = keep.flags.writeable = False
    return keep, mix


def rope_cos_sin(positions: np.ndarray, *, n_rot: int, base: float, freq_scale: float = 1.0,
                 ext_factor: float = 0.0, attn_factor: float = 1.0, n_ctx_orig: int = 0,
                 beta_fast: float = 32.0, beta_slow: float = 1.0,
                 freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """positions [T] -> cos, sin [T, n_rot/2] (float32), magnitude-scaled; computed where `positions` lives (a
    device's positions give device tables).

    On a device, for the step's own positions (`Device.step_positions`, checked below n_ctx by the model), the
    tables of every position 0..n_ctx-1 are made once per set of parameters by this same code and gathered at the
    positions: 2 launches a step instead of ~3 per pair (the float32 product below is sequential in i), the same bits
    (each row's ops are elementwise), and nothing a captured decode step cannot replay."""
    kw = dict(n_rot=n_rot, base=base, freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor,
              n_ctx_orig=n_ctx_orig, beta_fast=beta_fast, beta_slow=beta_slow, freq_factors=freq_factors)
    tables = _position_tables(positions, kw)
    if tables is not None:
        return tables
    half = n_rot // 2
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_rot)
    yarn = yarn_mix(n_rot, n_ctx_orig, base, beta_fast, beta_slow, ext_factor) if ext_factor != 0.0 else None
    mscale = np.float32(attn_factor) if ext_factor == 0.0 else \
        np.float32(np.float32(attn_factor) * (1.0 + 0.1 * math.log(1.0 / freq_scale)))
    ff = None if freq_factors is None else as_array(freq_factors, np.float32)
    if (k := fused_op(positions, "rope_cos_sin")) is not None and \
            (r := k(positions, half, theta_scale, ff, freq_scale, yarn, mscale)) is not None:
        return r                                                                # a GPU: one launch (cuda/fused.py)
    return cos_sin(positions, half, theta_scale, ff, freq_scale, yarn, mscale)


def cos_sin(positions, half: int, theta_scale, ff, freq_scale: float, yarn, mscale) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos_sin` from its constants: theta_scale = base^(-2/n_rot), ff [half] or None, yarn = (keep, mix)
    [half] each or None, mscale the magnitude (float32)."""
    acc = as_array(positions, np.float32)                                      # [T]
    theta_ext = np.empty_like(acc, shape=(len(positions), half))               # [T, half]
    for i in range(half):             # theta_i = p * theta_scale^i, by repeated float32 multiplication as ggml does
        theta_ext[:, i] = acc
        acc = (acc * theta_scale).astype(np.float32)
    if ff is not None:
        theta_ext = theta_ext / ff[None, :]
    theta = np.float32(freq_scale) * theta_ext
    if yarn is not None:
        keep, mix = yarn
        theta = theta * keep + theta_ext * mix
    th = theta.astype(np.float64)
    return (np.cos(th) * mscale).astype(np.float32), (np.sin(th) * mscale).astype(np.float32)


TABLE_MAX_BYTES = 64 << 20     # cos + sin of every position: larger (a long n_ctx, a wide n_rot) computes per step


def _position_tables(positions, kw):
    """(cos, sin) [T, n_rot/2] on positions' device for the step's own positions: the rows of every position's
    tables [n_ctx, n_rot/2] (made once per parameters, the device's `tables`) at them, gathered once a step per
    parameters; or None: host positions, other positions than the step's, or tables past TABLE_MAX_BYTES."""
    dev = getattr(positions, "dev", None)
    if dev is None or dev.step_positions is None or dev.step_positions[0] is not positions:
        return None
    n_ctx = dev.step_positions[1]
    if 2 * 4 * n_ctx * (kw["n_rot"] // 2) > TABLE_MAX_BYTES:
        return None
    ff = kw["freq_factors"]
    key = ("rope", n_ctx, id(ff)) + tuple(v for k, v in kw.items() if k != "freq_factors")
    hit = dev.tables.get(key)
    if hit is None:                               # (the arange is not the step's positions: computed per pair)
        hit = dev.tables[key] = (ff, rope_cos_sin(np.arange(n_ctx, like=positions), **kw))   # ff kept alive
    gathered = dev.step_positions[2]              # this step's rows of them, gathered once a step (2 launches)
    if key not in gathered:
        gathered[key] = (hit[1][0][positions], hit[1][1][positions])
    return gathered[key]


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, mode: int) -> np.ndarray:
    """x: [T, H, K], cos/sin: [T, n_rot/2] -> [T, H, K] with the first n_rot dims rotated (float32; float64 stays)."""
    if (k := fused_op(x, "apply_rope")) is not None and (y := k(x, cos, sin, n_rot, mode)) is not None:
        return y                                                               # a GPU: one launch (cuda/fused.py)
    half = n_rot // 2
    out = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=True)
    c, s = cos[:, None, :], sin[:, None, :]                                    # [T, 1, half]
    if mode == ROPE_NORM:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]                          # [T, H, half]
        out[..., 0:n_rot:2] = x0 * c - x1 * s
        out[..., 1:n_rot:2] = x0 * s + x1 * c
    elif mode == ROPE_NEOX:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * c - x1 * s
        out[..., half:n_rot] = x0 * s + x1 * c
    else:
        raise ValueError(f"rope mode {mode} is not NORM (0) or NEOX (2)")
    return out


def apply_rope_qk(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int,
                  mode: int) -> tuple[np.ndarray, np.ndarray]:
    """(apply_rope(q, ...), apply_rope(k, ...)): a layer's q [T, H, K] and k [T, Hkv, K] rotated alike; on a GPU one
    launch for both."""
    if (f := fused_op(q, "apply_rope")) is not None and (qk := f(q, cos, sin, n_rot, mode, k)) is not None:
        return qk
    return apply_rope(q, cos, sin, n_rot, mode), apply_rope(k, cos, sin, n_rot, mode)


def rms_norm_rope(x: np.ndarray, w: np.ndarray | None, eps: float, cos: np.ndarray, sin: np.ndarray, n_rot: int,
                  mode: int) -> np.ndarray:
    """apply_rope(rms_norm(x, w, eps), cos, sin, n_rot, mode): a head's norm then its rotation (Qwen3's q / k norms),
    x [T, H, K] -> [T, H, K]. On a GPU one launch where the two take two (refengine/cuda/fused.py)."""
    if (k := fused_op(x, "norm_rope")) is not None and (y := k(x, w, eps, cos, sin, n_rot, mode)) is not None:
        return y
    return apply_rope(rms_norm(x, w, eps), cos, sin, n_rot, mode)


def rms_norm_rope_qk(q: np.ndarray, wq, k: np.ndarray, wk, eps: float, cos: np.ndarray, sin: np.ndarray,
                     n_rot: int, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """(rms_norm_rope(q, wq, ...), rms_norm_rope(k, wk, ...)): a layer's q [T, H, K] and k [T, Hkv, K] normed by
    their own weights and rotated alike; on a GPU both in one launch."""
    if (f := fused_op(q, "norm_rope")) is not None and \
            (qk := f(q, wq, eps, cos, sin, n_rot, mode, k, wk)) is not None:
        return qk
    return rms_norm_rope(q, wq, eps, cos, sin, n_rot, mode), rms_norm_rope(k, wk, eps, cos, sin, n_rot, mode)


def context_rope(cfg, pos: np.ndarray, *, freq_factors=None, attn_factor: float | None = None):
    """cos, sin [T, n_rot/2] with llama.cpp's context-level rope parameters (`llama_context` cparams: YaRN
    from rope.scaling.*, beta_fast / beta_slow defaults); `attn_factor` overrides cparams.yarn_attn_factor."""
    return rope_cos_sin(pos, n_rot=cfg.n_rot, base=cfg.rope_freq_base, freq_scale=cfg.rope_freq_scale,
                        ext_factor=cfg.yarn_ext_factor,
                        attn_factor=cfg.yarn_attn_factor if attn_factor is None else attn_factor,
                        n_ctx_orig=cfg.n_ctx_orig_yarn, beta_fast=cfg.yarn_beta_fast,
                        beta_slow=cfg.yarn_beta_slow, freq_factors=freq_factors)


@functools.lru_cache(maxsize=16)
def mrope_text_pairs(sections: tuple, n_rot: int) -> np.ndarray:
    """IMROPE (`ggml_rope_multi`, interleaved sections; ggml-cpu ops.cpp:6216-6290) for text: which of the n_rot/2
    NEOX pairs take their angle from the 4th ("e") section. Pair i, sector = i % sum(sections), reads t, h or w
    when sector % 3 == 0 and sector < 3*s0 (t), == 1 and < 3*s1 (h), == 2 and < 3*s2 (w), else e. A text token
    has positions [p, p, p, 0] (llama-graph.cpp:127-147), so t/h/w pairs are plain NEOX at p and e pairs are at
    position 0. Returns a bool [n_rot/2]: True where the pair reads e (made once per layout and read-only: a
    constant, one copy on a device)."""
    s0, s1, s2, s3 = (int(x) for x in sections)
    total = max(1, s0 + s1 + s2 + s3)
    e = np.zeros(n_rot // 2, bool)
    for i in range(n_rot // 2):
        sec = i % total
        e[i] = not ((sec % 3 == 0 and sec < 3 * s0) or (sec % 3 == 1 and sec < 3 * s1)
                    or (sec % 3 == 2 and sec < 3 * s2))
    e.flags.writeable = False
    return e


def mrope_text(cos: np.ndarray, sin: np.ndarray, e_pairs: np.ndarray, cos0: np.ndarray, sin0: np.ndarray):
    """cos, sin [T, n_rot/2] at the tokens' positions -> the same with the e pairs taken from cos0, sin0
    [n_rot/2] (the angles at position 0, magnitude-scaled): text positions [p, p, p, 0]. A selection, no
    arithmetic (np.where: computed where the tables live)."""
    if not e_pairs.any():
        return cos, sin
    return np.where(e_pairs, cos0, cos), np.where(e_pairs, sin0, sin)             # [T, n_rot/2]
