"""Compare refengine against llama.cpp tensor by tensor; name the first tensor that diverges.

Metrics per tensor (ref = llama.cpp, got = refengine, both flattened in NumPy order):

    nmse    = sum((got - ref)^2) / sum(ref^2)
    max_abs = max |got - ref|
    cosine  = <got, ref> / (|got| |ref|)

Logits add top-1 agreement and the KL divergence KL(P_ref || P_got) per position (mean and max). A top-1
mismatch where llama.cpp's margin between its pick and ours is within twice the logit error at that
position is a near-tie: reported, not failed (the same rule as for expert ids).
Expert ids (`ffn_moe_topk`) are compared as sets per token; a disagreement at the top-k boundary
where llama.cpp's own probabilities tie (within `TIE_EPS`) is reported as a tie, not a failure.
Tensors indexed by routing slot (`ffn_moe_up`, `ffn_moe_weights`, ...) are aligned by expert id first.
DSA key selections (`top_k`, positions per query; glm5-next's `indexer_top_k`, pools per query) are compared as
sets of the causally visible positions (pools); a
difference where llama.cpp's gap between the k-th and (k+1)-th indexer score (`indexer_score`) is within the
measured score error of that query is a near-tie, reported and not failed (the same rule). The attention
tensors that depend on the selection (`kq_soft_max`, `kqv`, `kqv_mla`, `kqv_out`) are then compared only on
the queries whose sets agree, in the selecting layer and in the layers that share its selection.
NaN or inf never passes.

Tolerances (NMSE, per tensor), by the activation rounding llama.cpp's CPU backend applies and this
engine's *exact* mode does not (see `quant.formats` vec_dot_type). *llamacpp* mode applies that rounding
too (`quant.llamacpp`), so only float summation order is left: one target, 1e-7, for every weight class.
A rounding flip (a value within float noise of a rounding boundary, see `refengine.flips`) can exceed it;
that is reported as a divergence, not hidden by a looser tolerance.

| weights in the model                      | exact mode | llamacpp mode |
|-------------------------------------------|-----------|---------------|
| F32 only                                  | 1e-8      | 1e-8          |
| F16 (activations rounded to f16)          | 1e-5      | 1e-7          |
| BF16 (activations rounded to bf16)        | 1e-3      | 1e-7          |
| quantized (activations to Q8_0/Q8_1/Q8_K) | 1e-2      | 1e-7          |
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from quant import GGMLType

TIE_EPS = 1e-5
SLOT_TENSORS = ("ffn_moe_weights", "ffn_moe_weights_norm", "ffn_moe_weights_scaled", "ffn_moe_up", "ffn_moe_gate",
                "ffn_moe_swiglu", "ffn_moe_silu", "ffn_moe_situ", "ffn_moe_swiglu_limited", "ffn_moe_down", "ffn_moe_weighted",
                "ffn_moe_up_scaled", "ffn_moe_gate_scaled", "ffn_moe_down_scaled")
KV_PADDED = ("kq", "kq_soft_max", "v_cont", "indexer_score",   # [H, T, n_kv] / [C, n_kv] in llama.cpp, n_kv >= S
             "lid_score_masked", "csa_top_k_mask",              # DeepSeek-V4: [T, n_blocks] padded to 256
             "indexer_score_tokens",                             # QSA's cell scores
             "indexer_sel", "kq_mask_dsa")                      # glm5-next: [T, n_kv] selection masks
# tensors padded along their first axis (cells, blocks, pools): llama.cpp's rows after refengine's are padding.
# DeepSeek-V4 (attention/compressed_kv.py): caches [n_cells, 1, K]; glm5-next: pools [n_pool, 1, di], padded to 64;
# QSA's pooled block keys [n_blocks, di]: llama.cpp pools ceil(n_kv / r) blocks of its padded cache, the complete
# ones first, then the "dead" block (and copies of it); refengine the complete ones and the dead one
ROWS_PADDED = ("csa_raw_k", "csa_comp_k", "hca_raw_k", "hca_comp_k", "lid_k", "indexer_pool_k",
               "indexer_k_pooled", "indexer_k")
# ... and tensors whose key axis is [raw cells | pooled cells], each segment padded: name -> the key axis. The
# segments' lengths are read from the layer's `{csa,hca}_raw_k` / `_comp_k` on each side.
KV_SEGMENTS = {"kq": -1, "kq_soft_max": -1, "v_cont": -1, "csa_lid_kq_mask": -1, "hca_kq_mask": -1,
               "csa_k_all": -3, "hca_k_all": -3}
# a sparse selection (positions per query) -> the scores it was taken from: DSA's top_k, DeepSeek-V4's lid_top_k,
# QSA's indexer_top_k
SELECTIONS = {"top_k": "indexer_score", "lid_top_k": "lid_score_masked", "indexer_top_k": "indexer_score_tokens"}
SELECTION_ROWS = {"kq_soft_max": 1, "kqv": 1, "kqv_mla": 1, "kqv_out": 0,   # DSA: name -> the query (T) axis
                  "csa_top_k_mask": 0, "csa_lid_kq_mask": 0, "attn_csa_lid": 0, "attn_derope": 0,   # DeepSeek-V4
                  "attn_wo_a": 1, "attn_out": 0, "indexer_sel": 0, "kq_mask_dsa": 0}   # glm5-next
TOLERANCE_EXACT = {"F32": 1e-8, "F16": 1e-5, "BF16": 1e-3, "quantized": 1e-2}
TOLERANCE_LLAMACPP = {"F32": 1e-8, "F16": 1e-7, "BF16": 1e-7, "quantized": 1e-7}


def weight_class(types: set) -> str:
    """The loosest activation rounding class among the matmul weight types of a model."""
    names = {GGMLType(int(t)).name for t in types}
    if names <= {"F32"}:
        return "F32"
    if names <= {"F32", "F16"}:
        return "F16"
    if names <= {"F32", "F16", "BF16"}:
        return "BF16"
    return "quantized"


def tolerance(types: set, mode: str = "exact") -> float:
    return (TOLERANCE_LLAMACPP if mode == "llamacpp" else TOLERANCE_EXACT)[weight_class(types)]


@dataclass
class TensorStat:
    name: str
    shape: list
    nmse: float
    max_abs: float
    cosine: float
    ok: bool
    note: str = ""


@dataclass
class LogitStat:
    nmse: float
    max_abs: float
    cosine: float
    top1_agreement: float
    kld_mean: float
    kld_max: float
    first_top1_mismatch: int | None = None
    margin_at_mismatch: float | None = None
    top1_near_ties: int = 0          # mismatches where llama.cpp's top-2 margin <= 2 x the logit error there
    top1_unexplained: int = 0        # mismatches that are not near-ties (a failure)


@dataclass
class Report:
    arch: str
    ok: bool
    tolerance: float
    first_divergence: str | None
    logits: LogitStat
    tensors: list[TensorStat] = field(default_factory=list)
    only_in_llamacpp: list[str] = field(default_factory=list)
    flips: list = field(default_factory=list)        # llamacpp mode: refengine.flips.FlipStat per matmul input
    proof: object = None                             # llamacpp mode, logits over tolerance: refengine.flips.Proof

    def to_dict(self) -> dict:
        return asdict(self)


def metrics(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    fin_r, fin_g = np.isfinite(r), np.isfinite(g)
    if not (fin_r.all() and fin_g.all()):
        # +-inf in the same places on both sides (masked scores) are equal; NaN or any other mismatch fails
        if np.isnan(r).any() or np.isnan(g).any() or not np.array_equal(fin_r, fin_g) \
                or not np.array_equal(r[~fin_r], g[~fin_g]):
            return float("nan"), float("nan"), float("nan")
        r, g = r[fin_r], g[fin_g]
    d = g - r
    den = float(np.dot(r, r))
    nmse = float(np.dot(d, d) / den) if den > 0 else float(np.dot(d, d))
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    nr, ng = np.linalg.norm(r), np.linalg.norm(g)
    cos = float(np.dot(r, g) / (nr * ng)) if nr > 0 and ng > 0 else float(nr == ng)
    return nmse, max_abs, cos


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def logit_metrics(ref: np.ndarray, got: np.ndarray) -> LogitStat:
    """ref, got: [T, V]."""
    nmse, max_abs, cos = metrics(ref, got)
    lr, lg = _log_softmax(ref), _log_softmax(got)
    kld = np.sum(np.exp(lr) * (lr - lg), axis=-1)                         # [T]
    a_ref, a_got = ref.argmax(-1), got.argmax(-1)
    agree = a_ref == a_got
    first = int(np.flatnonzero(~agree)[0]) if not agree.all() else None
    margin = None
    if first is not None:
        top2 = np.sort(ref[first])[-2:]
        margin = float(top2[1] - top2[0])
    ties = 0
    for t in np.flatnonzero(~agree):
        # a swap is explained when llama.cpp's own margin between its pick and ours is within the error
        gap = float(ref[t, a_ref[t]] - ref[t, a_got[t]])
        if gap <= 2 * float(np.max(np.abs(got[t] - ref[t]))):
            ties += 1
    return LogitStat(nmse, max_abs, cos, float(agree.mean()), float(kld.mean()), float(kld.max()), first, margin,
                     ties, int((~agree).sum()) - ties)


def slot_alignment(ids_ref: np.ndarray, ids_got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """perm[t, a] = slot in `got` holding expert ids_ref[t, a]; valid[t, a] False where `got` lacks that expert."""
    T, A = ids_ref.shape
    perm = np.zeros((T, A), dtype=np.int64)
    valid = np.ones((T, A), dtype=bool)
    for t in range(T):
        where = {int(e): a for a, e in enumerate(ids_got[t])}
        for a, e in enumerate(ids_ref[t]):
            if int(e) in where:
                perm[t, a] = where[int(e)]
            else:
                valid[t, a] = False
    return perm, valid


def _topk_check(name, ref_ids, got_ids, ref_probs, got_probs) -> TensorStat:
    """Expert sets per token. A differing set is a near-tie when llama.cpp's gap between the k-th and
    (k+1)-th probability is within the measured probability error of that token (or TIE_EPS)."""
    T, k = got_ids.shape
    ref_ids = ref_ids.reshape(T, k)
    bad, ties = 0, 0
    for t in range(T):
        if set(ref_ids[t].tolist()) == set(got_ids[t].tolist()):
            continue
        if ref_probs is not None:
            pr = ref_probs.reshape(T, -1)[t]
            p = np.sort(pr)[::-1]
            err = float(np.max(np.abs(got_probs.reshape(T, -1)[t] - pr))) if got_probs is not None else 0.0
            if k < p.size and p[k - 1] - p[k] <= 2 * err + TIE_EPS * abs(p[k - 1]):
                ties += 1
                continue
        bad += 1
    note = ", ".join(x for x in (f"{bad} token(s) route to different experts" if bad else "",
                                 f"{ties} near-tie(s) at the top-k boundary" if ties else "") if x)
    return TensorStat(name, list(got_ids.shape), float(bad), float(bad), 1.0, bad == 0, note)


def _argsort_check(name, ref_order, got_order, ref_probs, got_probs) -> TensorStat:
    """The full expert ranking: ours must be a descending order of llama.cpp's probabilities, up to the
    measured probability error of the token (swaps of near-equal experts are ties)."""
    T, E = got_order.shape
    pr = ref_probs.reshape(T, E)
    err = np.max(np.abs(got_probs.reshape(T, E) - pr), axis=-1) if got_probs is not None else np.zeros(T)
    bad = ties = 0
    for t in range(T):
        if np.array_equal(ref_order.reshape(T, E)[t], got_order[t]):
            continue
        rise = np.max(np.diff(pr[t][got_order[t]]))                 # > 0 where our order goes up in ref probs
        if rise <= 2 * err[t] + TIE_EPS * float(np.max(pr[t])):
            ties += 1
        else:
            bad += 1
    note = ", ".join(x for x in (f"{bad} token(s) ranked differently" if bad else "",
                                 f"{ties} token(s) with near-equal experts swapped" if ties else "") if x)
    return TensorStat(name, list(got_order.shape), float(bad), float(bad), 1.0, bad == 0, note)


def selection_sets(ref_sel, got_sel, ref_score, got_score):
    """Per query: (agree, near_tie) for DSA selections. ref_sel [.., T, k] (llama.cpp, may name masked positions
    and padded cells), got_sel [T, n]; scores [.., T, n_kv] / [T, S] with -inf where causally masked."""
    T, S = got_score.shape[-2], got_score.shape[-1]
    rs = ref_score.reshape(-1, ref_score.shape[-1])[-T:, :S].astype(np.float64)         # [T, S]
    gs = got_score.reshape(T, S).astype(np.float64)
    ref_sel, got_sel = ref_sel.reshape(T, -1), got_sel.reshape(T, -1)
    agree, tie = np.ones(T, bool), np.zeros(T, bool)
    for t in range(T):
        vis = np.isfinite(rs[t])
        a = {int(s) for s in ref_sel[t] if 0 <= s < S and vis[s]}
        b = {int(s) for s in got_sel[t] if 0 <= s < S and vis[s]}
        if a == b:
            continue
        agree[t] = False
        p = np.sort(rs[t][vis])[::-1]
        k = len(a)
        err = float(np.max(np.abs(gs[t][vis] - rs[t][vis]))) if vis.any() else 0.0
        tie[t] = 0 < k < p.size and p[k - 1] - p[k] <= 2 * err + TIE_EPS * abs(p[k - 1])
    return agree, tie


def _selection_check(name, agree, tie, shape) -> TensorStat:
    bad, ties = int((~agree & ~tie).sum()), int(tie.sum())
    note = ", ".join(x for x in (f"{bad} query(s) select different keys" if bad else "",
                                 f"{ties} near-tie(s) at the k-th indexer score" if ties else "") if x)
    return TensorStat(name, list(shape), float(bad), float(bad), 1.0, bad == 0, note)


def _segments_unpadded(ref: dict, got: dict, name: str, il: str, r: np.ndarray, g: np.ndarray):
    """llama.cpp's `r` of a KV_SEGMENTS tensor cut to refengine's cells: its raw segment's first S cells and its
    pooled segment's first N (S, N: refengine's), or None when the layer has no such segments."""
    for p in ("csa", "hca"):
        names = (f"{p}_raw_k-{il}", f"{p}_comp_k-{il}")
        if all(n in ref and n in got for n in names):
            pr, pc = (int(np.shape(ref[n])[-3]) for n in names)                 # padded cells
            sr, sc = (int(np.shape(got[n])[-3]) for n in names)                 # refengine's cells
            axis = KV_SEGMENTS[name.rpartition("-")[0]]
            if np.shape(g)[axis] != sr + sc:
                return None
            r = np.asarray(r)
            if axis == -1:
                r2 = r.reshape(-1, pr + pc)
                return np.concatenate([r2[:, :sr], r2[:, pr:pr + sc]], axis=1)
            r2 = r.reshape(pr + pc, -1)
            return np.concatenate([r2[:sr], r2[pr:pr + sc]], axis=0)
    return None


def _selection_rows(ref: dict, got: dict, il: str, cache: dict):
    """The per-query agreement of the DSA selection that layer `il` attends with: that of the most recent layer
    j <= il that ran an indexer (`indexer_score-j`; a later layer sharing it has none), or None.

    llama.cpp names the selection `top_k-j`, but a shared layer names the same tensor again (glm-dsa.cpp:366), so
    it is traced under the last sharing layer's name: `top_k-m`, m the first m >= j with that name.
    A DeepSeek-V4 CSA layer (`lid_top_k-il`) and a QSA layer (`indexer_top_k-il`) select for themselves, from their
    own scores (`lid_score_masked-il`, `indexer_score_tokens-il`)."""
    for sel in ("lid_top_k", "indexer_top_k"):
        names = (f"{sel}-{il}", f"{SELECTIONS[sel]}-{il}")
        if all(n in ref and n in got for n in names):
            if (sel, il) not in cache:
                cache[(sel, il)] = selection_sets(ref[names[0]], got[names[0]], ref[names[1]], got[names[1]])
            return cache[(sel, il)]
    js = [j for j in range(int(il), -1, -1) if f"indexer_score-{j}" in ref and f"indexer_score-{j}" in got]
    if not js:
        return None
    j = js[0]
    pools = f"indexer_top_k-{j}"                                  # glm5-next's k-pool indexer: sets of pools
    if j not in cache and pools in ref and pools in got:
        cache[j] = selection_sets(ref[pools], got[pools], ref[f"indexer_score-{j}"], got[f"indexer_score-{j}"])
    if j not in cache:
        m = j
        while f"top_k-{m}" not in ref and f"indexer_score-{m + 1}" not in ref and m < j + 1024:
            m += 1
        if f"top_k-{m}" not in ref or f"top_k-{j}" not in got:
            return None
        cache[j] = selection_sets(ref[f"top_k-{m}"], got[f"top_k-{j}"], ref[f"indexer_score-{j}"],
                                   got[f"indexer_score-{j}"])
    return cache[j]


def compare_traces(ref: dict, order: list[str], got: dict, tol: float) -> tuple[list[TensorStat], list[str]]:
    """Every tensor present in both, in llama.cpp's evaluation order."""
    stats, missing, selections = [], [], {}
    for name in order:
        if name not in got:
            missing.append(name)
            continue
        r, g = ref[name], got[name]
        base, _, il = name.rpartition("-")
        base = base if il.isdigit() else name
        if base in SELECTIONS and il.isdigit() and _selection_rows(ref, got, il, selections) is not None:
            agree, tie = _selection_rows(ref, got, il, selections)
            stats.append(_selection_check(name, agree, tie, np.shape(g)))
            continue
        if base in ("ffn_moe_argsort", "ffn_moe_topk", "ffn_moe_group_topk"):
            # the scores the experts (or groups) were ranked by: masked by group routing when there is one,
            # else biased by exp_probs_b when there is one (build_moe_ffn selects on those, weights on probs)
            src = next(s for s in ("ffn_moe_probs_masked", "ffn_moe_probs_biased", "ffn_moe_probs")
                       if f"{s}-{il}" in ref or s == "ffn_moe_probs")
            if base == "ffn_moe_group_topk":
                stats.append(_topk_check(name, r, g, None, None))
                continue
            pr, pg = ref.get(f"{src}-{il}"), got.get(f"{src}-{il}")
            pr, pg = (None if a is None else np.where(np.isfinite(a), a, -1e30) for a in (pr, pg))
            check_fn = _argsort_check if base == "ffn_moe_argsort" else _topk_check
            stats.append(check_fn(name, r, g, pr, pg))
            continue
        note = ""
        if base in SLOT_TENSORS and f"ffn_moe_topk-{il}" in ref and f"ffn_moe_topk-{il}" in got:
            ids_g = got[f"ffn_moe_topk-{il}"]
            ids_r = ref[f"ffn_moe_topk-{il}"].reshape(ids_g.shape)
            perm, valid = slot_alignment(ids_r, ids_g)
            g = np.take_along_axis(g.reshape(*ids_g.shape, -1), perm[..., None], axis=1)
            r = r.reshape(g.shape)
            note = "aligned by expert id"
            if not valid.all():
                g, r = g[valid], r[valid]
                note += f"; {int((~valid).sum())} slot(s) with a different expert left out"
        if base == "ffn_moe_out" and f"ffn_moe_topk-{il}" in ref and f"ffn_moe_topk-{il}" in got:
            # tokens whose expert set differs (near-ties, judged at ffn_moe_topk) sum different experts
            ids_g = got[f"ffn_moe_topk-{il}"]
            _, valid = slot_alignment(ids_g, ref[f"ffn_moe_topk-{il}"].reshape(ids_g.shape))
            same = valid.all(axis=1)
            if not same.all():
                g, r = g.reshape(len(same), -1)[same], r.reshape(len(same), -1)[same]
                note = f"{int((~same).sum())} token(s) with a different expert set left out"
        cut = _segments_unpadded(ref, got, name, il, r, g) if base in KV_SEGMENTS and il.isdigit() else None
        if cut is not None:
            r = cut                                            # [raw | pooled] cells, each segment padded
        elif base in KV_PADDED and r.shape[-1] > np.shape(g)[-1] and r.size // r.shape[-1] == int(np.prod(np.shape(g)[:-1])):
            r = r.reshape(-1, r.shape[-1])[:, :g.shape[-1]]    # llama.cpp's KV view is padded past S
        row = int(np.prod(np.shape(g)[1:]))
        if base in ROWS_PADDED and r.size > g.size and r.size % row == 0:
            r = np.asarray(r).reshape(-1, *np.shape(g)[1:])[:np.shape(g)[0]]   # the first rows: ours; then padding
        if base in SELECTION_ROWS and il.isdigit() and r.size == g.size:
            sel = _selection_rows(ref, got, il, selections)
            if sel is not None and not sel[0].all():
                ax, keep = SELECTION_ROWS[base], sel[0]
                g = np.compress(keep, np.asarray(g), axis=ax)
                r = np.compress(keep, np.asarray(r).reshape(np.shape(got[name])), axis=ax)
                note = (note + "; " if note else "") + f"{int((~keep).sum())} query(s) with another key selection left out"
        if r.size != g.size:
            stats.append(TensorStat(name, list(np.shape(got[name])), float("nan"), float("nan"), float("nan"), False,
                                    f"size differs: llama.cpp {list(r.shape)}, refengine {list(np.shape(got[name]))}"))
            continue
        nmse, max_abs, cos = metrics(r, g)
        ok = bool(np.isfinite(nmse) and nmse <= tol)
        stats.append(TensorStat(name, list(np.shape(got[name])), nmse, max_abs, cos, ok, note))
    return stats, missing


def build_report(arch: str, ref_logits, got_logits, ref_tensors: dict, order: list[str], got_tensors: dict,
                 tol: float) -> Report:
    stats, missing = compare_traces(ref_tensors, order, got_tensors, tol)
    lm = logit_metrics(ref_logits, got_logits)
    logits_ok = bool(np.isfinite(lm.nmse) and lm.nmse <= tol and lm.top1_unexplained == 0)
    first = next((s.name for s in stats if not s.ok), None)
    if first is None and not logits_ok:
        first = "result_output"
    return Report(arch, first is None and logits_ok, tol, first, lm, stats,
                  [m for m in missing if not m.startswith(("node_", "norm")) and "(" not in m])


def format_report(rep: Report, *, all_rows: bool = True) -> str:
    lines = [f"{'tensor':<32} {'shape':<18} {'nmse':>10} {'max_abs':>10} {'cosine':>10}  status"]
    for s in rep.tensors:
        if not all_rows and s.ok:
            continue
        status = "ok" if s.ok else "DIVERGES"
        if s.note:
            status += f" ({s.note})"
        lines.append(f"{s.name:<32} {str(s.shape):<18} {s.nmse:>10.3e} {s.max_abs:>10.3e} {s.cosine:>10.6f}  {status}")
    lg = rep.logits
    lines += [
        "",
        f"logits: nmse {lg.nmse:.3e}  max_abs {lg.max_abs:.3e}  cosine {lg.cosine:.8f}  "
        f"top-1 agreement {100 * lg.top1_agreement:.1f}%  KL mean {lg.kld_mean:.3e}  max {lg.kld_max:.3e}",
    ]
    if lg.first_top1_mismatch is not None:
        lines.append(f"first top-1 mismatch at position {lg.first_top1_mismatch}; "
                     f"llama.cpp's top-2 margin there {lg.margin_at_mismatch:.4g}; "
                     f"{lg.top1_near_ties} mismatch(es) within the logit error (near-ties), "
                     f"{lg.top1_unexplained} not")
    flipped = [f for f in rep.flips if f.flips or f.scale_flips]      # in llama.cpp's graph order
    if flipped:
        f0 = flipped[0]
        what = (f"{f0.flips} of {f0.values} {f0.partner} codes differ; float noise alone predicts {f0.expected:.2g}"
                if f0.flips else f"{f0.scale_flips} {f0.partner} block scale(s) differ; float noise alone predicts "
                f"{f0.expected_scale:.2g}")
        lines.append(f"rounding flips (llamacpp mode): first at {f0.name} ({what}), "
                     f"{sum(f.flips + f.scale_flips for f in rep.flips)} in total: see refengine.flips")
    if rep.proof is not None:
        lines.append(f"flip rule (teacher forcing from llama.cpp): {rep.proof.summary()}")
    lines.append(f"tolerance (NMSE per tensor): {rep.tolerance:.0e}")
    lines.append("verdict: " + ("MATCH" if rep.ok else f"DIVERGES, first at {rep.first_divergence}"))
    return "\n".join(lines)


def matmul_weight_types(model) -> set:
    """ggml types of every weight the model multiplies by (token_embd only when it is the tied output)."""
    import quant
    model.load_all()
    types = {model.g.output.type}
    for il in range(model.cfg.n_layer):
        types |= {v.type for v in vars(model.layer(il)).values() if isinstance(v, quant.QTensor)}
    # integer tables (DeepSeek-V4's ffn_gate_tid2eid, I32) are looked up, never multiplied
    return {t for t in types if GGMLType(int(t)).name not in ("I8", "I16", "I32", "I64")}


def run_compare(path, tokens, *, mode: str = "exact", backend: str = "numpy", tol: float | None = None,
                local: bool = False, attn_form: str | None = None, explain=None, qsa_rule: str = "llamacpp",
                n_ubatch: int | None = None) -> Report:
    """Run refengine and llama.cpp on the same tokens (one prefill) and compare every named tensor.
    `path` is a GGUF path or an already opened Model.

    local: feed every block llama.cpp's own input to it (`embd`, `l_out-0`, ...) and the head llama.cpp's
    last `l_out`, so each layer's figure is its own error, not what earlier layers accumulated.
    attn_form: where an attention has two forms, the one refengine runs (MLA: "absorbed" or "naive"; default
    the one llama.cpp runs). Tensors whose shape belongs to one form are traced only by llama.cpp's form.
    qsa_rule: QSA's selection rule (attention/qsa.py); llama.cpp's by default, the one the oracle runs.
    explain(model, tokens, ref, trace, logits, rep): called last, to add to the report (the command line
    passes refengine.flips.explain in llama.cpp mode: the flip census and, over tolerance, the flip rule).
    n_ubatch: both engines run the tokens as successive ubatches of this many (llama.cpp: one decode call each);
        the tensors compared are the first ubatch's (what both record), the logits every position's. None: one
        batch of all the tokens, every tensor the whole batch's.
    """
    from .errors import ConfigError
    from .model import Model
    from .oracle import run_llamacpp
    from .runtime import Runtime
    from .trace import Trace

    model = path if isinstance(path, Model) else Model(path)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    trace = Trace()
    if local and not model.arch.LOCAL_INPUTS:
        model.forward_local(tokens, [], None)                 # raises the clear error before llama.cpp runs
    ub = min(int(n_ubatch or tokens.size), tokens.size)
    if local and ub < tokens.size:
        raise ConfigError("compare --local feeds every layer llama.cpp's whole-batch input: one batch (no --ubatch)")
    chunks = [min(ub, tokens.size - i) for i in range(0, tokens.size, ub)]
    ref = run_llamacpp(model.path, tokens, n_ctx=model.n_ctx, chunks=chunks)
    rt = Runtime(mode=mode, backend=backend, trace=trace, attn_form=attn_form, qsa_rule=qsa_rule)
    if local:
        L = model.cfg.n_layer
        inputs = [ref.tensors["embd"]] + [ref.tensors[f"l_out-{il}"] for il in range(L - 1)]
        got_logits = model.forward_local(tokens, inputs, ref.tensors[f"l_out-{L - 1}"], rt)
    else:
        got_logits = model.forward(tokens, rt=rt, n_ubatch=ub)
    if tol is None:
        tol = tolerance(matmul_weight_types(model), mode)
    rep = build_report(model.cfg.arch, ref.logits, got_logits, ref.tensors, ref.order, trace.tensors, tol)
    if explain is not None:
        explain(model, tokens, ref, trace, got_logits, rep)
    return rep
