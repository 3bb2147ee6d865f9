"""DeepSeek-V4's KV compressor: every `ratio` tokens are pooled into one key, by a learned per-dimension gate.

Legend: T tokens, D model dim, K pooled key dim (dh for attention, di for the indexer), r ratio, R rope dims,
c = 2 for the overlapping compressor (ratio 4), 1 otherwise (ratio 128). Per token j (position p_j):

    kv_j    = h_j @ W_kv.T                                  csa_state_kv / hca_state_kv / lid_state_kv     [T, c*K]
    score_j = h_j @ W_gate.T + ape[p_j % r]                 *_state_score, *_state_score_ape               [T, c*K]

Block b (positions r*b .. r*b + r - 1) is pooled once its last token is seen; per dimension d, a softmax over
the pooled rows' gate scores weighs their values:

    ratio 128 (HCA, c = 1):  rows = the block's r tokens
    ratio 4   (CSA, c = 2):  rows = the previous block's r tokens, columns [:K]   (b = 0: one zero row, score -inf)
                                  + this block's r tokens, columns [K:]
    ck_b[d] = sum_rows softmax(score[:, d]) * kv[:, d]                                                    [K]
    ck_b    = rms_norm(ck_b) * norm;  rope(ck_b, position r*b) on its last R dims   *_state_compress      [K]

llama.cpp: `build_hca_compressed_kv_from_state` / `build_overlap_compressed_kv_from_state`
(src/models/deepseek4.cpp:470-588), the block plan in `dsv4_build_comp_plan` (src/llama-kv-cache-dsv4.cpp:427-641:
a block is written when its last position is in the ubatch, at rope position `source_start` = r*b). The rows
not yet pooled are carried between calls in a `BlockFill` (cache.py), the pooled keys in `PooledBlocks`.
"""
from __future__ import annotations

import numpy as np

from ..cache import BlockFill, CompressorRows, PooledBlocks, append_rows
from ..ops import rms_norm
from ..ops.arrays import as_array, fused_op, take_rows
from ..ops.softmax import softmax


def overlap(ratio: int) -> bool:
    """Whether the compressor of this ratio pools overlapping windows (ratio 4: CSA and its indexer)."""
    return ratio == 4


def pool_blocks(kv: np.ndarray, score: np.ndarray, start: int, blocks: list[int], ratio: int) -> np.ndarray:
    """The softmax-pooled values of finished blocks, before the norm.

    kv, score: [n, c*K], the rows of positions start .. start + n - 1 (for the overlapping compressor they include
    the block before the first one pooled, when it exists); blocks: the block indices to pool (consecutive, as
    `compress` finishes them) -> [len(blocks), K]. Per block b (its rows cur = b*r .. b*r + r - 1):

        v, s = kv[cur], score[cur]                                   c = 1
        v, s = [kv[cur - r, :K]; kv[cur, K:]], the same of score     c = 2 (block 0: one row of 0 with score -inf
                                                                            in place of the block before)
        out[b] = sum over the rows of v * softmax_rows(s), per dimension

    The blocks are pooled together (one [n, K, rows] softmax and sum: each block's row the same ops, so the same
    numbers as block by block), block 0 of the overlapping compressor on its own."""
    c = 2 if overlap(ratio) else 1
    K = kv.shape[1] // c
    out = np.empty_like(kv, shape=(len(blocks), K), dtype=np.float32)            # where kv lives (a device)
    if not blocks:
        return out
    assert list(blocks) == list(range(blocks[0], blocks[0] + len(blocks))), blocks
    i0 = 0
    if c == 2 and blocks[0] == 0:                        # no block before: one zero value with score -inf
        v = np.concatenate([np.zeros((1, K), np.float32), kv[-start:ratio - start, K:]])         # [1 + r, K]
        s = np.concatenate([np.full((1, K), -np.inf, np.float32), score[-start:ratio - start, K:]])
        out[0] = np.sum(v.T * softmax(s.T), axis=-1, dtype=np.float32)          # [K]
        i0 = 1
    n = len(blocks) - i0
    if n:
        b0 = blocks[i0]
        cur = slice(b0 * ratio - start, (b0 + n) * ratio - start)               # the blocks' own rows, in order
        if c == 1:
            v, s = kv[cur].reshape(n, ratio, K), score[cur].reshape(n, ratio, K)          # [n, r, K]
        else:
            prev = slice((b0 - 1) * ratio - start, (b0 - 1 + n) * ratio - start)           # each block's before
            v = np.concatenate([kv[prev, :K].reshape(n, ratio, K), kv[cur, K:].reshape(n, ratio, K)], axis=1)
            s = np.concatenate([score[prev, :K].reshape(n, ratio, K), score[cur, K:].reshape(n, ratio, K)], axis=1)
        v, s = v.transpose(0, 2, 1), s.transpose(0, 2, 1)                        # [n, K, rows]: per dim
        out[i0:] = np.sum(v * softmax(s), axis=-1, dtype=np.float32)            # [n, K]
    return out


def finish(pooled: np.ndarray, norm, eps: float, rope, blocks, ratio: int) -> np.ndarray:
    """rms_norm * norm, then rope at the blocks' first positions: [n, K] -> [n, 1, K]."""
    ck = rms_norm(pooled, norm, eps)
    return rope(ck[:, None, :], np.asarray(blocks, dtype=np.int64) * ratio)


def placeholder(kv_row: np.ndarray, score_row: np.ndarray, ratio: int) -> np.ndarray:
    """llama.cpp's placeholder block: every pooled row is the one given (both halves of it for ratio 4). -> [1, K]"""
    c = 2 if overlap(ratio) else 1
    K = kv_row.shape[0] // c
    halves = [slice(0, K), slice(K, 2 * K)][:c]
    v = np.concatenate([np.repeat(kv_row[None, h], ratio, 0) for h in halves])             # [c*r, K]
    s = np.concatenate([np.repeat(score_row[None, h], ratio, 0) for h in halves])
    return np.sum(v.T * softmax(s.T), axis=-1, dtype=np.float32)[None]        # [1, K]


def compress(h, w_kv, w_gate, ape, norm, *, pos, fill: BlockFill, blocks: PooledBlocks, ratio: int, eps: float,
             rope, rt, name: str, il: int, rotate=None):
    """Project this call's tokens, pool every block that finishes in it, append the pooled keys.

    h [T, D]; pos [T] (consecutive); ape [r, c*K]; norm [K]; rope(x [n, 1, K], positions [n]) -> roped;
    rotate: applied to the roped keys before they are kept (the indexer's Hadamard rotation), or None.
    Returns every pooled key so far [n_blocks, K]. Traces `{name}_state_kv`, `_score`, `_score_ape`, `_compress`
    (and `_compress_rot`)."""
    kv, score = rt.matmul_many(h, [w_kv, w_gate])                               # [T, c*K] each
    rt.record(f"{name}_state_kv", il, kv)
    rt.record(f"{name}_state_score", il, score)
    score = score + take_rows(ape, as_array(pos) % ratio)                       # [T, c*K]
    rt.record(f"{name}_state_score_ape", il, score)
    rows_kv, rows_score, start = fill.extend(kv, score)
    end = start + rows_kv.shape[0]                                              # positions start .. end - 1 held
    first = end - kv.shape[0]                       # this call's first position (= pos[0], known on the host: a
    assert not isinstance(pos, np.ndarray) or int(pos[0]) == first, (pos, first)   # device's pos is not read back)
    done = list(range(first // ratio, end // ratio))                            # blocks whose last position is new
    if done:
        ck = finish(pool_blocks(rows_kv, rows_score, start, done, ratio), norm, eps, rope, done, ratio)   # [n, 1, K]
        blocks.append((ck if rotate is None else rotate(ck))[:, 0])
    else:
        ck = np.zeros((0, 1, norm.shape[0]), np.float32)
    # llama.cpp's graph keeps its shape with a placeholder block, written to a masked cache cell, when a call
    # finishes no block (kv-cache-dsv4.cpp:557-620; measured: a ratio-4 prefill of 5 or 7 tokens has 1 block, no
    # placeholder, one of 1..3 tokens the placeholder alone). It is pooled from the call's first row alone, at
    # position 0. Traced, never attended.
    if not done:
        dummy = finish(placeholder(kv[0], score[0], ratio), norm, eps, rope, [0], 0)
        ck = np.concatenate([ck, dummy])
    rt.record(f"{name}_state_compress", il, ck)
    if rotate is not None:
        rt.record(f"{name}_state_compress_rot", il, rotate(ck))
    nxt = end // ratio                                                          # the next block to finish
    fill.keep_from((nxt - 1) * ratio if overlap(ratio) else nxt * ratio)
    got = blocks.view()
    return np.zeros((0, norm.shape[0]), np.float32) if got is None else got


def pool_blocks_at(all_kv, all_score, b, ratio: int, c: int, K: int):
    """Blocks b [n] (on the device in a resident run) pooled from a fixed-shape run's rows as they are: [n, K]. A
    block's rows b*r .. b*r + r - 1 (those past the capacity are past every position: not yet the block's), and for
    the overlapping compressor (c = 2) the block before's first halves (b = 0: r rows of weight 0, where
    `pool_blocks` has one: the same weights summed in another order). On a GPU one launch (cuda/fused.py)."""
    if (k := fused_op(all_kv, "pool_at")) is not None and (y := k(all_kv, all_score, b, ratio, c, K)) is not None:
        return y
    cur = np.minimum(b[:, None] * ratio + np.arange(ratio, like=b)[None, :], all_kv.shape[0] - 1)   # [n, r]
    v, s = all_kv[cur, (c - 1) * K:], all_score[cur, (c - 1) * K:]              # [n, r, K]
    if c == 2:
        prev = np.maximum(cur - ratio, 0)                                       # [n, r]
        first = (b == 0)[:, None, None]
        v = np.concatenate([np.where(first, np.float32(0), all_kv[prev, :K]), v], axis=1)          # [n, 2r, K]
        s = np.concatenate([np.where(first, np.float32(-np.inf), all_score[prev, :K]), s], axis=1)
    v, s = v.transpose(0, 2, 1), s.transpose(0, 2, 1)                           # [n, K, rows]: over the rows, per dim
    return np.sum(v * softmax(s), axis=-1, dtype=np.float32)                    # [n, K]


def compress_fixed(h, w_kv, w_gate, ape, norm, *, pos, rows: CompressorRows, ratio: int, eps: float,
                   rope, rt, rotate=None):
    """`compress` with shapes that do not depend on the position (a fixed-shape run): the same projections, kept
    per position (`CompressorRows`, row = position, fixed appends); returns the pooled keys [S // r, K] of the
    capacity's blocks, block b the key its last position wrote (the visible blocks, b < (p + 1) // r, are complete).

    One token (a decode step): its block b = p // r is pooled from the rows there as of p, every token the same
    ops (the rows past p are not the block's yet: the key is final at p = b*r + r - 1, where it equals `compress`'s,
    the same rows through the same ops; block 0 of the overlapping compressor is the exception, its "previous
    block" r rows of weight 0 here, one in `pool_blocks`: the same weights summed in another order).
    More tokens (a prefill's ubatch): the blocks that finish in the call, found from its first position on the
    device (the same ops whatever the position: a ubatch step captured once), pooled the same way, written at their
    last positions (the other rows 0). No traces (fixed_shapes refuses one)."""
    T, c = h.shape[0], 2 if overlap(ratio) else 1
    K = norm.shape[0]
    kv, score = rt.matmul_many(h, [w_kv, w_gate])                               # [T, c*K] each
    score = score + take_rows(ape, as_array(pos) % ratio)                       # [T, c*K]
    all_kv, all_score = append_rows(rows.kv, kv, rows.score, score, fixed=True)     # [S, c*K] each, one write
    if T == 1:
        b = as_array(pos) // ratio                                              # [1] (on the device in a resident run)
        pooled = pool_blocks_at(all_kv, all_score, b, ratio, c, K)             # [1, K]
        ck = rope(rms_norm(pooled, norm, eps)[:, None, :], b * ratio)           # [1, 1, K]
        ck = ck if rotate is None else rotate(ck)
    else:                       # the blocks that end in the call, from its first position on the device:
        p0 = as_array(pos)[:1]  # ceil(T / r) candidates, the last one's end past the call when the count is one less
        t_end = (ratio - 1 - p0 % ratio) + ratio * np.arange(-(-T // ratio), like=p0)          # [nb] rows of the call
        b = (p0 + t_end) // ratio                                                              # [nb] their blocks
        new = rope(rms_norm(pool_blocks_at(all_kv, all_score, b, ratio, c, K), norm, eps)[:, None, :], b * ratio)
        ck = np.zeros_like(kv, shape=(T + 1, 1, K))                 # row T: the candidate past the call's rows, dropped
        ck[np.where(t_end < T, t_end, T)] = new if rotate is None else rotate(new)
        ck = ck[:T]                                                             # [T, 1, K] (rows other than ends: 0)
    all_ck = rows.ck.append(ck[:, 0], fixed=True)                               # [S, K]
    return all_ck[ratio - 1::ratio]                                             # [S // r, K]
