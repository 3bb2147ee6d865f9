"""DeepSeek Sparse Attention (DSA): MLA that attends only to the keys the lightning indexer selects.

Legend: T new tokens, S cached positions, D model dim, Dq q-LoRA rank.

    qr    = rms_norm(h @ Wq_a.T) * q_a_norm                 [T, Dq]   `qr`, shared by both parts
    sel   = lightning_indexer(h, qr)                        attention/dsa_indexer.py: top-k positions + mask
            (or, in a layer without its own indexer, the selection of layer `indexer.source` in this same step)
    attn  = mla(h, mask = sel.mask)                         attention/mla.py, absorbed (llama.cpp's) or naive

MLA attends each query's selected keys only (`sparse_mask`: the top-k positions, gathered, O(T x k)) unless a trace
keeps the scores (`kq`, `kq_soft_max` [H, T, S], as llama.cpp's graph computes them): then the whole [T, S] mask.

llama.cpp: `src/models/deepseek32.cpp:217-402` and `src/models/glm-dsa.cpp:243-365` (shared layers),
`build_attn` for DSA (src/llama-graph.cpp:3039-3110). The selection travels between layers through the step
(`Step.memo`), so a shared layer needs no state of its own beyond its MLA cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache import DSAState
from ..errors import ConfigError
from ..weights import W
from . import dsa_indexer, mla
from .dsa_indexer import IndexerConfig, Selection
from .mha import SparseMask
from .mla import MLAConfig

FORMS = mla.FORMS


@dataclass(frozen=True)
class DSAConfig:
    """A DSA layer's attention config (`LayerSpec.attn_cfg` of a "dsa" layer): its MLA and its indexer."""
    mla: MLAConfig
    indexer: IndexerConfig     # the layer's own indexer (full) or the layer whose selection it shares


def dsa_table(il: int, dc: DSAConfig) -> list[W]:
    """MLA's tensors, then the indexer's (required where the layer runs its own indexer)."""
    return mla.mla_table(il, dc.mla) + dsa_indexer.indexer_table(il, dc.indexer, q_lora_rank=dc.mla.q_lora_rank)


def new_state(dc: DSAConfig, form: str | None = None, dtype=np.float32) -> DSAState:
    """A DSA layer's state: the MLA cache of `form` (None: llama.cpp's) and, where the layer runs its own
    indexer, its key cache. The state carries the form (`DSAState.form`)."""
    return DSAState(kv=mla.new_state(dc.mla, form, dtype), index=dsa_indexer.new_state(dc.indexer, dtype))


def selection_key(il: int) -> tuple[str, int]:
    return ("dsa_selection", il)


def sparse_mask(sel: Selection, q0: int, gather: bool = True, pos=None, fixed: bool = False) -> SparseMask:
    """The indexer's selection as MLA's mask, both forms: query row t (position q0 + t) attends top_k[t] where
    causal (sel.mask = the top-k mask + the causal one; top_k holds each position once, and names masked
    positions only where fewer than k are visible, `dsa_indexer.select_top_k`). pos: the queries' positions
    (`step.pos`; None: q0 + 0..T-1); fixed: the selection spans the cache's capacity (`SparseMask.fixed`)."""
    q_pos = q0 + np.arange(sel.top_k.shape[0]) if pos is None else pos            # [T]
    return SparseMask(mask=sel.mask, idx=sel.top_k, live=sel.top_k <= q_pos[:, None], q0=q0, gather=gather,
                      fixed=fixed)


def sparse_mla(h, w, *, dc: DSAConfig, il: int, state: DSAState, cos, sin, rt, step,
               rotate: bool = True, gather: bool = True) -> np.ndarray:
    """One DSA attention sub-block: h [T, D] (attn_norm output) -> [T, D] (before the residual add).

    state: this layer's `new_state(dc, form)` (MLA runs in its form); step: the forward call's Step (carries
    the selection from a full layer to the shared layers after it). cos, sin [T, R/2]: the rope part's (MLA
    and indexer share them). gather: MLA attends the selected keys gathered (False: masked-dense, the oracle;
    a trace that keeps the scores runs the one-shot masked form either way).
    """
    T, mc, ic = h.shape[0], dc.mla, dc.indexer
    rt.prefetch(h, [w.attn_q_a, w.attn_kv_a_mqa] + ([w.indexer_attn_k, w.indexer_proj] if ic.full else []))
    qr = mla.project_q_a(h, w, mc=mc, rt=rt, il=il, name="qr")                     # [T, Dq]
    if ic.full:
        sel = step.memo(selection_key(il), lambda: dsa_indexer.lightning_indexer(
            h, qr, w, ic=ic, state=state.index, cos=cos, sin=sin, rt=rt, il=il, rotate=rotate, pos=step.pos))
    else:
        def missing():
            raise ConfigError(f"layer {il} shares the indexer of layer {ic.source}, which has not run in this step")
        sel = step.memo(selection_key(ic.source), missing)
        rt.record("top_k", il, lambda: sel.top_k.astype(np.int32))      # llama.cpp names the shared tensor again (glm-dsa.cpp:366)
    S = state.n + T
    assert sel.mask.shape[0] == T and (rt.fixed_shapes or sel.mask.shape[1] == S), \
        f"layer {il}: selection mask {sel.mask.shape}, expected {(T, S)}"     # fixed shapes: S = the capacity
    return mla.mla(h, w, mc=mc, il=il, state=state.kv, cos=cos, sin=sin, rt=rt,
                   mask_fn=sparse_mask(sel, S - T, gather, step.pos, rt.fixed_shapes), qr=qr, pos=step.pos)
