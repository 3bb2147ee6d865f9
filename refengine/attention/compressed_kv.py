"""DeepSeek-V4's attention: one K = V head over a raw sliding window plus pooled (compressed) blocks, with
learned per-head softmax sinks, a de-roped output and a grouped low-rank output projection.

Legend: T tokens, D model dim, Dq q-LoRA rank, H heads, K head dim (K = V), R rope dims (the last R of a head),
S raw keys held (the window), N pooled blocks, r the layer's compression ratio (0, 4 or 128), G output groups,
Ro output rank per group, I = H*K/G.

    qr   = rms_norm(h @ W_q_a.T) * q_a_norm                                  qr, qr_norm       [T, Dq]
    q    = rope(rms_norm((qr @ W_q_b.T).reshape(T, H, K)))   (per-head norm, no weight)  q_norm, q   [T, H, K]
    kv   = rope(rms_norm(h @ W_kv.T) * kv_norm)              (one head; K = V)          kv_norm, kv [T, 1, K]
    keys = [window: the raw kv of positions p - n_swa < s <= p]
         + [r = 128 (HCA): every finished block | r = 4 (CSA): the blocks the indexer keeps | r = 0: none]
    o    = softmax(q . keys / sqrt(K) + mask, sink = attn_sinks[h]) @ keys        kq, kq_soft_max, kqv   [T, H, K]
    o    = rope_back(o, pos)                       (the keys' roped tail de-roped)   attn_derope           [T, H, K]
    oa   = einsum(o.reshape(T, G, I), W_o_a [G, Ro, I])                              attn_wo_a             [G, T, Ro]
    out  = oa.reshape(T, G*Ro) @ W_o_b.T                                             attn_out              [T, D]

The pooled blocks are attention/kv_compressor.py's (ratio 4 overlapping, 128 not); the CSA selection is
attention/csa_indexer.py's. A sink adds exp(sink_h - max) to the softmax's denominator only (ggml_soft_max_ext
with sinks, ggml-cpu ops.cpp:5896-5912). llama.cpp: `build_attention_impl` (src/models/deepseek4.cpp:878-1220),
`build_raw_attention` / `build_csa_lid_attention` / `build_hca_attention`. Its graph concatenates the raw cache
and the pooled cache, each padded to 256 cells (`csa_k_all`, `kq` [H, T, 256 + 256]); refengine traces the
same tensors unpadded, and refengine.compare aligns the two segments (`KV_SEGMENTS`).

Unless a trace keeps the scores (`kq`, `kq_soft_max`), each query attends only the keys it may see, gathered
(`gather_slots`, mha.attention_gathered): its n_swa window slots and its blocks (CSA: the indexer's top-k; HCA: every
finished one), O(T x (n_swa + k)); the dense form over [window | blocks] under the visibility mask is its oracle.

The state (`CompressedKV`, cache.py): the window's raw keys, and per compressor the pooled keys and the rows of
the block being filled.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant import QTensor

from ..cache import BlockFill, CompressedKV, CompressorRows, PooledBlocks
from ..ops import contiguous, rms_norm
from ..ops.arrays import as_array
from ..weights import W, dense_vector
from . import csa_indexer, kv_compressor
from .mha import attention_gathered, keeps_scores
from .rope_tail import TailRope

RATIOS = (0, 4, 128)
KIND = {0: "swa", 4: "csa", 128: "hca"}           # LayerSpec.attn of a layer of each ratio
ATTN_NAME = {0: "attn_raw", 4: "attn_csa_lid", 128: "attn_hca"}   # llama.cpp's name of the attention's output


@dataclass(frozen=True)
class CompressedKVConfig:
    ratio: int                  # attention.compress_ratios[il]: 0, 4 or 128
    n_head: int                 # attention.head_count
    head_dim: int               # attention.key_length (= value_length)
    q_lora: int                 # attention.q_lora_rank
    n_swa: int                  # attention.sliding_window
    o_groups: int               # attention.output_group_count
    o_lora: int                 # attention.output_lora_rank
    eps: float                  # attention.layer_norm_rms_epsilon (every norm of the layer)
    rope: TailRope              # the layer's rope (attention/rope_tail.py)
    idx_heads: int = 0          # attention.indexer.head_count   (ratio 4)
    idx_dim: int = 0            # attention.indexer.key_length
    idx_top_k: int = 0          # attention.indexer.top_k


def table(il: int, ac: CompressedKVConfig) -> list[W]:
    """The attention's tensors (deepseek4.cpp:104-148). attn_output_a is stored 2-D ({I, G*Ro}, the converter) or
    3-D ({I, Ro, G}, llama_model_saver); llama.cpp creates it {I, Ro, G} with TENSOR_ALLOW_RESHAPE (deepseek4.cpp:
    120-122: any shape of I*Ro*G elements), read here as the NumPy [G*Ro, I]: group g is rows g*Ro .. (g+1)*Ro.
    The compressors' `ape` [r, c*K] are small matrices read by row (ggml_get_rows: any type; llama.cpp's writer
    quantizes them like any matrix)."""
    p, H, K, Dq = f"blk.{il}.", ac.n_head, ac.head_dim, ac.q_lora
    t = [W("attn_sinks", p + "attn_sinks.weight", lambda c, s: (H,), dense=True),
         W("attn_q_a", p + "attn_q_a.weight", lambda c, s: (Dq, c.n_embd)),
         W("attn_q_a_norm", p + "attn_q_a_norm.weight", lambda c, s: (Dq,), dense=True),
         W("attn_q_b", p + "attn_q_b.weight", lambda c, s: (H * K, Dq)),
         W("attn_kv", p + "attn_kv.weight", lambda c, s: (K, c.n_embd)),
         W("attn_kv_a_norm", p + "attn_kv_a_norm.weight", lambda c, s: (K,), dense=True),
         W("attn_output_a", p + "attn_output_a.weight", lambda c, s: (ac.o_groups * ac.o_lora, H * K // ac.o_groups),
           reshape=True),
         W("attn_output_b", p + "attn_output_b.weight", lambda c, s: (c.n_embd, ac.o_groups * ac.o_lora))]
    if ac.ratio:
        cK = (2 if kv_compressor.overlap(ac.ratio) else 1) * K
        t += [W("attn_compressor_kv", p + "attn_compressor_kv.weight", lambda c, s: (cK, c.n_embd)),
              W("attn_compressor_gate", p + "attn_compressor_gate.weight", lambda c, s: (cK, c.n_embd)),
              W("attn_compressor_ape", p + "attn_compressor_ape.weight", lambda c, s: (ac.ratio, cK), small=True),
              W("attn_compressor_norm", p + "attn_compressor_norm.weight", lambda c, s: (K,), dense=True)]
    if ac.ratio == 4:
        Hi, di = ac.idx_heads, ac.idx_dim
        t += [W("indexer_proj", p + "indexer.proj.weight", lambda c, s: (Hi, c.n_embd)),
              W("indexer_attn_q_b", p + "indexer.attn_q_b.weight", lambda c, s: (Hi * di, Dq)),
              W("indexer_compressor_kv", p + "indexer_compressor_kv.weight", lambda c, s: (2 * di, c.n_embd)),
              W("indexer_compressor_gate", p + "indexer_compressor_gate.weight", lambda c, s: (2 * di, c.n_embd)),
              W("indexer_compressor_ape", p + "indexer_compressor_ape.weight", lambda c, s: (4, 2 * di), small=True),
              W("indexer_compressor_norm", p + "indexer_compressor_norm.weight", lambda c, s: (di,), dense=True)]
    return t


def new_state(ac: CompressedKVConfig) -> CompressedKV:
    """The layer's state: the window, and by ratio the pooled blocks / block being filled (and the indexer's)."""
    st = CompressedKV(ratio=ac.ratio)
    if ac.ratio:
        st.blocks, st.fill = PooledBlocks(), BlockFill()
    if ac.ratio == 4:
        st.index_keys, st.index_fill = PooledBlocks(), BlockFill()
    return st


def window_mask(pos: np.ndarray, kpos: np.ndarray, n_swa: int) -> np.ndarray:
    """[T, S] bool: key s is visible to query p iff p - n_swa < s <= p (LLAMA_SWA_TYPE_STANDARD,
    src/llama-hparams.h:482-487)."""
    p, s = as_array(pos)[:, None], as_array(kpos)[None, :]
    return (s <= p) & (s > p - n_swa)


def gather_slots(pos: np.ndarray, kpos: np.ndarray, n_swa: int, blocks: np.ndarray | None):
    """Which rows of keys = [window (S) | blocks] each query sees, as gather slots: pos [T] (this call's positions,
    the window's last T keys), kpos [S] the window's consecutive positions, blocks [T, nb] the query's block ids
    (-1: none) or None -> idx [T, n_swa + nb], live [T, n_swa + nb]: the n_swa window rows ending at the query's
    own (live where `window_mask`), then S + each block id (live where >= 0; a dead slot reads row 0). The live
    rows are exactly the query's row of [window_mask | chosen blocks], each once."""
    S, T = kpos.size, pos.size
    assert not isinstance(kpos, np.ndarray) or np.array_equal(kpos[S - T:], pos) and np.all(np.diff(kpos) == 1), \
        "the window holds consecutive positions"       # (checked on the host: a device's would be read back)
    own = S - T + np.arange(T)                                                  # [T] the query's own window row
    win = own[:, None] + np.arange(1 - n_swa, 1)[None, :]                       # [T, n_swa]
    idx = np.maximum(win, 0)
    live = (win >= 0) & window_mask(pos, kpos, n_swa)[np.arange(T)[:, None], idx]
    if blocks is not None:
        idx = np.concatenate([idx, np.where(blocks >= 0, S + blocks, 0)], axis=1)   # [T, n_swa + nb]
        live = np.concatenate([live, blocks >= 0], axis=1)
    return idx, live


def gather_slots_fixed(pos: np.ndarray, S: int, n_swa: int, blocks: np.ndarray | None):
    """`gather_slots` of a fixed-shape run, where the window is every position's key (row s = position s, S the
    capacity, `WindowKV.extend(fixed=True)`): the same slots in the same order, made from the positions alone."""
    win = pos[:, None] + np.arange(1 - n_swa, 1, like=pos)[None, :]             # [T, n_swa] rows = positions
    idx, live = np.maximum(win, 0), win >= 0
    if blocks is not None:
        idx = np.concatenate([idx, np.where(blocks >= 0, S + blocks, 0)], axis=1)   # [T, n_swa + nb]
        live = np.concatenate([live, blocks >= 0], axis=1)
    return idx, live


def attention_with_sinks(q, k, visible, kq_scale: float, sinks, record, il: int, dtype=np.float32) -> np.ndarray:
    """q [T, H, K], k [S, K] (K = V), visible [T, S] bool, sinks [H] -> [T, H, K]. dtype: float32 as llama.cpp,
    float64 for the tests.

    Traces `kq` [H, T, S] (unscaled), `v_cont` [K, S], `kq_soft_max` [H, T, S], `kqv` [H, T, K]."""
    T, H, K = q.shape
    assert k.shape[1] == K and visible.shape == (T, k.shape[0])
    kq = np.einsum("thk,sk->hts", q, k, dtype=dtype)                            # [H, T, S]
    record("v_cont", il, np.ascontiguousarray(k.T))
    record("kq", il, kq)
    x = kq * dtype(kq_scale) + np.where(visible, dtype(0), dtype(-np.inf))[None]   # [H, T, S]
    sinks = sinks.astype(dtype, copy=False)
    m = np.maximum(np.max(x, axis=-1, keepdims=True), sinks[:, None, None])     # the sink joins the max
    e = np.exp(x - m)                                                            # [H, T, S]
    den = np.sum(e, axis=-1, keepdims=True, dtype=np.float64) + np.exp(sinks[:, None, None] - m)   # + exp(sink - max)
    probs = (e * (1.0 / den)).astype(dtype)                                     # [H, T, S]
    record("kq_soft_max", il, probs)
    out = np.einsum("hts,sk->htk", probs, k, dtype=dtype)                       # [H, T, K]
    record("kqv", il, out)
    return out.transpose(1, 0, 2)                                               # [T, H, K]


def rows_of(w, field: str) -> np.ndarray:
    """A small matrix read by row (`ggml_get_rows`), decoded to float32 once per loaded layer."""
    key = field + "_rows"
    if getattr(w, key, None) is None:
        setattr(w, key, dense_vector(getattr(w, field)))
    return getattr(w, key)


def output_groups(w, ac: CompressedKVConfig) -> QTensor:
    """attn_output_a [G * Ro, I] as its G groups [G, Ro, I] (a view of the packed rows, made once per loaded layer):
    one per-head product (`Runtime.matmul_heads`: on a GPU one launch, else a product per group)."""
    groups = getattr(w, "attn_output_a_groups", None)
    if groups is None:
        t, Ro = w.attn_output_a, ac.o_lora
        raw = np.asarray(t.raw)
        groups = w.attn_output_a_groups = QTensor(t.name, t.type, (ac.o_groups, Ro, t.shape[1]),
                                                  raw.reshape(ac.o_groups, Ro, raw.shape[-1]))
    return groups


def compressor(h, w_kv, w_gate, ape, norm, *, pos, fill, blocks, rows, ratio, eps, rope, rt, name, il, rotate=None):
    """One compressor's pooled keys [N, K]: `kv_compressor.compress` on its fill and blocks, or in a fixed-shape
    run (`rows` given) `compress_fixed` on its rows (N = the capacity's blocks, the visible ones complete)."""
    if rows is not None:
        return kv_compressor.compress_fixed(h, w_kv, w_gate, ape, norm, pos=pos, rows=rows, ratio=ratio, eps=eps,
                                            rope=rope, rt=rt, rotate=rotate)
    return kv_compressor.compress(h, w_kv, w_gate, ape, norm, pos=pos, fill=fill, blocks=blocks, ratio=ratio, eps=eps,
                                  rope=rope, rt=rt, name=name, il=il, rotate=rotate)


def compressed_kv_attention(h, w, *, ac: CompressedKVConfig, il: int, state: CompressedKV, pos, rt,
                            gather: bool = True) -> np.ndarray:
    """h [T, D] (attn_norm's output) -> [T, D]; appends this call's keys and blocks to `state`.
    gather: each query attends its visible keys gathered (False, or a trace that keeps kq / kq_soft_max: the dense
    form under the visibility mask, its oracle)."""
    T = h.shape[0]
    H, K, eps, rope = ac.n_head, ac.head_dim, ac.eps, ac.rope
    pos = as_array(pos)                                                         # [T] (where it lives)
    fixed = rt.fixed_shapes         # the window and compressors over every position (fixed appends: capacity)
    rt.prefetch(h, [w.attn_q_a, w.attn_kv]                                      # h's products, made as one a type
                + ([w.attn_compressor_kv, w.attn_compressor_gate] if ac.ratio else [])   # where a device takes them
                + ([w.indexer_compressor_kv, w.indexer_compressor_gate, w.indexer_proj] if ac.ratio == 4 else []))
    qr = rt.matmul(h, w.attn_q_a)                                               # [T, Dq]
    rt.record("qr", il, qr)
    qr = rms_norm(qr, w.attn_q_a_norm, eps)
    rt.record("qr_norm", il, qr)
    q = rms_norm(rt.matmul(qr, w.attn_q_b).reshape(T, H, K), None, eps)         # [T, H*K] -> [T, H, K]
    rt.record("q_norm", il, q)
    kv = rms_norm(rt.matmul(h, w.attn_kv), w.attn_kv_a_norm, eps)[:, None, :]  # [T, 1, K]
    rt.record("kv_norm", il, kv)
    q, kv = rope.apply_pair(q, kv, pos)                                         # rotated alike (one launch)
    rt.record("q", il, q)
    rt.record("kv", il, kv)

    keys, kpos = state.window.extend(kv[:, 0], pos, fixed)                      # [S, K], [S]
    S = keys.shape[0]
    # the visibility mask [T, S] (with the blocks [T, S + N]) is made where it is read: the dense form, a trace
    visible = lambda: window_mask(pos, kpos, ac.n_swa)                          # noqa: E731
    block_ids = None                                                            # [T, nb] the blocks each query sees
    if ac.ratio:
        name = "csa" if ac.ratio == 4 else "hca"
        if fixed and state.fixed_rows is None:
            state.fixed_rows, state.index_rows = CompressorRows(), CompressorRows() if ac.ratio == 4 else None
        blocks = compressor(h, w.attn_compressor_kv, w.attn_compressor_gate, rows_of(w, "attn_compressor_ape"),
                            w.attn_compressor_norm, pos=pos, fill=state.fill, blocks=state.blocks,
                            rows=state.fixed_rows, ratio=ac.ratio, eps=eps, rope=rope.apply, rt=rt, name=name,
                            il=il)                                              # [N, K]
        if ac.ratio != 4:                                                       # HCA: every finished block
            chosen = csa_indexer.visible_blocks(pos, blocks.shape[0], ac.ratio)     # [T, N]
            block_ids = np.where(chosen, np.arange(blocks.shape[0], like=pos)[None, :], -1)
        else:
            ikeys = compressor(h, w.indexer_compressor_kv, w.indexer_compressor_gate,
                               rows_of(w, "indexer_compressor_ape"), w.indexer_compressor_norm, pos=pos,
                               fill=state.index_fill, blocks=state.index_keys, rows=state.index_rows, ratio=4,
                               eps=eps, rope=rope.apply, rt=rt, name="lid", il=il,
                               rotate=csa_indexer.rotate)                       # [N, di]
            chosen, block_ids = csa_indexer.select_blocks(qr, h, w, ikeys, pos=pos, n_head=ac.idx_heads,
                                                          head_dim=ac.idx_dim, top_k=ac.idx_top_k, rope=rope.apply,
                                                          rt=rt, il=il)         # [T, N], [T, top_k]
        rt.record(f"{name}_raw_k", il, keys[:, None, :])
        rt.record(f"{name}_comp_k", il, blocks[:, None, :])
        keys = np.concatenate([keys, blocks])                                   # [S + N, K]
        rt.record(f"{name}_k_all", il, keys[:, None, :])
        neg = lambda m: np.where(m, np.float32(0), np.float32(-np.inf))        # noqa: E731
        if ac.ratio == 4:
            rt.record("csa_top_k_mask", il, lambda: neg(chosen))
        window = visible
        visible = lambda: np.concatenate([window(), chosen], axis=1)           # noqa: E731  [T, S + N]
        rt.record("csa_lid_kq_mask" if ac.ratio == 4 else "hca_kq_mask", il, lambda: neg(visible()))
    if gather and not keeps_scores(rt, il):
        idx, live = gather_slots_fixed(pos, S, ac.n_swa, block_ids) if fixed else \
            gather_slots(pos, kpos, ac.n_swa, block_ids)                        # [T, n_swa + nb]
        rt.record("v_cont", il, lambda: contiguous(keys.T))
        o = attention_gathered(q, keys[:, None, :], keys[:, None, :], idx, live, 1.0 / np.sqrt(K),
                               sinks=w.attn_sinks)                              # [T, H, K]
        rt.record("kqv", il, o.transpose(1, 0, 2))                              # [H, T, K]
    else:
        o = attention_with_sinks(q, keys, visible(), 1.0 / np.sqrt(K), w.attn_sinks, rt.record, il)   # [T, H, K]
    rt.record(ATTN_NAME[ac.ratio], il, o.reshape(T, H * K))
    state.window.trim(ac.n_swa)
    state.n += T

    o = rope.apply(o, pos, inverse=True)                                        # [T, H, K]
    rt.record("attn_derope", il, o)
    og = o.reshape(T, ac.o_groups, H * K // ac.o_groups).transpose(1, 0, 2)     # [T, G, I] -> [G, T, I]
    oa = rt.matmul_heads(contiguous(og), output_groups(w, ac))                  # [G, T, Ro]
    rt.record("attn_wo_a", il, oa)
    out = rt.matmul(oa.transpose(1, 0, 2).reshape(T, -1), w.attn_output_b)     # [T, G*Ro] -> [T, D]
    rt.record("attn_out", il, out)
    return out
