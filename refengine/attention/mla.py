"""Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2): the naive and the weight-absorbed form, side by side.

Legend: T new tokens, S cached positions (including the new ones), D model dim, H heads, Dq q-LoRA rank,
C kv-LoRA rank (the latent), dn = qk_nope (the non-rotated part of a head), R = qk_rope (rotated part),
dk = dn + R, dv = v_head.

Shared by both forms (llama.cpp `src/models/deepseek2.cpp:496-538`):

    q        = rms_norm(h @ Wq_a.T) * q_a_norm @ Wq_b.T    (or h @ Wq.T when Dq = 0)   [T, H, dk]
    q_nope, q_pe = q[..., :dn], rope(q[..., dn:])                                      [T, H, dn], [T, H, R]
    ckv      = h @ Wkv_a.T;  c = rms_norm(ckv[:, :C]) * kv_a_norm;  k_pe = rope(ckv[:, C:])   [T, C], [T, R]

Naive form (what the paper writes; llama.cpp's path for legacy `attn_kv_b` files, deepseek2.cpp:593-634):
decompress a key and a value per head, cache them, run ordinary multi-head attention.

    k_nope[s, h] = c[s] @ Wk_b[h]            Wk_b [H, C, dn]          [S, H, dn]
    v[s, h]      = Wv_b[h] @ c[s]            Wv_b [H, dv, C]          [S, H, dv]
    logit[h,t,s] = (q_nope[t,h] . k_nope[s,h] + q_pe[t,h] . k_pe[s]) * kq_scale
    o[t, h]      = softmax_s(logit) @ v[:, h]                                             [T, H, dv]

Absorbed form (llama.cpp's path for MLA files, deepseek2.cpp:540-592 and the `v_mla` branch of
`build_attn_mha`, src/llama-graph.cpp:2734-2738): cache only c and k_pe, and move Wk_b to the query and
Wv_b after the softmax. It is the same numbers because matrix products associate:

    q_nope[t,h] . (c[s] @ Wk_b[h]) = (q_nope[t,h] @ Wk_b[h].T) . c[s] = q_abs[t,h] . c[s]
    sum_s p[s] (Wv_b[h] @ c[s])    = Wv_b[h] @ (sum_s p[s] c[s])

so attention becomes multi-query attention with one shared head of width C + R (K = [c | k_pe], V = c):

    q_abs = q_nope @ Wk_b[h].T               [T, H, C]
    o_lat = MQA([q_abs | q_pe], [c | k_pe], c)                                            [T, H, C]
    o     = o_lat @ Wv_b[h].T                [T, H, dv]

Both forms end with  attn = o.reshape(T, H*dv) @ Wo.T (* attn_output.scale).

The cache per position: absorbed C + R numbers; naive H * (dk + dv).
`kq_scale` and the rope magnitude follow llama.cpp's YaRN rules (`mla_scales`). With `rope=False` (kimi-linear,
kimi-k3: rope type NONE) q_pe and k_pe pass unrotated and the caller sets kq_scale = 1/sqrt(dn + R). Trace names are
deepseek2.cpp's and `build_attn`'s; names whose shape belongs to one form (Qcur, Kcur, Vcur, kqv) are
recorded only by the form llama.cpp runs for that file (`llama_form`).

The form is the state's: `new_state(mc, form)` makes the cache of one form (it carries `form`), and `mla` runs
the form of the state it is given. What one llama.cpp graph does differently from deepseek2.cpp is passed by
the arch, never kept in MLAConfig: the order of the naive form's key parts (`k_parts`), extra trace names
(`NAMES`), an output `.scale` the graph loads and does not apply (`mla_table(apply_output_scale=False)`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import quant
from quant import QTensor

from ..cache import KVCache, LatentKV
from ..config import ROPE_NORM, KeyReader
from ..errors import ConfigError
from ..ops import apply_rope_qk, as_array, contiguous, rms_norm
from ..weights import W
from .mha import attend, causal_mask, keeps_scores

FORMS = ("absorbed", "naive")


@dataclass(frozen=True)
class MLAConfig:
    n_head: int            # attention.head_count                                                  H
    q_lora_rank: int       # attention.q_lora_rank; 0 = plain attn_q (the "lite" models)           Dq
    kv_lora_rank: int      # attention.kv_lora_rank                                                 C
    qk_nope: int           # attention.key_length_mla - rope.dimension_count (legacy: key_length - n_rot)   dn
    qk_rope: int           # rope.dimension_count (n_rot)                                           R
    v_head: int            # attention.value_length_mla (legacy: attention.value_length)            dv
    kq_scale: float        # mscale^2 / sqrt(dn + R), from rope.scaling.* (see mla_scales)
    rope_attn_factor: float  # cparams.yarn_attn_factor: pass to rope_cos_sin(attn_factor=...)
    rms_eps: float         # attention.layer_norm_rms_epsilon
    legacy: bool           # key_length_mla / value_length_mla absent: one attn_kv_b, llama.cpp runs naive
    yarn_log_mul: float = 0.0      # rope.scaling.yarn_log_multiplier / 0.1 (= HF mscale_all_dim; 0 = absent)
    attn_temp_scale: float = 0.0   # attention.temperature_scale (Mistral-Large-3 query temperature; 0 = off)
    attn_temp_length: int = 0      # attention.temperature_length
    rope: bool = True              # False: rope type NONE (kimi-linear, kimi-k3): q_pe and k_pe are used unrotated

    @property
    def head_k(self) -> int:       # dk: the per-head query/key width of the naive form
        return self.qk_nope + self.qk_rope


def llama_form(mc: MLAConfig) -> str:
    """The form llama.cpp runs for this file: naive for legacy attn_kv_b files, absorbed otherwise."""
    return "naive" if mc.legacy else "absorbed"


# ---------------------------------------------------------------- config

def mla_scales(*, head_k: int, freq_scale: float, ext_factor: float, rope_attn_factor: float,
               yarn_log_mul: float, mscale_is_log_mul: bool = True) -> tuple[float, float]:
    """(rope attn_factor, kq_scale), in float32 as llama.cpp computes them.

    Context (src/llama-context.cpp:177-211), f = 1/freq_scale, L = yarn_log_mul,
    gm(s, m) = 1 if s <= 1 else 1 + 0.1 m ln s  (HF `yarn_get_mscale`):
        a = 1;  if ext_factor != 0:  a = gm(f, m) / gm(f, L) if L != 0 else gm(f, 1)
                                      m = L for deepseek2 (`mscale_is_log_mul`, so a = 1), m = 1 for
                                      every other arch (deepseek32: a = gm(f, 1) / gm(f, L))
                                     a /= 1 + 0.1 ln f          (cancels the mscale ggml_rope adds)
        a *= rope.scaling.attn_factor
    Graph (deepseek2.cpp:439-443):
        mscale   = a * (1 + 0.1 ln f) * (1 + 0.1 L ln f)
        kq_scale = mscale^2 / sqrt(dk)         = dk^-0.5 * yarn_get_mscale(f, L)^2 for YaRN files
    """
    f32 = np.float32
    a = f32(1.0)
    factor = f32(1.0) / f32(freq_scale)
    if ext_factor != 0.0:
        def gm(s, m):
            return f32(1.0) if s <= 1.0 else f32(f32(0.1) * f32(m) * np.log(s) + f32(1.0))
        L = f32(yarn_log_mul)
        if L != 0:
            # llama.cpp takes mscale = 1 except for deepseek2, where mscale = mscale_all_dim = L
            # (llama-context.cpp:188-197): there the ratio is 1 and the magnitude is left to kq_scale
            m = L if mscale_is_log_mul else f32(1.0)
            a = f32(gm(factor, m) / gm(factor, L))
        else:
            a = gm(factor, 1.0)
        a = f32(a * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(factor))))
    a = f32(a * f32(rope_attn_factor))
    attn_factor_org = f32(a * (f32(1.0) + f32(0.1) * np.log(factor)))
    mscale = f32(attn_factor_org * (f32(1.0) + f32(0.1) * f32(yarn_log_mul) * np.log(factor)))
    kq_scale = f32(f32(1.0) * mscale * mscale / np.sqrt(f32(head_k)))
    return float(a), float(kq_scale)


def mla_config(r: KeyReader, *, n_layer: int, n_head: int, n_rot: int, head_dim_k: int, head_dim_v: int,
               rms_eps: float, rope_scaling_type: str, rope_freq_scale: float, rope_attn_factor: float,
               lite_rule: bool = True, require_mla: bool = False, read_yarn_log_mul: bool = True,
               mscale_is_log_mul: bool = True, temperature: bool = True, **_common) -> MLAConfig:
    """MLA's attention keys, given `read_common`'s values (pass `**common`). The defaults are deepseek2's
    (src/models/deepseek2.cpp:3-42); the DSA archs turn some off (deepseek32.cpp:6-38, glm-dsa.cpp:30-66).

    lite_rule: q_lora_rank is required unless the model is "lite" (n_layer 26 or 27, or 48 with a 128256 vocab,
        the vocab from `vocab_size` or the tokenizer list as llama.cpp counts it); a lite model never reads it.
        False: q_lora_rank is always required (deepseek32, glm-dsa).
    require_mla: key_length_mla and value_length_mla must both be present (deepseek32 / glm-dsa throw
        "requires MLA"); otherwise a file without them is legacy (`llama_hparams::is_mla`, one attn_kv_b).
    read_yarn_log_mul: rope.scaling.yarn_log_multiplier is read (deepseek2, deepseek32; glm-dsa never reads it).
    mscale_is_log_mul: llama_context's YaRN attn_factor takes mscale = mscale_all_dim (deepseek2 only).
    temperature: attention.temperature_scale / temperature_length are read (deepseek2 only).
    """
    path = r.gf.path
    lite = False
    if lite_rule:
        n_vocab = r.get("vocab_size")
        if n_vocab is None:
            toks = r.get("tokenizer.ggml.tokens")
            n_vocab = 0 if toks is None else len(toks)
        lite = n_layer in (26, 27) or (n_layer == 48 and int(n_vocab) == 128256)
    q_lora = 0 if lite else int(r.get("attention.q_lora_rank", required=True))
    if not lite_rule and q_lora <= 0:
        raise ConfigError(f"{path}: {r._k('attention.q_lora_rank')} = {q_lora}: {r.arch} needs a q-LoRA query "
                          f"(its indexer reads the q-LoRA latent)")
    kv_lora = int(r.get("attention.kv_lora_rank", required=True))
    k_mla, v_mla = int(r.get("attention.key_length_mla", 0)), int(r.get("attention.value_length_mla", 0))
    legacy = not (k_mla and v_mla)
    if legacy and require_mla:
        raise ConfigError(f"{path}: {r.arch} requires MLA: {r._k('attention.key_length_mla')} and "
                          f"{r._k('attention.value_length_mla')} must both be set (llama.cpp throws the same)")
    dk, dv = (head_dim_k, head_dim_v) if legacy else (k_mla, v_mla)
    if dk - n_rot < 1:
        raise ConfigError(f"{path}: MLA head size {dk} leaves no non-rotated dims beside rope.dimension_count = {n_rot}")
    if not legacy and head_dim_k != kv_lora + n_rot:
        raise ConfigError(f"{path}: {r._k('attention.key_length')} = {head_dim_k} must be kv_lora_rank + "
                          f"rope.dimension_count = {kv_lora + n_rot} in an MLA file (the latent cache row)")
    L = 0.0
    if read_yarn_log_mul and r.has("rope.scaling.yarn_log_multiplier"):   # stored as 0.1 * mscale_all_dim (conversion/deepseek.py:382-386)
        L = float(np.float32(r.get("rope.scaling.yarn_log_multiplier")) / np.float32(0.1))
    temp_scale = float(r.get("attention.temperature_scale", 0.0)) if temperature else 0.0
    temp_len = int(r.get("attention.temperature_length", 0)) if temperature else 0
    if temp_scale != 0.0 and temp_len == 0:
        raise ConfigError(f"{path}: attention.temperature_scale is set but attention.temperature_length is 0")
    rope_af, kq_scale = mla_scales(head_k=dk, freq_scale=rope_freq_scale, rope_attn_factor=rope_attn_factor,
                                   ext_factor=1.0 if rope_scaling_type == "yarn" else 0.0, yarn_log_mul=L,
                                   mscale_is_log_mul=mscale_is_log_mul)
    return MLAConfig(n_head=int(n_head), q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope=dk - n_rot,
                     qk_rope=n_rot, v_head=dv, kq_scale=kq_scale, rope_attn_factor=rope_af, rms_eps=float(rms_eps),
                     legacy=legacy, yarn_log_mul=L, attn_temp_scale=temp_scale, attn_temp_length=temp_len)


# ---------------------------------------------------------------- tensors

def mla_table(il: int, mc: MLAConfig, *, apply_output_scale: bool = True) -> list[W]:
    """The attention tensors deepseek2 creates (deepseek2.cpp:98-122) plus the generic `.scale` /
    `.input_scale` pass (src/llama-model.cpp:1634-1727). Shapes in NumPy order (reversed ggml ne).

    Of the optional ones the graph uses only attn_output.scale (`build_attn` -> build_lora_mm(wo, .., wo_s));
    attn_q.scale and every .input_scale are loaded by llama.cpp but never applied (deepseek2 multiplies
    by attn_q with a plain ggml_mul_mat), so they are accepted and ignored here as well.
    apply_output_scale: False for an arch whose graph loads attn_output.scale and never applies it (kimi-k3:
    build_attn gets no wo_s, kimi-k3.cpp:534 and :549, and :559 multiplies by attn_output alone): the tensor is then
    loaded as `attn_output_scale_unapplied`, so `mla` finds no output scale.
    """
    p = f"blk.{il}."
    H, C, R, dk, dv = mc.n_head, mc.kv_lora_rank, mc.qk_rope, mc.head_k, mc.v_head
    ONE = lambda c, s: (1,)                                                    # noqa: E731
    t = []
    if mc.q_lora_rank > 0:
        Dq = mc.q_lora_rank
        t += [W("attn_q_a", p + "attn_q_a.weight", lambda c, s: (Dq, c.n_embd)),
              W("attn_q_a_norm", p + "attn_q_a_norm.weight", lambda c, s: (Dq,), dense=True),
              W("attn_q_b", p + "attn_q_b.weight", lambda c, s: (H * dk, Dq))]
    else:
        t += [W("attn_q", p + "attn_q.weight", lambda c, s: (H * dk, c.n_embd)),
              W("attn_q_scale", p + "attn_q.scale", ONE, required=False, dense=True),          # unused by llama.cpp
              W("attn_q_input_scale", p + "attn_q.input_scale", ONE, required=False, dense=True)]
    t += [W("attn_kv_a_mqa", p + "attn_kv_a_mqa.weight", lambda c, s: (C + R, c.n_embd)),
          W("attn_kv_a_norm", p + "attn_kv_a_norm.weight", lambda c, s: (C,), dense=True)]
    if mc.legacy:
        t.append(W("attn_kv_b", p + "attn_kv_b.weight", lambda c, s: (H * (mc.qk_nope + dv), C)))
    else:
        t += [W("attn_k_b", p + "attn_k_b.weight", lambda c, s: (H, C, mc.qk_nope)),       # ne {dn, C, H}
              W("attn_v_b", p + "attn_v_b.weight", lambda c, s: (H, dv, C))]               # ne {C, dv, H}
    t += [W("attn_output", p + "attn_output.weight", lambda c, s: (c.n_embd, H * dv)),
          W("attn_output_scale" if apply_output_scale else "attn_output_scale_unapplied", p + "attn_output.scale",
            ONE, required=False, dense=True),
          W("attn_output_input_scale", p + "attn_output.input_scale", ONE, required=False, dense=True)]
    return t


def new_state(mc: MLAConfig, form: str | None = None, dtype=np.float32):
    """The per-layer cache of one form, which it carries (`.form`): LatentKV ([c | k_pe] rows [S, C+R]) for
    "absorbed", KVCache (K [S, H, dk], V [S, H, dv]) for "naive"; None: the form llama.cpp runs (`llama_form`)."""
    form = form or llama_form(mc)
    if form not in FORMS:
        raise ValueError(f"MLA form {form!r} is not one of {FORMS}")
    return LatentKV(dtype) if form == "absorbed" else KVCache(dtype, form="naive")


# The points whose trace name differs between llama.cpp's MLA graphs, with deepseek2.cpp's names. An arch passes
# `names` {point: the name, or the names, its graph gives that tensor} to replace some (kimi-linear's legacy
# path also names the naive form's per-head tensors mla_Q / mla_K / mla_V, kimi-linear.cpp:455-478).
NAMES = {
    "Q": "Qcur",                          # the attention's query: naive [T, H, dk], absorbed [T, H, C+R]
    "K": "Kcur",                          # its new keys: naive [T, H, dk], absorbed [T, 1, C+R]
    "V": ("Vcur_view", "Vcur_cont"),      # the per-head values [T, H, dv] split out of attn_kv_b (legacy files)
    "q_abs": "q_nope_absorbed_perm",      # the absorbed query [T, H, C] (glm5-next.cpp:958-961 names it q_absorbed)
}
K_PARTS = ("nope", "rope")                # the naive form's per-head key: K = [k_nope | k_pe], as Q = [q_nope | q_pe]


# ---------------------------------------------------------------- math

def _mm(x, w: QTensor, rt, dtype):
    """x [T, I] @ w.T, w [O, I] -> [T, O]: `rt.matmul` in float32 (the runtime's mode and backend), or float64
    from the dequantized weight (the precision switch of the equivalence tests)."""
    if dtype == np.float32:
        return rt.matmul(x, w)
    return x.astype(dtype) @ quant.dequantize(w).astype(dtype).T


def _mm_heads(x, w, rt, dtype):
    """Per-head product, ggml_mul_mat of a 3-D weight: x [H, T, I], w [H, O, I] (QTensor or array) -> [H, T, O]."""
    if isinstance(w, QTensor) and dtype == np.float32:
        return rt.matmul_heads(x, w)
    wd = quant.dequantize(w) if isinstance(w, QTensor) else w
    return np.einsum("hti,hoi->hto", x.astype(dtype), wd.astype(dtype))          # [H, T, O]


def kv_b_heads(w, mc: MLAConfig):
    """Per-head Wk_b [H, C, dn] and Wv_b [H, dv, C]: the file's attn_k_b / attn_v_b, or split out of a legacy
    attn_kv_b [H*(dn+dv), C] the way the converter does (conversion/deepseek.py:433-449), dequantized."""
    if not mc.legacy:
        return w.attn_k_b, w.attn_v_b
    H, C, dn = mc.n_head, mc.kv_lora_rank, mc.qk_nope
    kv = quant.dequantize(w.attn_kv_b).reshape(H, dn + mc.v_head, C)              # [H, dn+dv, C]
    return kv[:, :dn, :].transpose(0, 2, 1), kv[:, dn:, :]                         # [H, C, dn], [H, dv, C]


def input_weights(w, mc: MLAConfig) -> list:
    """The weights `mla` multiplies its input h by (q's first projection, the kv latent's): a caller that
    multiplies h by others too names these with them in its `rt.prefetch`."""
    return [w.attn_q_a if mc.q_lora_rank > 0 else w.attn_q, w.attn_kv_a_mqa]


def project_q_a(h, w, *, mc, rt, il, name="q", dtype=np.float32):
    """The normed q-LoRA latent: h [T, D] -> rms_norm(h @ Wq_a.T) * q_a_norm [T, Dq], both steps traced as `name`
    (deepseek2.cpp:500-505 calls them `q`; deepseek32.cpp:218-222 `qr`, where the indexer reads it too)."""
    q = _mm(h, w.attn_q_a, rt, dtype)                                              # [T, Dq]
    rt.record(name, il, q)
    q = rms_norm(q, w.attn_q_a_norm, mc.rms_eps)
    rt.record(name, il, q)
    return q


def project_q(h, w, *, mc, rt, il, dtype=np.float32, qr=None):
    """q-LoRA (or plain attn_q) query: h [T, D] -> q [T, H, dk]   (deepseek2.cpp:500-515, all named `q`).
    qr: the normed q-LoRA latent [T, Dq] when the caller already has it (`project_q_a`); then only the
    up-projection runs here."""
    if qr is not None:
        q = _mm(qr, w.attn_q_b, rt, dtype)                                         # [T, H*dk]
    elif mc.q_lora_rank > 0:
        q = project_q_a(h, w, mc=mc, rt=rt, il=il, dtype=dtype)                    # [T, Dq]
        q = _mm(q, w.attn_q_b, rt, dtype)                                          # [T, H*dk]
    else:
        q = _mm(h, w.attn_q, rt, dtype)                                            # [T, H*dk]
    q = q.reshape(h.shape[0], mc.n_head, mc.head_k)                                # [T, H*dk] -> [T, H, dk]
    rt.record("q", il, q)
    return q


def project_kv_a(h, w, *, mc, rt, il, dtype=np.float32):
    """Latent and shared rope key: h [T, D] -> c [T, C] (normed), k_pe [T, R] as projected   (deepseek2.cpp:517-538;
    `mla` rotates k_pe with q's tail). The row is split latent first, rope tail second; the norm comes after the
    split."""
    C = mc.kv_lora_rank
    ckv = _mm(h, w.attn_kv_a_mqa, rt, dtype)                                       # [T, C+R]
    rt.record("kv_cmpr_pe", il, ckv)
    k_pe = ckv[:, None, C:] if mc.rope else contiguous(ckv[:, None, C:])          # [T, 1, R] (rotated by `mla`)
    c = rms_norm(ckv[:, :C], w.attn_kv_a_norm, mc.rms_eps)                         # [T, C]
    rt.record("kv_cmpr", il, c)
    return c, k_pe[:, 0, :]


def attn_temperature(pos, mc: MLAConfig) -> np.ndarray:
    """Per-position query scale (Llama-4 style; llm_graph_input_attn_temp::set_input, llama-graph.cpp:157-172):
    log(floor(pos / temperature_length) + 1) * temperature_scale + 1, in double, stored as f32.   [T] -> [T]"""
    p = as_array(pos, np.float32).astype(np.float64)
    return (np.log(np.floor(p / mc.attn_temp_length) + 1.0) * mc.attn_temp_scale + 1.0).astype(np.float32)


def absorb_query(q_nope_perm, w, *, mc, rt, dtype=np.float32):
    """q_nope [H, T, dn] -> q_abs = q_nope @ Wk_b[h].T  [H, T, C] (the absorbed form's query)."""
    return _mm_heads(q_nope_perm, kv_b_heads(w, mc)[0], rt, dtype)


def expand_values(o_lat, w, *, mc, rt, dtype=np.float32):
    """The attention's latent output [H, T, C] -> o_lat @ Wv_b[h].T  [H, T, dv] (the absorbed form's values)."""
    return _mm_heads(o_lat, kv_b_heads(w, mc)[1], rt, dtype)


def attend_absorbed(q_nope, q_pe, c, k_pe, w, *, mc, state: LatentKV, mask_fn, q_pos, rt, il, rec_form,
                    dtype=np.float32, q_temp=None, names=NAMES, k_parts=K_PARTS, fixed=False):
    """MQA over the latent cache: q_nope [T, H, dn], q_pe [T, H, R], c [T, C], k_pe [T, R] -> [T, H, dv].
    mask_fn(q_pos, k_pos) -> additive mask (mha.attend: blocked, or one shot where a trace keeps the scores).
    k_parts is not used: the one shared key is [c | k_pe]. fixed: attend over the cache's capacity (`cache.Rows`;
    the mask must hide the rows past the last position)."""
    k_b, v_b = kv_b_heads(w, mc)
    q_nope_perm = q_nope.transpose(1, 0, 2)                                        # [T, H, dn] -> [H, T, dn]
    rt.record("q_nope_perm", il, q_nope_perm)
    q_abs = absorb_query(q_nope_perm, w, mc=mc, rt=rt, dtype=dtype)                # [H, T, C]
    rt.record("q_nope_absorbed", il, q_abs)
    q_abs = q_abs.transpose(1, 0, 2)                                               # [H, T, C] -> [T, H, C]
    for n in (names["q_abs"],) if isinstance(names["q_abs"], str) else names["q_abs"]:
        rt.record(n, il, q_abs)
    Q = np.concatenate([q_abs, q_pe.astype(dtype)], axis=-1)                       # [T, H, C+R]
    rec_form(names["Q"], il, Q)
    rec_form("Vcur", il, c[:, None, :])                                            # [T, 1, C]
    rec_form(names["K"], il, lambda: np.concatenate([c, k_pe], axis=-1)[:, None, :])   # [T, 1, C+R] (traced only)
    if q_temp is not None:
        Q = Q * q_temp[:, None, None]
        rec_form("Qcur_attn_temp_scaled", il, Q)
    c_all, _, kv_all = state.append(c, k_pe, fixed)                                # [S, C], [S, C+R]: one buffer
    K = kv_all[:, None, :]                                                         # [S, 1, C+R]: one shared head
    rec_form("v_cont", il, c_all.T)                                                # [C, S]: V as build_attn reads it
    o = attend(Q, K, c_all[:, None, :], q_pos, mc.kq_scale, mask_fn=mask_fn, one_shot=keeps_scores(rt, il),
               record=_att_record(rt, rec_form), il=il, dtype=dtype)                                  # [T, H, C]
    o = expand_values(o.transpose(1, 0, 2), w, mc=mc, rt=rt, dtype=dtype)          # [H, T, C] -> [H, T, dv]
    rt.record("kqv_mla", il, o)
    return o.transpose(1, 0, 2)                                                    # [H, T, dv] -> [T, H, dv]


def attend_naive(q_nope, q_pe, c, k_pe, w, *, mc, state: KVCache, mask_fn, q_pos, rt, il, rec_form,
                 dtype=np.float32, q_temp=None, names=NAMES, k_parts=K_PARTS, fixed=False):
    """MHA over decompressed per-head keys and values: same inputs (and `fixed`) as attend_absorbed -> [T, H, dv].
    k_parts: the order of K's parts per head (Q is always [q_nope | q_pe])."""
    T, H, dn, dv = c.shape[0], mc.n_head, mc.qk_nope, mc.v_head
    if mc.legacy:                                                                  # llama.cpp's path (:594-612)
        kv = _mm(c, w.attn_kv_b, rt, dtype)                                        # [T, H*(dn+dv)]
        rt.record("kv", il, kv)
        kv = kv.reshape(T, H, dn + dv)                                             # [T, H*(dn+dv)] -> [T, H, dn+dv]
        k_nope, v = kv[..., :dn], kv[..., dn:]                                     # [T, H, dn], [T, H, dv]
        rt.record("k_nope_view", il, k_nope)
        rec_form(names["V"], il, v)
    else:                                                                          # decompress through k_b / v_b
        k_b, v_b = kv_b_heads(w, mc)
        k_nope = np.einsum("tc,hcn->thn", c.astype(dtype), quant.dequantize(k_b).astype(dtype))   # [T, H, dn]
        v = _mm_heads(np.broadcast_to(c, (H, *c.shape)), v_b, rt, dtype)         # [H, T, dv]
        v = v.transpose(1, 0, 2)                                                   # [H, T, dv] -> [T, H, dv]
    Q = np.concatenate([q_nope.astype(dtype), q_pe.astype(dtype)], axis=-1)        # [T, H, dk], rope tail last
    k_pe_h = np.broadcast_to(k_pe[:, None, :], (T, H, mc.qk_rope)).astype(dtype)   # [T, H, R]
    part = {"nope": k_nope.astype(dtype), "rope": k_pe_h}
    K = np.concatenate([part[p] for p in k_parts], axis=-1)                       # [T, H, dk]
    rec_form(names["Q"], il, Q)                                                    # [T, H, dk]
    rec_form(names["K"], il, K)                                                    # [T, H, dk]
    if q_temp is not None:
        Q = Q * q_temp[:, None, None]
        rec_form("Qcur_attn_temp_scaled", il, Q)
    K_all, V_all = state.append(K, contiguous(v), fixed)                           # [S, H, dk], [S, H, dv]
    return attend(Q, K_all, V_all, q_pos, mc.kq_scale, mask_fn=mask_fn, one_shot=keeps_scores(rt, il),
                  record=_att_record(rt, rec_form), il=il, dtype=dtype)                       # [T, H, dv]


def _att_record(rt, rec_form):
    """kq / kq_soft_max are the same in both forms; kqv ([H, T, C] absorbed, [H, T, dv] naive) is form-specific."""
    return lambda name, il, a: (rec_form if name == "kqv" else rt.record)(name, il, a)


def mla(h, w, *, mc: MLAConfig, il: int, state, cos, sin, rt, mask_fn=None, dtype=np.float32, qr=None,
        out_gate=None, k_parts: tuple[str, str] = K_PARTS, names=None, pos=None) -> np.ndarray:
    """One MLA sub-block: h [T, D] (attn_norm output) -> [T, D] (before the residual add).

    state: this layer's `new_state(mc, form)`; it runs in the state's form (`state.form`, FORMS), and its length
        before the call is the first new position.
    cos, sin: [T, R/2] from `rope_cos_sin(positions, n_rot=R, attn_factor=mc.rope_attn_factor, ...)`;
        None with `mc.rope` False (no rotation: kimi's rope type NONE).
    mask_fn(q_pos, k_pos) -> [len(q_pos), len(k_pos)] additive mask (default: causal), asked for tiles of it (the
        blocked attention) or all of it: q_pos some of this call's positions (state.n .. state.n + T - 1), k_pos
        some cached positions 0 .. S - 1 after the append.
    qr: the normed q-LoRA latent [T, Dq] if the caller computed it (DSA: the indexer shares it).
    out_gate: [T, H*dv] multiplied into the heads' output before attn_output (Kimi-K3's sigmoid gate,
        src/models/kimi-k3.cpp:552-557, traced `mla_gated`), or None.
    dtype: np.float32 (llama.cpp's arithmetic, every weight through `rt.matmul`) or np.float64 (tests).
    k_parts: the order of the naive form's per-head key parts, ("nope", "rope") the aligned one; ("rope", "nope")
        reproduces a graph that builds K = [k_pe | k_nope] against Q = [q_nope | q_pe] (kimi-linear.cpp:477,
        its legacy attn_kv_b path). The absorbed form has one shared key [c | k_pe] and ignores it.
    names: {point: name(s)} replacing entries of `NAMES` (the arch's graph's trace names).
    pos: the positions of the T tokens [T] (`step.pos`, on the device in a resident run); None: state.n + 0..T-1.
    With the causal mask (mask_fn None) a run with fixed shapes (`rt.fixed_shapes`) attends over the cache's
    capacity, its rows past the last position (zeros) hidden by the causal mask itself; so does a mask_fn made for
    the capacity (`SparseMask.fixed`).
    The output projection has no trace name in llama.cpp's deepseek2 graph, so none is recorded; the output
    `.scale` is applied when the arch's table loads it as `attn_output_scale` (`mla_table`).
    """
    T, R = h.shape[0], mc.qk_rope
    form = state.form
    if form not in FORMS:
        raise TypeError(f"MLA runs the form of its state (new_state(mc, form), one of {FORMS}); this "
                        f"{type(state).__name__} has form {form!r}")
    if tuple(sorted(k_parts)) != ("nope", "rope"):
        raise ValueError(f"k_parts {k_parts!r}: the two key parts \"nope\" and \"rope\", in some order")
    if mc.rope:
        assert cos.shape == sin.shape == (T, R // 2), f"cos/sin {cos.shape}, expected {(T, R // 2)}"
    pos = state.n + np.arange(T) if pos is None else pos                           # [T]

    def rec_form(name, il, a):      # a name whose shape belongs to one form: recorded by the form llama.cpp runs
        if form == llama_form(mc):
            for n in (name,) if isinstance(name, str) else name:
                rt.record(n, il, a)

    if qr is None and dtype == np.float32:          # h's two products made as one where a device takes them
        rt.prefetch(h, input_weights(w, mc))
    q = project_q(h, w, mc=mc, rt=rt, il=il, dtype=dtype, qr=qr)                   # [T, H, dk]
    c, k_pe = project_kv_a(h, w, mc=mc, rt=rt, il=il, dtype=dtype)                 # [T, C], [T, R] (rotated below)
    q_nope = q[..., :mc.qk_nope]                                                   # [T, H, dn]
    rt.record("q_nope", il, q_nope)
    q_pe = q[..., mc.qk_nope:]                                                     # [T, H, R]
    if mc.rope:                                              # q's tail and the shared key rotated alike (one launch)
        q_pe, k_pe = apply_rope_qk(q_pe, k_pe[:, None, :], cos, sin, R, ROPE_NORM)  # [T, H, R], [T, 1, R]
        rt.record("k_pe", il, k_pe)
        k_pe = k_pe[:, 0, :]
    rt.record("q_pe", il, q_pe)
    q_temp = attn_temperature(pos, mc) if mc.attn_temp_scale != 0.0 else None      # [T]
    attend_form = attend_absorbed if form == "absorbed" else attend_naive
    o = attend_form(q_nope, q_pe, c, k_pe, w, mc=mc, state=state, mask_fn=mask_fn or causal_mask, q_pos=pos, rt=rt,
                    il=il, rec_form=rec_form, dtype=dtype, q_temp=q_temp,
                    names=NAMES if names is None else {**NAMES, **names}, k_parts=k_parts,
                    fixed=rt.fixed_shapes if mask_fn is None else getattr(mask_fn, "fixed", False))   # [T, H, dv]
    o = o.reshape(T, mc.n_head * mc.v_head)                                        # [T, H, dv] -> [T, H*dv]
    rt.record("kqv_out", il, o)
    if out_gate is not None:
        o = o * out_gate                                                           # [T, H*dv]
        rt.record("mla_gated", il, o)
    y = _mm(o, w.attn_output, rt, dtype)                                           # [T, D]
    wo_s = getattr(w, "attn_output_scale", None)       # absent where the arch's table loads it unapplied (mla_table)
    if wo_s is not None:
        y = y * wo_s
    return y
