"""Every quantized matmul of a model, fed llama.cpp's own input, against llama.cpp's own output.

    checked, unnamed = teacher_forced_matmuls(model, tokens, ref)

refengine runs once in llama.cpp mode with every `Runtime.matmul` call and every recording logged in order.
Each call's input x is located in the recording it was taken from (the tensor itself or reshaped, one head
of it: [H, T, I] -> [T, I] or [T, H, I] -> [T, I], a column block of [T, G*I] -> [T, I], or some of its rows: a routed expert's tokens, from a
[T, D] tensor or a [T, A, I] slot tensor), and its output y in the first later recording that holds it the
same way, or that is y plus an earlier recording (a residual add). The same part of llama.cpp's tensors of
those names (slot tensors matched to ours by expert id) then gives llama.cpp's input and output. An output
refengine does not record under llama.cpp's name (llama.cpp names `Qcur` after the matmul, after the reshape
and after RoPE; refengine records the last), or that llama.cpp leaves unnamed (in its trace as `node_N`), is
located among llama.cpp's own tensors of its size: the one nearest to mm(llama.cpp's input, w) (NMSE <=
LOCATE_NMSE; the others are O(1) away). An input likewise, nearest to ours.
    checked:  weight -> worst NMSE over its calls of mm(llama.cpp's x, w) [+ llama.cpp's residual] against
              llama.cpp's output
    unnamed:  weights (GGUF names) with a call whose input or output llama.cpp does not name (nothing to feed or
              compare)
In `checked` weights are named per layer as `blk.N.*`; experts and heads count as their whole tensor. F32
weights are left out (no activation rounding).
"""
from __future__ import annotations

import re

import numpy as np

from quant import GGMLType
from quant.ref import matmul

LOCATE_NMSE = 1e-3


def _log_forward(model, tokens):
    from refengine.runtime import Runtime
    events = []                                            # ("mm", weight, x, y) | ("rec", label, value)
    seen = {}

    class Logged(Runtime):
        def matmul(self, x, w):
            y = super().matmul(x, w)
            events.append(("mm", w, np.array(x, np.float32), np.array(y, np.float32)))
            return y

        def record(self, name, il, value):
            super().record(name, il, value)
            key = name if il < 0 else f"{name}-{il}"
            seen[key] = seen.get(key, 0) + 1
            events.append(("rec", (key, seen[key] - 1), np.array(value)))

    model.forward(np.asarray(tokens), rt=Logged(mode="llamacpp", qsa_rule="llamacpp"))   # llama.cpp's QSA rule
    return events, seen


def _parts(v: np.ndarray, a: np.ndarray):
    """Selectors s with s(v) == a: the whole (reshaped), one head, or rows (a [n, I] from v [T, I] or [T, A, I])."""
    if v.dtype.kind != "f":
        return []
    if v.size == a.size:
        return [lambda t, sh=a.shape: t.reshape(sh)] if np.array_equal(v.reshape(a.shape), a) else []
    out = []
    if v.ndim == 3 and a.ndim == 2:
        if v.shape[1:] == a.shape:
            out += [lambda t, k=k: t[k] for k in range(v.shape[0])]
        if (v.shape[0], v.shape[2]) == a.shape:
            out += [lambda t, k=k: t[:, k] for k in range(v.shape[1])]
    if a.ndim == 2 and v.shape[-1] == a.shape[-1] and a.shape[0] < v.size // v.shape[-1]:
        rows = v.reshape(-1, v.shape[-1])
        index = {}
        for i, r in enumerate(rows):
            index.setdefault(r.tobytes(), i)
        idx = [index.get(r.tobytes()) for r in a]
        if all(i is not None for i in idx):
            out.append(lambda t, idx=np.array(idx), n=v.shape[-1]: t.reshape(-1, n)[idx])
    if a.ndim == 2 and v.ndim >= 2 and v.shape[0] == a.shape[0] and v.size % a.size == 0 and v.size > a.size:
        T, n = a.shape                          # a column block: group k of a [T, G*I] (DeepSeek-V4's grouped output)
        out += [lambda t, k=k, T=T, n=n: t.reshape(T, -1)[:, k * n:(k + 1) * n] for k in range(v.size // a.size)]
    return [s for s in out if np.array_equal(s(v), a)]


def teacher_forced_matmuls(model, tokens, ref) -> tuple[dict[str, float], set[str]]:
    from refengine.compare import metrics, slot_alignment
    events, seen = _log_forward(model, tokens)

    def llama_value(label, ours):
        """llama.cpp's tensor of our recording `label` = (name, k), shaped like ours and with our slot order."""
        key, k = label
        n_ref = len(ref.earlier.get(key, [])) + 1 if key in ref.tensors else 0
        if n_ref != seen[key]:
            return None
        r = (ref.earlier[key][k] if k < n_ref - 1 else ref.tensors[key])
        if np.size(r) != ours.size:
            return None
        r = np.asarray(r).reshape(ours.shape)
        m = re.fullmatch(r"ffn_moe_\w+-(\d+)", key)
        if m and ours.ndim == 3 and key != f"ffn_moe_topk-{m.group(1)}":       # slots: ours [T, A, *]
            ids = [e[2] for e in events if e[0] == "rec" and e[1][0] == f"ffn_moe_topk-{m.group(1)}"]
            if not ids or f"ffn_moe_topk-{m.group(1)}" not in ref.tensors:
                return None
            perm, valid = slot_alignment(ids[-1], ref.tensors[f"ffn_moe_topk-{m.group(1)}"].reshape(ids[-1].shape))
            r = np.take_along_axis(r, perm[..., None], axis=1)
            r[~valid] = np.nan                                                 # another expert there
        return r

    recs = [(i, e[1], e[2]) for i, e in enumerate(events) if e[0] == "rec"]
    ref_all = [(f"{n}#{k}", a) for n, vals in ref.earlier.items() for k, a in enumerate(vals)] + \
        [(n, a) for n, a in ref.tensors.items()]
    ref_all = [(n, np.asarray(a)) for n, a in ref_all if np.asarray(a).dtype.kind == "f"]
    checked, unnamed = {}, set()
    for i, e in enumerate(events):
        if e[0] != "mm" or e[1].type == GGMLType.F32:
            continue
        _, w, x, y = e
        wname = re.sub(r"^blk\.\d+\.", "blk.N.", re.sub(r"(\[\w+\])+$", "", w.name))
        found = None
        for _, lab_in, v_in in reversed([r for r in recs if r[0] < i]):   # the latest recording holding x
            parts = _parts(v_in, x)
            x_ref = llama_value(lab_in, v_in) if parts else None
            if x_ref is None:
                continue                                                    # not there, or not named by llama.cpp
            found = _output(recs, i, y, x_ref, parts[0], llama_value) or \
                _located(ref_all, _mm(parts[0](x_ref), w), x_ref, parts[0])
            break
        if not found:                                     # an input refengine records under another count
            x_loc = _located(ref_all, x, None, None)
            found = x_loc and (_output(recs, i, y, x_loc[1][0], lambda t: t, llama_value)
                               or _located(ref_all, _mm(x_loc[1][0], w), x_loc[1][0], lambda t: t))
        if not found:
            unnamed.add(w.name.split("[")[0])
            continue
        x_ref, (y_ref, resid) = found
        keep = ~np.isnan(x_ref).any(-1) & ~np.isnan(y_ref).any(-1)
        got = matmul(np.ascontiguousarray(x_ref[keep], np.float32), w, mode="llamacpp")
        if resid is not None:
            got = got + resid[keep]
        checked[wname] = max(checked.get(wname, 0.0), metrics(y_ref[keep], got)[0])
    return checked, unnamed


def _mm(x, w):
    return matmul(np.ascontiguousarray(np.nan_to_num(x), dtype=np.float32), w, mode="llamacpp")


def _located(ref_all, y, x_ref_full, s_in):
    """llama.cpp's tensor of y's size nearest to y, when it is near (LOCATE_NMSE). An output is looked for
    near mm(llama.cpp's input, w), not near ours (ours may have drifted after a rounding flip)."""
    from refengine.compare import metrics
    best = None
    for _, a in ref_all:
        if a.size == y.size:
            e = metrics(a, y.reshape(a.shape))[0]
            if best is None or e < best[0]:
                best = (e, a)
    if best is None or not best[0] <= LOCATE_NMSE:
        return None
    return (s_in(x_ref_full) if s_in is not None else None), (best[1].reshape(y.shape), None)


def _output(recs, i, y, x_ref_full, s_in, llama_value):
    """(llama.cpp's input part, (llama.cpp's output part, llama.cpp's residual part or None)) or None."""
    x_ref = s_in(x_ref_full)
    later = [r for r in recs if r[0] > i]
    for _, lab, v in later:
        for s in _parts(v, y):
            o = llama_value(lab, v)
            if o is not None:
                return x_ref, (s(o), None)
    for _, lab, v in later:                                 # y + an earlier recording (a residual add)
        if v.dtype.kind != "f" or v.size != y.size:
            continue
        z = v.reshape(y.shape)
        for _, lab_r, r in [q for q in recs if q[0] < i]:
            if r.dtype.kind == "f" and r.size == y.size and np.array_equal(y + r.reshape(y.shape), z):
                o, rr = llama_value(lab, v), llama_value(lab_r, r)
                if o is not None and rr is not None:
                    return x_ref, (o.reshape(y.shape), rr.reshape(y.shape))
        break                                               # only the next recording of that size
    return None
