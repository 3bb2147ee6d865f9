"""`np.matmul` and `np.einsum` of activations written as one batched product, for a device whose library product
cannot run where it is needed: CuPy refuses to call cuBLAS while a stream is being captured into a CUDA graph
("calling cuBLAS API during stream capture is currently unsupported"), so a decode step captured once and replayed
(refengine/cuda/graph_step.py) multiplies its activations with the project's own kernel instead
(quant/cuda/bmm.py). Array-module agnostic: `xp` is NumPy or CuPy, `bmm(a [B, M, K], b [B, K, N]) -> [B, M, N]`.

    matmul(xp, a, b, bmm)                   NumPy's matmul: batch dimensions broadcast, 1-D operands promoted
    einsum(xp, subscripts, *ops, bmm)       explicit subscripts ("ij,jk->ik"), no ellipsis, no index repeated in
                                            one operand: operands contracted pairwise left to right, each pair as
                                            transposes + reshapes around one bmm (the indices of both operands that
                                            the output keeps are the batch, those of one of them the rows or the
                                            columns, those of both that are summed the inner dimension)

The result equals NumPy's up to float summation order (tests/test_products.py).
"""
from __future__ import annotations

import numpy as np


def matmul(xp, a, b, bmm, out=None):
    a1, b1 = a.ndim == 1, b.ndim == 1
    if a1:
        a = a[None, :]
    if b1:
        b = b[:, None]
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: {a.shape} @ {b.shape}: inner dimensions differ")
    dt = np.result_type(a.dtype, b.dtype)
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    A = xp.ascontiguousarray(xp.broadcast_to(a.astype(dt, copy=False), batch + (M, K))).reshape(-1, M, K)
    B = xp.ascontiguousarray(xp.broadcast_to(b.astype(dt, copy=False), batch + (K, N))).reshape(-1, K, N)
    y = bmm(A, B).reshape(batch + (M, N))
    if a1:
        y = y[..., 0, :]
    if b1:
        y = y[..., 0]
    if out is not None:
        out[...] = y
        return out
    return y


def _parse(subscripts: str, n: int):
    if "->" not in subscripts or "." in subscripts:
        raise ValueError(f"einsum {subscripts!r}: explicit output, no ellipsis")
    ins, out = subscripts.replace(" ", "").split("->")
    ins = ins.split(",")
    if len(ins) != n:
        raise ValueError(f"einsum {subscripts!r}: {len(ins)} operand subscripts for {n} operands")
    for s in ins + [out]:
        if len(set(s)) != len(s):
            raise ValueError(f"einsum {subscripts!r}: an index repeated in one operand")
    return ins, out


def _pair(xp, a, sa: str, b, sb: str, keep: str, bmm):
    """Contract a (indices sa) with b (sb) -> (array, its indices), keeping the indices of `keep` (the output's and
    the later operands')."""
    for s, arr, other, side in ((sa, a, sb, 0), (sb, b, sa, 1)):     # an index of one operand only, not kept: sum
        gone = [i for i in s if i not in other and i not in keep]
        if gone:
            arr = arr.sum(axis=tuple(s.index(i) for i in gone))
            s = "".join(i for i in s if i not in gone)
            if side == 0:
                a, sa = arr, s
            else:
                b, sb = arr, s
    batch = [i for i in sa if i in sb and i in keep]
    contr = [i for i in sa if i in sb and i not in keep]
    afree = [i for i in sa if i not in sb]
    bfree = [i for i in sb if i not in sa]
    size = {**dict(zip(sa, a.shape)), **dict(zip(sb, b.shape))}
    for i in batch + contr:
        if a.shape[sa.index(i)] != b.shape[sb.index(i)]:
            raise ValueError(f"einsum: index {i!r} is {a.shape[sa.index(i)]} in one operand, "
                             f"{b.shape[sb.index(i)]} in the other")
    nb = int(np.prod([size[i] for i in batch], dtype=np.int64))
    M = int(np.prod([size[i] for i in afree], dtype=np.int64))
    K = int(np.prod([size[i] for i in contr], dtype=np.int64))
    N = int(np.prod([size[i] for i in bfree], dtype=np.int64))
    dt = np.result_type(a.dtype, b.dtype)
    A = xp.ascontiguousarray(a.astype(dt, copy=False).transpose([sa.index(i) for i in batch + afree + contr]))
    B = xp.ascontiguousarray(b.astype(dt, copy=False).transpose([sb.index(i) for i in batch + contr + bfree]))
    y = bmm(A.reshape(nb, M, K), B.reshape(nb, K, N))
    idx = batch + afree + bfree
    return y.reshape([size[i] for i in idx]), "".join(idx)


def einsum(xp, subscripts: str, *operands, bmm, out=None, dtype=None, **kw):
    """NumPy's einsum (`dtype`: the operands cast to it first, as NumPy computes in it; `optimize` accepted and
    moot: the operands are contracted left to right)."""
    if kw.get("optimize") not in (None, False, True, "greedy", "optimal") or set(kw) - {"optimize"}:
        raise ValueError(f"einsum: arguments {sorted(kw)} not supported here")
    if dtype is not None:
        operands = tuple(o.astype(dtype, copy=False) for o in operands)
    ins, target = _parse(subscripts, len(operands))
    if len(operands) == 1:
        return xp.einsum(subscripts, operands[0])                     # sums and transposes: no product
    y, sy = operands[0], ins[0]
    for k in range(1, len(operands)):
        keep = target + "".join(ins[k + 1:])
        y, sy = _pair(xp, y, sy, operands[k], ins[k], keep, bmm)
    gone = [i for i in sy if i not in target]
    if gone:
        y = y.sum(axis=tuple(sy.index(i) for i in gone))
        sy = "".join(i for i in sy if i not in gone)
    y = y.transpose([sy.index(i) for i in target])
    if out is not None:
        out[...] = y
        return out
    return xp.ascontiguousarray(y)
