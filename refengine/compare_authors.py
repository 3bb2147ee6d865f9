"""refengine against the model authors' code (transformers), the second oracle: `refengine compare --against
transformers`.

    rep = compare_authors(model, tokens)                    # exact mode: the authors multiply in float
    rep.rows                                                # one per hidden state llama.cpp names, then the logits
    print(format_authors(rep))

The authors' model is built from the same GGUF (`refengine.oracle.transformers.hf_forward`: every tensor
dequantized, run in float64) and reports its hidden states (`output_hidden_states`); each is matched to the
trace name llama.cpp gives the same value (`hc_init`, `l_last-i` / `l_out-i`, `result_norm`), which refengine's
trace records too. Per row: the worst NMSE over positions (a late position's error is not averaged away by the
early ones) and the first position over tolerance. Tolerance: 1e-8 for every file (the authors' code multiplies
dequantized weights in float, as refengine's exact mode does, whatever the weight types).

qwen4exp: refengine runs the authors' QSA rule (the only one the authors' code has; llama.cpp's is refused), and
the report lists the queries whose top-k boundary is a tie of block scores (`qsa_ties`), where `torch.topk` and
refengine (earlier block first) may keep different blocks.

mode "llamacpp" compares with the authors' code given llama.cpp's activation rounding where the oracle knows
how to put it in (the routed experts' inputs before an MXFP4 product, `round_like_llamacpp`); other weight types'
rounding is not modelled there, so that mode is for files whose other matrices are F32 / F16.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOL = 1e-8


@dataclass
class AuthorsRow:
    name: str
    nmse_max: float
    worst_pos: int
    first_bad: int | None          # first position over tolerance, None when none


@dataclass
class AuthorsReport:
    arch: str
    mode: str
    n_tokens: int
    rows: list = field(default_factory=list)
    top1: float = 0.0
    tol: float = TOL
    ties: list = field(default_factory=list)   # qwen4exp: (layer, position, score) where QSA's top-k had a tie

    @property
    def ok(self) -> bool:
        return all(r.first_bad is None for r in self.rows) and self.top1 == 1.0

    def to_dict(self) -> dict:
        return {"arch": self.arch, "mode": self.mode, "n_tokens": self.n_tokens, "tol": self.tol,
                "top1": self.top1, "ok": self.ok,
                "rows": [{"name": r.name, "nmse_max": r.nmse_max, "worst_pos": r.worst_pos, "first_bad": r.first_bad}
                         for r in self.rows],
                "qsa_ties": [{"layer": il, "pos": t, "score": v} for il, t, v in self.ties]}


def per_position_nmse(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """NMSE of each position's row: ref, got [T, ...] -> [T]."""
    n = np.asarray(ref).shape[0]
    r = np.asarray(ref, np.float64).reshape(n, -1)
    g = np.asarray(got, np.float64).reshape(n, -1)
    den = np.maximum(np.sum(r * r, axis=1), np.finfo(np.float64).tiny)
    return np.sum((r - g) ** 2, axis=1) / den


def _row(name: str, ref, got, tol: float) -> AuthorsRow:
    e = per_position_nmse(ref, got)
    bad = np.flatnonzero(e > tol)
    return AuthorsRow(name, float(e.max()), int(e.argmax()), int(bad[0]) if bad.size else None)


def qsa_ties(scores: np.ndarray, budget: int, ratio: int) -> list[tuple[int, float]]:
    """The queries of one prefill (query t at position t) whose top budget/ratio complete blocks are not
    determined by the scores: the last kept and the first dropped block score the same (in practice 0.0, every
    head's dot product ReLU'd away). There the authors' `torch.topk` keeps whichever its CPU partial sort leaves
    first, refengine the earlier block (attention/qsa.py `select_authors`). scores [T, nb] -> [(t, score)]."""
    nblk, out = budget // ratio, []
    for t in range(scores.shape[0]):
        nc = (t + 1) // ratio
        if nc > nblk:
            s = np.sort(scores[t, :nc])[::-1]
            if s[nblk - 1] == s[nblk]:
                out.append((t, float(s[nblk])))
    return out


def compare_authors(model, tokens, *, mode: str = "exact", tol: float = TOL,
                    qsa_rule: str = "authors") -> AuthorsReport:
    """refengine's forward on `tokens` against the authors' code on the same file: every hidden state the
    authors report (by llama.cpp's name) and the logits. `qsa_rule` (qwen4exp): the authors' code runs the
    authors' QSA selection only, so any other rule is refused (it would compare two different selections)."""
    from .errors import OracleError
    from .oracle.transformers import hf_forward
    from .runtime import Runtime
    from .trace import Trace
    if qsa_rule != "authors":
        raise OracleError(f"compare against transformers: the authors' code selects QSA blocks by the authors' rule "
                          f"only; --qsa-rule {qsa_rule} would compare two different selections (compare against "
                          f"llama.cpp for its rule, or leave --qsa-rule out)")
    tokens = [int(t) for t in tokens]
    hf = hf_forward(model.path, tokens, n_ctx=model.n_ctx, mode=mode)
    budget, ratio = (getattr(hf.config, k, None) for k in ("indexer_budget", "indexer_compress_ratio"))
    scores = {f"indexer_score-{il}" for il in range(model.cfg.n_layer)} if budget else set()
    trace = Trace(names=set(hf.names) | scores)
    logits = model.forward(tokens, rt=Runtime(mode=mode, trace=trace, qsa_rule=qsa_rule))
    rep = AuthorsReport(arch=model.cfg.arch, mode=mode, n_tokens=len(tokens), tol=tol)
    for name, h in zip(hf.names, hf.hidden):
        rep.rows.append(_row(name, h, trace[name], tol))
    rep.rows.append(_row("logits", hf.logits, logits, tol))
    rep.top1 = float(np.mean(np.argmax(hf.logits, -1) == np.argmax(logits, -1)))
    for il in range(model.cfg.n_layer):
        if f"indexer_score-{il}" in trace:
            rep.ties += [(il, t, v) for t, v in qsa_ties(trace[f"indexer_score-{il}"], budget, ratio)]
    return rep


def format_authors(rep: AuthorsReport) -> str:
    lines = [f"refengine ({rep.mode}) against the authors' code (transformers, float64), {rep.arch}, "
             f"{rep.n_tokens} tokens; tolerance NMSE <= {rep.tol:g} at every position", "",
             f"{'tensor':<16} {'NMSE max':>10} {'at':>5}  verdict"]
    for r in rep.rows:
        verdict = "ok" if r.first_bad is None else f"FAIL from position {r.first_bad}"
        lines.append(f"{r.name:<16} {r.nmse_max:>10.2e} {r.worst_pos:>5}  {verdict}")
    lines += ["", f"top-1 agreement {rep.top1 * 100:.1f}%"]
    if rep.ties:
        shown = ", ".join(f"layer {il} position {t} ({v:g})" for il, t, v in rep.ties[:8])
        more = f" and {len(rep.ties) - 8} more" if len(rep.ties) > 8 else ""
        lines += [f"QSA block scores tied at the top-k boundary (the authors' torch.topk and refengine, earlier "
                  f"block first, may keep different blocks there; ties are not failures of either): {shown}{more}"]
    lines += ["MATCH" if rep.ok else "MISMATCH"]
    return "\n".join(lines)
