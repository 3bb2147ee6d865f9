"""Rounding flips: why llama.cpp mode agrees with llama.cpp to 1e-13 on some runs and to 1e-6 on others.

In llama.cpp mode every quantized matmul rounds its input exactly as ggml-cpu does (`quant.llamacpp`). Our
input and llama.cpp's input to that matmul still differ by float-order noise (different summation orders
in norms, attention and the matmuls themselves: NMSE ~1e-13, |delta| ~ 1e-7 |x|). The two round to the
same code unless a value lies within |delta| of a rounding boundary; the chance of that, per value, is
about |delta| / step, where step is the partner type's spacing there (Q8_0/Q8_1/Q8_K: the block's d;
f16: 2^-10 |x|; bf16: 2^-7 |x|). A *flip* then moves one value by a whole step, an error ~step/|delta|
(1e4..1e6) times larger than the noise that caused it, and later quantizers amplify it again (an input
error e gives an output error ~sqrt(e * step)): one flip is enough to take the logits from ~1e-13 to
1e-8..1e-4 NMSE.

    census = flip_census(model, ref_tensors, got_tensors)
    [FlipStat("attn_norm-1", "Q8_K", flips=1, expected=0.61, values=4096), ...]

`expected` = sum |delta| / step over the tensor: the number of flips the noise alone predicts. For Q8_0 and
Q8_1 the block scale d = fp16(amax/127) is a rounding decision as well: `scale_flips` counts blocks whose
d differs (every value of the block then moves by one fp16 step, ~1e-3 relative).
Input tensors are found by llama.cpp's graph names; the weights they feed by their GGUF names (each arch's
`MATMUL_INPUTS` table). The census is in llama.cpp's graph order (an earlier recording of a reused name,
`q-1#1`, just before the name's last one).

Proof (`prove_flips`): a flip explains a miss only when teacher forcing proves it. Refengine runs again on
the same tokens with llama.cpp's own value of the first flipped matmul input (named in llama.cpp's trace) in
place of ours (`Runtime.force_inputs`); a flip that appears further on is forced in turn (at most
`MAX_ROUNDS`). A forced input must itself be float noise before rounding (NMSE <= `NOISE_NMSE`, the flips
no more than the noise predicts, `plausible`): otherwise it is a divergence, not a flip. The flip is proven
when the forced run has every tensor and the logits within compare's llama.cpp-mode tolerance; otherwise the
proof names the tensor where teacher forcing stops agreeing. When no named input flips before the first
divergence (or the first named one is no flip: it differs beyond float noise before rounding), the inputs
llama.cpp's graph leaves unnamed before it are looked at (the routed experts' input too): they are still in its trace
(auto-named `node_N`), found as the tensor of the input's size within float noise of ours (`_unnamed_flip`),
and forced by the weight they feed.

    proof = prove_flips(model, tokens, ref)      # ref: llama.cpp's OracleResult for the tokens
    proof.outcome                                # "pass" | "proven-flip" | "fails" (proof.stopped_at)

"pass" needs every tensor within the tolerance, not the logits alone: a flip whose effect fades before the
logits (kimi-k3 with a Q6_K ssm_g: logits 2e-10, one KDA gate tensor over 1e-7) is still proven or failed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from quant import GGMLType
from quant.llamacpp import partner, quantize_activation
from quant.rounding import bf16_round, fp16_round

from .compare import TOLERANCE_EXACT, build_report, matmul_weight_types, metrics, slot_alignment, tolerance

NOISE_NMSE = TOLERANCE_EXACT["F32"]   # a forced input agrees with llama.cpp's this well before rounding (1e-8)
MAX_ROUNDS = 12                       # flips forced one after another, at most


@dataclass
class FlipStat:
    name: str            # llama.cpp's name of the matmul input
    partner: str         # the type it is rounded to
    flips: int           # rounded values that differ between llama.cpp's input and ours
    expected: float      # sum |delta| / step: flips predicted by the float noise alone
    values: int          # values compared
    max_rel_delta: float  # max |delta| / max |x| of its row (the float noise)
    scale_flips: int = 0  # Q8_0/Q8_1 blocks whose fp16 d differs (amax/127 rounded the other way)
    expected_scale: float = 0.0

    @property
    def any(self) -> bool:
        return bool(self.flips or self.scale_flips)


def _step(x: np.ndarray, p: GGMLType) -> np.ndarray:
    """The rounding step of partner type p at every value of x [R, n] (same shape)."""
    if p == GGMLType.F16:
        return np.spacing(np.abs(fp16_round(x)).astype(np.float16)).astype(np.float32)
    if p == GGMLType.BF16:
        r = np.abs(bf16_round(x))
        return np.where(r > 0, np.exp2(np.floor(np.log2(np.maximum(r, 1e-38))) - 7), 1e-38).astype(np.float32)
    blk = {GGMLType.Q8_0: 32, GGMLType.Q8_1: 32, GGMLType.Q8_K: 256}[p]
    b = x.reshape(-1, blk)
    amax = np.max(np.abs(b), axis=-1, keepdims=True)
    return np.broadcast_to(amax / 127.0, b.shape).reshape(x.shape)


def _codes(x: np.ndarray, p: GGMLType) -> tuple[np.ndarray, np.ndarray | None]:
    """The rounding decisions of partner type p for x [R, n]: f16/bf16 bits, or the int8 codes of
    Q8_0/Q8_1/Q8_K with the sign of d folded in (Q8_K's d takes the sign of the block's extreme value);
    plus, for Q8_0/Q8_1, the fp16 bits of each block's d (rounding amax/127 to fp16 is a decision too)."""
    if p == GGMLType.F16:
        return fp16_round(x).view(np.uint32), None
    if p == GGMLType.BF16:
        return bf16_round(x).view(np.uint32), None
    blk, size, q0 = {GGMLType.Q8_0: (32, 34, 2), GGMLType.Q8_1: (32, 36, 4), GGMLType.Q8_K: (256, 292, 4)}[p]
    b = quantize_activation(x, p).reshape(-1, size)
    q = b[:, q0:q0 + blk].view(np.int8).astype(np.int16)
    if p == GGMLType.Q8_K:
        d = b[:, 0:4].copy().view(np.float32)[:, 0]
        return np.where(np.signbit(d)[:, None], -q, q), None
    return q, b[:, 0:2].copy().view(np.uint16)[:, 0]


def _amax_step(x: np.ndarray, p: GGMLType) -> np.ndarray:
    """Per Q8_0/Q8_1 block: the change of amax that moves fp16(amax/127) by one half-precision step."""
    amax = np.max(np.abs(x.reshape(-1, 32)), axis=-1)
    return 127.0 * np.spacing(fp16_round(amax / np.float32(127)).astype(np.float16)).astype(np.float64)


def count_flips(ref: np.ndarray, got: np.ndarray, p: GGMLType) -> FlipStat:
    """Compare the partner-type rounding of two versions of one activation, ref/got [R, n]."""
    ref = np.asarray(ref, dtype=np.float32).reshape(-1, ref.shape[-1])
    got = np.asarray(got, dtype=np.float32).reshape(ref.shape)
    (cr, dr), (cg, dg) = _codes(ref, p), _codes(got, p)
    flips = int(np.count_nonzero(cr != cg))
    delta = np.abs(got.astype(np.float64) - ref)
    expected = float(np.sum(delta / np.maximum(_step(ref, p), 1e-38)))
    scale_flips, expected_scale = 0, 0.0
    if dr is not None:
        scale_flips = int(np.count_nonzero(dr != dg))
        da = np.abs(np.max(np.abs(got.reshape(-1, 32)), -1).astype(np.float64) - np.max(np.abs(ref.reshape(-1, 32)), -1))
        expected_scale = float(np.sum(da / _amax_step(ref, p)))
    rel = float(np.max(delta / np.maximum(np.max(np.abs(ref), axis=-1, keepdims=True), 1e-30))) if ref.size else 0.0
    return FlipStat("", p.name, flips, expected, int(ref.size), rel, scale_flips, expected_scale)


def _aligned_slots(ref: dict, got: dict, name: str, il: str) -> tuple[np.ndarray, np.ndarray] | None:
    """ffn_moe_swiglu [T, A, I] of both runs with slots matched by expert id (rows with equal experts only)."""
    ids_g = got.get(f"ffn_moe_topk-{il}")
    ids_r = ref.get(f"ffn_moe_topk-{il}")
    if ids_g is None or ids_r is None:
        return None
    g = got[name]
    perm, valid = slot_alignment(ids_r.reshape(ids_g.shape), ids_g)
    g = np.take_along_axis(g.reshape(*ids_g.shape, -1), perm[..., None], axis=1)
    r = ref[name].reshape(g.shape)
    return r[valid], g[valid]


def _earlier_inputs(model, ref_earlier: dict, got_earlier: dict) -> list[tuple[str, np.ndarray, np.ndarray, list[str]]]:
    """Matmul inputs that share their llama.cpp name with later tensors (MATMUL_INPUTS rows with a third
    element, the occurrence index): (label, llama.cpp's, ours, weight names)."""
    out = []
    for row in model.arch.MATMUL_INPUTS:
        if len(row) < 3:
            continue
        pat, weights, occ = row
        for name in ref_earlier:
            m = re.fullmatch(pat, name)
            if not m or occ >= len(ref_earlier[name]) or occ >= len(got_earlier.get(name, [])):
                continue
            il = m.group(1) if m.groups() else ""
            out.append((f"{name}#{occ}", ref_earlier[name][occ], got_earlier[name][occ],
                        [w.format(il=il) for w in weights]))
    return out


def graph_order(ref) -> list[str]:
    """llama.cpp's evaluation order with every recording of a reused name in its place: the earlier ones as
    `NAME#k` (k from 0), the last as `NAME` (qwen4exp's two stream mixers of a block are both `hc_norm-IL`). From the
    oracle's `sequence`; its `order` (each name at its last recording) where there is none."""
    seq = getattr(ref, "sequence", None)
    if not seq:
        return list(ref.order)
    total, seen, out = {}, {}, []
    for n in seq:
        total[n] = total.get(n, 0) + 1
    for n in seq:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == total[n] - 1 else f"{n}#{k}")
    return out


def graph_position(label: str, order: list[str]) -> float:
    """Where a census label sits in llama.cpp's evaluation order: its index (an order from `graph_order` holds
    `NAME#k` labels in place); else an earlier recording of a reused name (`q-1#1`) just before the name's last
    one; inf when llama.cpp has no such tensor."""
    if label in order:
        return float(order.index(label))
    name, _, occ = label.partition("#")
    if name not in order:
        return float("inf")
    return order.index(name) - (0.5 if occ else 0.0)


def flip_census(model, ref: dict, got: dict, order: list[str] | None = None, ref_earlier: dict | None = None,
                got_earlier: dict | None = None) -> list[FlipStat]:
    """For every traced input of a quantized matmul, in llama.cpp's evaluation order, the flips between
    llama.cpp's rounding of it and ours. `ref`/`got`: name -> array (oracle tensors, refengine trace)."""
    out = []
    matmul_inputs = [r[:2] for r in model.arch.MATMUL_INPUTS if len(r) == 2]   # graph name -> the weights it feeds
    order = list(order or ref)
    names = [n for n in order if n in got and n in ref]
    for label, r, g, wnames in _earlier_inputs(model, ref_earlier or {}, got_earlier or {}):
        # a reused name (deepseek2's normed q_a is `q`, like three later tensors): checked before the final one
        wnames = [w for w in wnames if w in model.gf.tensors]
        for p in sorted({partner(model.gf.tensors[w].type) for w in wnames}, key=int):
            if p != GGMLType.F32 and r.size == g.size:
                s = count_flips(r.reshape(-1, g.shape[-1]), g.reshape(-1, g.shape[-1]), p)
                s.name = label
                out.append(s)
    for name in names:
        for pat, weights in matmul_inputs:
            m = re.fullmatch(pat, name)
            if not m:
                continue
            il = m.group(1) if m.groups() else ""
            wnames = [w.format(il=il) for w in weights if w.format(il=il) in model.gf.tensors]
            parts = sorted({partner(model.gf.tensors[w].type) for w in wnames}, key=int)
            pair = _aligned_slots(ref, got, name, il) if _is_slot(name) else \
                (ref[name].reshape(np.shape(got[name])), got[name])
            if pair is None:
                continue
            r, g = pair
            for p in parts:
                if p == GGMLType.F32:
                    continue
                # the rows the weights of partner p take: the named tensor's last axis, or where that is not a
                # weight's row length, the weights' (DeepSeek-V4's attn_derope [T, H, K] feeds groups of H*K/G)
                n = g.shape[-1]
                rows = {model.gf.tensors[w].shape[-1] for w in wnames if partner(model.gf.tensors[w].type) == p}
                if n not in rows and len(rows) == 1 and g.size % next(iter(rows)) == 0:
                    n = next(iter(rows))
                s = count_flips(r.reshape(-1, n), g.reshape(-1, n), p)
                s.name = name
                out.append(s)
    return sorted(out, key=lambda f: graph_position(f.name, order))


def _is_slot(name: str) -> bool:
    return name.startswith(("ffn_moe_swiglu", "ffn_moe_situ", "ffn_moe_silu"))


def plausible(f: FlipStat) -> bool:
    """The flips are as few as float noise predicts: codes and block scales each within a Poisson bound of
    their `expected` (a flipped Q8_0/Q8_1 scale moves about an eighth of its block's 32 codes as well)."""
    def bound(mu: float) -> float:
        return 3 + mu + 4 * np.sqrt(mu)
    return f.scale_flips <= bound(f.expected_scale) and f.flips <= bound(f.expected) + 32 * f.scale_flips


@dataclass
class Forced:
    flip: FlipStat        # the census entry of the forced input (in the run just before it was forced)
    nmse: float           # ours against llama.cpp's before rounding
    weight: str = ""      # an input llama.cpp leaves unnamed: the weight it feeds (forced by weight name);
                          # llama.cpp's value of it is the attribute `value` (kept out of compare's JSON)

    def describe(self) -> str:
        f = self.flip
        return (f"{f.name} ({f.flips} {f.partner} code(s) of {f.values}, {f.scale_flips} block scale(s); noise "
                f"predicts {f.expected:.2g} / {f.expected_scale:.2g}; NMSE {self.nmse:.1e} before rounding)")


@dataclass
class Proof:
    """The flip rule's verdict on one llama.cpp-mode run (`prove_flips`).

    outcome: "pass" (logits within tolerance), "proven-flip" (teacher forcing every flipped input brings
    every tensor and the logits within tolerance) or "fails" (`stopped_at` names the tensor where teacher
    forcing stops agreeing, or the flipped input that is not float noise)."""
    outcome: str
    logits_nmse: float
    tolerance: float
    forced: list[Forced] = field(default_factory=list)
    forced_nmse: float | None = None      # logits NMSE of the run with every forced input llama.cpp's
    stopped_at: str | None = None
    reason: str = ""

    def summary(self) -> str:
        head = f"logits NMSE {self.logits_nmse:.2e} (tolerance {self.tolerance:g})"
        forced = "; ".join(x.describe() for x in self.forced) or "none"
        after = f"; logits NMSE {self.forced_nmse:.2e} with them forced" if self.forced_nmse is not None else ""
        if self.outcome == "pass":
            return f"pass: {head}"
        if self.outcome == "proven-flip":
            return f"proven rounding flip: {head}; forced from llama.cpp: {forced}{after}"
        return f"not a proven flip: {head}; forced: {forced}{after}; stops agreeing at {self.stopped_at}: {self.reason}"


def _value(label: str, tensors: dict, earlier: dict):
    name, _, occ = label.partition("#")
    if occ:
        vals = earlier.get(name, [])
        return vals[int(occ)] if int(occ) < len(vals) else None
    return tensors.get(name)


def _input_nmse(label: str, ref, trace) -> float:
    """Ours against llama.cpp's value of a matmul input, before rounding (slot tensors matched by expert id)."""
    r, g = _value(label, ref.tensors, ref.earlier), _value(label, trace.tensors, trace.earlier)
    if r is None or g is None:
        return float("nan")
    name = label.partition("#")[0]
    if _is_slot(name):
        pair = _aligned_slots(ref.tensors, trace.tensors, name, name.rpartition("-")[2])
        if pair is None:
            return float("nan")
        r, g = pair
    return metrics(np.reshape(r, np.shape(g)) if np.size(r) == np.size(g) else r, g)[0] \
        if np.size(r) == np.size(g) else float("nan")


def _force_dict(forced: list[Forced], ref, trace) -> dict:
    """Runtime.force_inputs for the forced labels: a name's last recording is `NAME#k`, k = our count before it."""
    out = {}
    for x in forced:
        if x.weight:
            out[x.weight] = x.value
            continue
        name, _, occ = x.flip.name.partition("#")
        key = x.flip.name if occ else (f"{name}#{len(trace.earlier[name])}" if name in trace.earlier else name)
        out[key] = _value(x.flip.name, ref.tensors, ref.earlier)
        if _is_slot(name):
            il = name.rpartition("-")[2]
            out[f"ffn_moe_topk-{il}"] = ref.tensors[f"ffn_moe_topk-{il}"]
    return out


def _run_llamacpp_mode(model, tokens, force: dict | None = None, log: list | None = None):
    """refengine in llama.cpp mode -> (trace, logits, forced hits); `log` collects ("mm", weight, x) for every
    matmul and ("rec", name) for every recording, in order."""
    from .runtime import Runtime
    from .trace import Trace

    class Logged(Runtime):
        def matmul(self, x, w):
            log.append(("mm", w, np.array(self._forced_input(x) if self._forced else x, np.float32)))
            return super().matmul(x, w)

        def moe_ffn(self, x, ids, weights, record=None, **kw):
            w = kw.get("gate") if kw.get("gate") is not None else kw.get("up")
            if w is not None:                               # the routed experts' input, under their weight
                log.append(("mm", w, np.array(self._forced_input(x) if self._forced else x, np.float32)))
            return super().moe_ffn(x, ids, weights, record=record, **kw)

        def record(self, name, il, value):
            value = value() if callable(value) else value
            super().record(name, il, value)
            log.append(("rec", name if il < 0 else f"{name}-{il}", np.asarray(value)))

    trace = Trace()
    rt = (Logged if log is not None else Runtime)(mode="llamacpp", trace=trace, force_inputs=force or None,
                                                  qsa_rule="llamacpp")          # against llama.cpp: its rule
    logits = model.forward(np.asarray(tokens), rt=rt)
    return trace, logits, rt.forced_hits


def _unnamed_flip(model, tokens, ref, force: dict, order: list[str], stop: float) -> Forced | None:
    """The first flipped matmul input that refengine does not record under a llama.cpp name, before graph
    position `stop`: llama.cpp's value of it is the tensor of its trace (auto-named `node_N` where its graph
    names none) within float noise of ours (NMSE <= NOISE_NMSE, the nearest). The routed experts' input is
    looked at whole (kimi-k3's latent one is unnamed), single experts and heads not (rows or heads of it)."""
    log = []
    _run_llamacpp_mode(model, tokens, force, log)
    ref_all = [(f"{n}#{k}", np.asarray(a)) for n, vals in ref.earlier.items() for k, a in enumerate(vals)] + \
        [(n, np.asarray(a)) for n, a in ref.tensors.items()]
    ref_all = [(n, a) for n, a in ref_all if a.dtype.kind == "f"]
    total, seen, label = {}, {}, {}                 # each recording as graph_order labels it (NAME#k, NAME last)
    for i, q in enumerate(log):
        if q[0] == "rec":
            total[q[1]] = total.get(q[1], 0) + 1
    for i, q in enumerate(log):
        if q[0] == "rec":
            k = seen.get(q[1], 0)
            seen[q[1]] = k + 1
            label[i] = q[1] if k == total[q[1]] - 1 or q[1] + "#0" not in order else f"{q[1]}#{k}"
    for i, e in enumerate(log):
        if e[0] != "mm" or "[" in e[1].name or e[1].name in force:
            continue
        w, x = e[1], e[2]
        p = partner(w.type)
        if p == GGMLType.F32:
            continue
        nxt = next((label[j] for j in range(i + 1, len(log)) if log[j][0] == "rec" and label[j] in order), None)
        pos = graph_position(nxt, order) - 0.5 if nxt else float("inf")
        if pos >= stop:
            break
        if any(q[0] == "rec" and q[1] in ref.tensors and q[2].size == x.size and
               np.array_equal(q[2].reshape(x.shape), x) for q in log[:i]):
            continue                                        # a tensor llama.cpp names: the census's
        best = min(((metrics(a, x.reshape(a.shape))[0], n, a) for n, a in ref_all if a.size == x.size),
                   default=None, key=lambda b: b[0])
        if best is None or not best[0] <= NOISE_NMSE:
            continue
        f = count_flips(best[2].reshape(x.shape), x, p)
        if f.any:
            f.name = f"{best[1]} (unnamed input of {w.name})"
            forced = Forced(f, best[0], w.name)
            forced.value = best[2].reshape(x.shape).astype(np.float32)
            return forced
    return None


def prove_flips(model, tokens, ref=None, *, trace=None, logits=None, max_rounds: int = MAX_ROUNDS) -> Proof:
    """The flip rule (module docstring) on `tokens` in llama.cpp mode (NumPy backend). `ref`: llama.cpp's
    OracleResult for the same tokens (run here when None); `trace`, `logits`: refengine's plain llama.cpp-mode
    run when the caller has it."""
    from .oracle import run_llamacpp
    if ref is None:
        ref = run_llamacpp(model.path, np.asarray(tokens), n_ctx=model.n_ctx)
    if trace is None or logits is None:
        trace, logits, _ = _run_llamacpp_mode(model, tokens)
    tol = tolerance(matmul_weight_types(model), "llamacpp")
    plain = metrics(ref.logits, logits)[0]
    proof = Proof("pass", plain, tol)
    order, gorder = list(ref.order), graph_order(ref)     # report rows; graph positions of every recording
    if plain <= tol and build_report(model.cfg.arch, ref.logits, logits, ref.tensors, order, trace.tensors,
                                     tol).ok:
        return proof                                        # every tensor and the logits within the tolerance
    proof.outcome = "fails"
    for _ in range(max_rounds + 1):
        rep = build_report(model.cfg.arch, ref.logits, logits, ref.tensors, order, trace.tensors, tol)
        if proof.forced:
            proof.forced_nmse = rep.logits.nmse
            if rep.ok:
                proof.outcome = "proven-flip"
                return proof
        first = rep.first_divergence or "result_output"
        done = {x.flip.name for x in proof.forced}
        stop = graph_position(first, gorder)
        cand = next((f for f in flip_census(model, ref.tensors, trace.tensors, gorder, ref.earlier, trace.earlier)
                     if f.any and f.name not in done and graph_position(f.name, gorder) < stop), None)
        proof.stopped_at = first
        nm = _input_nmse(cand.name, ref, trace) if cand is not None else None
        if cand is None or not (nm <= NOISE_NMSE and plausible(cand)):
            # no named flip to force, or the first one is no flip: an unnamed input before it may have flipped
            limit = stop if cand is None else graph_position(cand.name, gorder)
            extra = _unnamed_flip(model, tokens, ref, _force_dict(proof.forced, ref, trace), gorder, limit)
            if extra is not None and plausible(extra.flip):
                proof.forced.append(extra)
                trace, logits, hits = _run_llamacpp_mode(model, tokens, _force_dict(proof.forced, ref, trace))
                if hits.get(extra.weight):
                    continue
                proof.stopped_at, proof.reason = first, f"no matmul took the forced input of {extra.weight}"
                return proof
        if cand is None:
            proof.reason = (f"{first} diverges (NMSE {_tensor_nmse(rep, first):.2e}) with no rounding flip in a "
                            f"traced matmul input before it" + (" left to force" if proof.forced else ""))
            return proof
        if not (nm <= NOISE_NMSE and plausible(cand)):
            proof.stopped_at = cand.name
            proof.reason = (f"{cand.name} differs from llama.cpp's before rounding by more than float noise (NMSE "
                            f"{nm:.2e}, {cand.flips} code(s) and {cand.scale_flips} scale(s) flipped where noise "
                            f"predicts {cand.expected:.2g} / {cand.expected_scale:.2g}): a divergence, not a flip")
            return proof
        proof.forced.append(Forced(cand, nm))
        force = _force_dict(proof.forced, ref, trace)
        trace, logits, hits = _run_llamacpp_mode(model, tokens, force)
        missed = [k for k in force if not k.startswith("ffn_moe_topk-") and not hits.get(k)]
        if missed:
            proof.stopped_at = missed[0].partition("#")[0]
            proof.reason = f"no matmul took refengine's {missed[0]}: it cannot be forced"
            return proof
    proof.reason = f"still diverging after forcing {max_rounds} flips"
    return proof


def _tensor_nmse(rep, name: str) -> float:
    if name == "result_output" and not any(s.name == name and not s.ok for s in rep.tensors):
        return rep.logits.nmse
    return next((s.nmse for s in rep.tensors if s.name == name), float("nan"))


def explain(model, tokens, ref, trace, logits, rep) -> None:
    """compare's hook in llama.cpp mode (`run_compare(explain=...)`, NumPy backend): the census in `rep.flips`
    and the flip rule's verdict in `rep.proof` (teacher forcing runs only when the logits miss the tolerance)."""
    rep.flips = flip_census(model, ref.tensors, trace.tensors, graph_order(ref), ref.earlier, trace.earlier)
    rep.proof = prove_flips(model, tokens, ref, trace=trace, logits=logits)


def run_flip_census(path, tokens) -> tuple[float, list[FlipStat]]:
    """Run refengine in llama.cpp mode and llama.cpp on `tokens`; return (logits NMSE, census)."""
    from .model import Model
    from .oracle import run_llamacpp

    model = Model(path)
    trace, logits, _ = _run_llamacpp_mode(model, tokens)
    ref = run_llamacpp(model.path, tokens, n_ctx=model.n_ctx)
    return metrics(ref.logits, logits)[0], flip_census(model, ref.tensors, trace.tensors, ref.order, ref.earlier,
                                                       trace.earlier)


def main(argv=None) -> int:
    """`python -m refengine.flips`: the llama.cpp-mode agreement table of docs/quant.md (synthetic tiny
    models, 16 tokens per run, several token seeds per type)."""
    import argparse
    import os
    import tempfile

    from .compare import run_compare
    from .model import Model
    from .synth import write_synth

    ap = argparse.ArgumentParser(prog="python -m refengine.flips", description=main.__doc__)
    ap.add_argument("--arch", nargs="+", default=["llama", "qwen3moe"])
    ap.add_argument("--types", nargs="+", default=["F16", "BF16", "Q8_0", "Q4_K", "Q6_K", "Q2_K", "IQ2_XXS", "MXFP4"])
    ap.add_argument("--seeds", type=int, default=8, help="token seeds per model (default 8)")
    args = ap.parse_args(argv)

    def fmt(v: list[float]) -> str:
        return f"{np.median(v):.1e} / {max(v):.1e}" if v else "-"

    print("| arch | type | exact (seed 0) | llamacpp (seed 0) | runs without flip | median without flip | "
          "median / max with a flip | first flip at seed 0 |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.arch:
            for t in args.types:
                path = write_synth(arch, os.path.join(tmp, f"{arch}-{t}.gguf"), wtype=t)
                vocab = Model(path).cfg.n_vocab
                tokens = [np.random.default_rng(seed).integers(0, vocab, 16) for seed in range(args.seeds)]
                runs = []                                             # (logits NMSE, flipped tensors)
                for tok in tokens:
                    nmse, census = run_flip_census(path, tok)
                    runs.append((nmse, [f for f in census if f.any]))
                exact = run_compare(path, tokens[0], mode="exact").logits.nmse
                clean = [n for n, fl in runs if not fl]
                flipped = [n for n, fl in runs if fl]
                first = "-"
                if runs[0][1]:
                    f = runs[0][1][0]
                    first = (f"{f.name} ({f.flips} code(s), {f.scale_flips} scale(s); "
                             f"predicted {f.expected + f.expected_scale:.2g})")
                med_clean = f"{np.median(clean):.1e}" if clean else "-"
                print(f"| {arch} | {t} | {exact:.1e} | {runs[0][0]:.1e} | {len(clean)}/{len(runs)} | {med_clean} | "
                      f"{fmt(flipped)} | {first} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
