"""Hashed n-gram embeddings (Qwen3.8-Flash-Next's "PLE"): one table row per (n-gram order, hash head) and token.

Legend: T tokens, N n-gram size (`ple.ngram_size`, 2..8), G heads per order (`ple.heads_per_ngram`),
Hn = (N-1)*G hash heads, E the row width (`embedding_length_per_layer_input`; Hn*E = D), P streams, D model dim,
Kc the conv kernel (`ple.conv_kernel`).

The hash (host side in llama.cpp, `llm_graph_input_qwen4exp_ple::set_input`, src/models/qwen4exp.cpp:1067-1142):

    ctx[0] = tok[p];  ctx[s] = tok[p-s] for s = 1..N-1, except that once a predecessor is missing (before the
             sequence start) or is EOS (`ple.eos_token_id`), it and every older one read as EOS
             (the token's own EOS does not cut its context)
    mixed_n = XOR_{j<n} ctx[j] * mult[j]                  uint64, wrapping       n = 2..N  (`ple.layer_multipliers`)
    row[h]  = mixed_n % vocab[h] + offset[h]              h = (n-2)*G + g        (`ple.head_vocab_sizes`, `head_offsets`)
    emb     = concat_h per_layer_token_embd[row[h]]       [T, Hn*E]               ple_embd

The authors' hash (transformers 5.23 `Qwen4ExpTextNGramEmbedding`) is the same: int64 with `torch.remainder`,
which agrees with the uint64 `%` because the multipliers are bounded by (2^63-1) / vocabulary, so every product
and XOR stays a non-negative int64 (a file with larger multipliers would make the two differ).

The table (`per_layer_token_embd`, ne {E, rows}; 51B parameters at full size) is read row by row from the
mmapped file: only the Hn rows per token cost memory (`lookup`).

The block on the PLE layer (`build_ple`, qwen4exp.cpp:1220-1308), before that layer's stream mixer:

    key   = rms_norm((emb @ ple_key.T).view(P, D)) * ple_norm_key        [T, P, D]
    query = rms_norm(R) * ple_norm_query                                  [T, P, D]
    s     = sum_D(key * query) / sqrt(D)                                  [T, P]
    gate  = sigmoid(sign(s) * sqrt(max(|s|, 1e-6)))                       ple_gate          (sign(0) = 0: 0.5)
    gated = (emb @ ple_value.T)[:, None] * gate[..., None]                ple_gated_value   [T, P, D]
    nrm   = rms_norm(gated) * ple_norm_conv                               [T, P*D]
    conv  = sum_k w[:, k] * nrm[t - (Kc-1-k)*N]                           dilated by N, history carried
    R     = R + (gated + silu(conv).view(P, D))                           ple_conv_out

The token history (N-1 ids) and the conv history ((Kc-1)*N rows of nrm) are the layer's `NGramState`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..cache import NGramState, WithNGram
from ..ops import rms_norm, sigmoid, silu
from ..ops.arrays import as_array
from ..weights import W


@dataclass(frozen=True)
class NGramConfig:
    layer: int                  # ple.layers (exactly one entry, a linear-attention layer)
    n: int                      # ple.ngram_size (N)
    heads_per_ngram: int        # ple.heads_per_ngram (G)
    conv_kernel: int            # ple.conv_kernel (Kc)
    eos: int                    # ple.eos_token_id: resets the hash window
    head_dim: int               # embedding_length_per_layer_input (E)
    multipliers: tuple          # ple.layer_multipliers (>= N entries, uint64)
    offsets: tuple              # ple.head_offsets (Hn entries)
    vocab_sizes: tuple          # ple.head_vocab_sizes (Hn entries)

    @property
    def n_heads(self) -> int:
        return (self.n - 1) * self.heads_per_ngram

    @property
    def history(self) -> int:
        """Rows of conv history carried: (Kc-1) * N (the dilation is N)."""
        return (self.conv_kernel - 1) * self.n

    @property
    def rows(self) -> int:
        """Table rows the head ranges need (the file may hold more: the converter pads)."""
        return max(o + v for o, v in zip(self.offsets, self.vocab_sizes))


def new_state(attn_state) -> WithNGram:
    """The PLE layer's container: its attention's and a fresh n-gram state (no history: the start)."""
    return WithNGram(attn=attn_state, ngram=NGramState())


def global_table(nc: NGramConfig) -> list[W]:
    """The shared table, ne {E, rows >= the head ranges} (read lazily, never decoded whole)."""
    return [W("per_layer_token_embd", "per_layer_token_embd.weight", None)]


def ple_table(il: int, P: int, nc: NGramConfig) -> list[W]:
    """The PLE layer's tensors (qwen4exp.cpp:230-237): ple_conv1d in any float type (cast in the graph)."""
    p = f"blk.{il}."
    PD = lambda c, s: (P, c.n_embd)                                  # noqa: E731  ne {D, P}
    return [W("ple_key", p + "ple_key.weight", lambda c, s: (P * c.n_embd, c.n_embd)),
            W("ple_value", p + "ple_value.weight", lambda c, s: (c.n_embd, c.n_embd)),
            W("ple_norm_key", p + "ple_norm_key.weight", PD, dense=True, reshape=True),
            W("ple_norm_query", p + "ple_norm_query.weight", PD, dense=True, reshape=True),
            W("ple_norm_conv", p + "ple_norm_conv.weight", PD, dense=True, reshape=True),
            W("ple_conv1d", p + "ple_conv1d.weight", lambda c, s: (P * c.n_embd, nc.conv_kernel), dense=True,
              accepts=("F32", "F16", "BF16"))]


# ---------------------------------------------------------------- the hash

def contexts(tokens: np.ndarray, prev: np.ndarray, nc: NGramConfig) -> np.ndarray:
    """tokens [T], prev [<= N-1] (the ids before them, oldest first) -> ctx [T, N] int64: ctx[:, 0] the token,
    ctx[:, s] its s-th predecessor, EOS from the first missing or EOS predecessor on. Computed where the tokens
    live (no read of them: a device's ids stay there)."""
    hist = np.concatenate([as_array(prev, np.int64), as_array(tokens, np.int64)])   # [n0 + T]
    T, n0 = len(tokens), len(prev)
    src = (n0 + np.arange(T, like=hist))[:, None] - np.arange(nc.n, like=hist)[None, :]   # [T, N] s-th predecessor
    t = np.where(src >= 0, hist[np.maximum(src, 0)], -1)                  # [T, N] -1: before the sequence start
    stop = ((t < 0) | (t == nc.eos)) & (np.arange(nc.n, like=hist) > 0)  # [T, N] (the token itself never stops)
    cut = np.cumsum(stop, axis=1) > 0                                     # [T, N] from the first stop on
    return np.where(cut, np.int64(nc.eos), t)                             # [T, N]


def hash_rows(ctx: np.ndarray, nc: NGramConfig) -> np.ndarray:
    """ctx [T, N] -> table rows [T, Hn] (uint64 wrapping multiply and XOR, then % vocab + offset)."""
    T = ctx.shape[0]
    mult = _multipliers(nc.multipliers[:nc.n])
    prod = ctx.astype(np.uint64) * mult[None, :]                          # [T, N] wraps modulo 2^64
    rows = np.empty_like(ctx, shape=(T, nc.n_heads), dtype=np.int64)      # (where ctx lives)
    mixed = prod[:, 0].copy()                                             # [T]
    for n in range(2, nc.n + 1):
        mixed ^= prod[:, n - 1]                                           # XOR of ctx[j] * mult[j], j < n
        for g in range(nc.heads_per_ngram):
            h = (n - 2) * nc.heads_per_ngram + g
            rows[:, h] = (mixed % np.uint64(nc.vocab_sizes[h])).astype(np.int64) + nc.offsets[h]
    return rows


@functools.lru_cache(maxsize=8)
def _multipliers(mult: tuple) -> np.ndarray:
    """The hash's multipliers as a read-only uint64 array, made once (a constant: one copy on a device)."""
    m = np.asarray(mult, np.uint64)
    m.flags.writeable = False
    return m


def lookup(table, rows: np.ndarray, rt) -> np.ndarray:
    """rows [T, Hn] -> [T, Hn*E]: the rows read from the mmapped table, heads concatenated (h = 0 first)
    (`rt.embed_rows`: on the device where the rows are)."""
    T, Hn = rows.shape
    emb = rt.embed_rows(table, rows.reshape(-1))                          # [T*Hn, E]  only these rows are read
    return emb.reshape(T, -1).astype(np.float32)


def embed(tokens: np.ndarray, st: NGramState, table, nc: NGramConfig, rt) -> np.ndarray:
    """The n-gram embedding of this call's tokens [T] -> [T, Hn*E]; the state's token history moves on."""
    ctx = contexts(tokens, st.tokens, nc)                                 # [T, N]
    rows = hash_rows(ctx, nc)                                             # [T, Hn]
    emb = lookup(table, rows, rt)                                         # [T, Hn*E]
    rt.record("ple_embd", -1, emb)
    st.tokens = np.concatenate([as_array(st.tokens, np.int64), as_array(tokens, np.int64)])[-(nc.n - 1):]
    return emb


# ---------------------------------------------------------------- the block

def dilated_conv(x: np.ndarray, w: np.ndarray, hist: np.ndarray | None, dil: int):
    """x [T, C], w [C, Kc], hist [(Kc-1)*dil, C] or None -> (silu-free conv [T, C], new hist).
    y[t, c] = sum_k w[c, k] * xin[t + (Kc-1)*dil - (Kc-1-k)*dil, c], summed k ascending in float32."""
    T, C = x.shape
    Kc = w.shape[1]
    L = (Kc - 1) * dil
    if hist is None:
        hist = np.zeros((L, C), np.float32)
    xin = np.concatenate([hist, x])                                       # [L + T, C]
    y = None
    for k in range(Kc):
        start = L - (Kc - 1 - k) * dil
        term = xin[start:start + T] * as_array(w[:, k], np.float32)       # [T, C] (a float32 weight: not copied)
        y = term if y is None else y + term
    return y, xin[xin.shape[0] - L:].copy()


def ple_block(R: np.ndarray, emb: np.ndarray, w, nc: NGramConfig, st: NGramState, *, eps: float, rt, il: int):
    """R [T, P, D], emb [T, D] -> R + gated value + silu(dilated conv); the conv history in `st` moves on."""
    T, P, D = R.shape
    key = rms_norm(rt.matmul(emb, w.ple_key).reshape(T, P, D), None, eps) * w.ple_norm_key     # [T, P, D]
    value = rt.matmul(emb, w.ple_value)                                                        # [T, D]
    query = rms_norm(R, None, eps) * w.ple_norm_query                                          # [T, P, D]
    s = np.sum(key * query, axis=-1, dtype=np.float64).astype(np.float32)                      # [T, P]
    s = s * np.float32(1.0 / np.sqrt(np.float32(D)))
    mag = np.sqrt(np.maximum(np.abs(s), np.float32(1e-6)))
    gate = sigmoid(np.sign(s) * mag)                                                           # [T, P]
    rt.record("ple_gate", il, gate[..., None])
    gated = value[:, None, :] * gate[..., None]                                                # [T, P, D]
    rt.record("ple_gated_value", il, gated)
    nrm = (rms_norm(gated, None, eps) * w.ple_norm_conv).reshape(T, P * D)                     # [T, P*D]
    hist = st.conv if st.conv is not None else np.zeros((nc.history, P * D), np.float32)
    rt.record("conv_state_at", il, hist.T[None])                                               # [1, P*D, L]
    conv, st.conv = dilated_conv(nrm, w.ple_conv1d, hist, nc.n)                                # [T, P*D]
    conv = silu(conv).reshape(T, P, D)
    rt.record("ple_conv_out", il, conv)
    return R + (gated + conv)
