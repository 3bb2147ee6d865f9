"""Host wrappers: launch the grouped kernels of `gemv.py` for a dense matmul or for groups of experts.

    y = matmul(x, w)                     x [T, I] float32 (host), w QTensor [O, I]  ->  [T, O] (host)
    grouped(dw, xd, yd, grp, ...)        device arrays in and out, one launch for all groups

Kernel choice (`kernel="auto"`, `auto_kernel`): expert dispatch with at most PAIRS_AVG pairs per group on
average -> one block per pair on the fast one-token kernel ("pairs"); T <= 8 tokens per group, or expert
dispatch with at most GROUP_AVG pairs per group on average -> warp GEMV (the fast kernels where the type has one);
more tokens and I % 128 == 0 -> tiled GEMM on the tensor cores (`tc.py`; `TC = False`: the float32 SIMT
one), or for Q4_K groups of at most a tile of pairs on average the tensor cores on the quants (`tcq.py`, `TCQ`);
otherwise warp GEMV, 8 tokens per pass.

Launch shapes (documented here, used below):
- naive: grid (ceil(O / 128), n_pairs), block 128: one thread per (pair, row).
- gemv:  grid (ceil(O / RW), GMAX), block 32 * KS: one block per RW rows of one group, its KS warps
         splitting the row; blocks of groups past G (known only on the device) return at once.
- pairs: grid (n_pairs, ceil(O / RW)), block 32 * KS: one block per pair and RW rows, the pair fastest.
- gemm:  grid (ceil(O / BM), n_tiles_max), block (BM / TM) * (BN / TN): one block per BM x BN tile.
- tc:    grid (ceil(O / BM), n_tiles_max), block 32 * WM * WN: one block per BM x 32 tile, on the tensor cores.
- tcq:   grid (ceil(O / (16 MT WM)), n_tiles_max), block 32 * WM: the tensor cores on the quants (`tcq.py`, Q4_K),
         after one launch splitting the activations (`tcq.split_rows`).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import ref
from ..formats import GGMLType
from ..ref import QTensor, QuantError
from .device import SIM
from .decoders import SPECS
from .fast import fgemv1_kernel, fgemv_kernel
from .fast8 import CW, igemv1_kernel
from .fast_specs import FSPECS, fast_supported
from .gemv import GroupTable, dense_groups, gemm_kernel, gemv_kernel, naive_kernel
from .streams import scratch, upload
from .tc import gemm_tc_kernel
from .tcq import gemm_tcq16_kernel, gemm_tcq_kernel, gemm_tcq_staged_kernel, split16_rows, split_rows
from .tcq import supported as tcq_supported
from .weights import DeviceWeight, device_weight

# (RW rows per block, KS warps splitting K, U parts in flight per lane) of the warp GEMV, per type;
# chosen on the H200 by benchmarks/cuda_matmul.py (BENCHMARKS.md)
GEMV_SHAPE: dict[GGMLType, tuple[int, int, int]] = {}
GEMV_DEFAULT = (2, 8, 2)
# (RW rows per warp, KS warps splitting K) of the fast GEMV (`fast.py`), per type
FAST_SHAPE: dict[GGMLType, tuple[int, int]] = {}
FAST_DEFAULT = (4, 2)
# one token per group: (RW rows per warp, KS warps, P rows whose loads are in flight together, register cap
# per thread (0: none), X: 1 = the 8-bit kernel `fast8.igemv1_kernel` (types in fast8.CW), 0 = the float
# `fast.fgemv1_kernel`), per type, for a GEMV (FAST1_SHAPE) and for one token's expert dispatch from the router
# ids (FAST1_IDS_SHAPE); chosen on the H200 by benchmarks/cuda_matmul.py (BENCHMARKS.md). The cap keeps a
# 4-warp block within 128 registers a thread (4 blocks per SM); the gate+up variants run uncapped (ptxas
# spills under it for Q4_K and Q8_0).
FAST1_SHAPE: dict[GGMLType, tuple[int, ...]] = {GGMLType.Q4_K: (8, 4, 8, 128, 1), GGMLType.Q4_0: (8, 4, 8, 128, 1)}
FAST1_IDS_SHAPE: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.Q4_K: (8, 4, 4, 128, 1), GGMLType.Q8_0: (8, 4, 4, 128, 1)}
FAST1_DEFAULT = (8, 4, 8, 128, 0)
# one-token GEMV shapes for a matrix size, (type, O, I) -> shape as FAST1_SHAPE, taken before it: the decode
# step's small matrices (q|k|v, output, router: a few MB) may want other shapes than 4096 x 14336 (empty
# unless set, e.g. by `benchmarks/cuda_layers.py --fast1`)
FAST1_SHAPE_BY_DIMS: dict[tuple[GGMLType, int, int], tuple[int, ...]] = {}
# groups of up to ONE_MAX pairs go to the one-token kernels, one pass per pair (the rows of later passes
# come from L2); larger groups to the 8-token `fgemv_kernel`. A dense GEMV (one group of T tokens) takes the
# one-token kernel only up to ONE_MAX_DENSE[type] tokens: where it measured faster than the 8-token kernel
# on the H200 (BENCHMARKS.md: 4096 x 14336 at 2 and 4 tokens); expert dispatch (groups of 1-2 pairs mostly)
# was faster with it for every type measured. (A kernel holding the activations of 2-4 tokens in registers was
# tried at stop 6 and measured slower than both: removed.)
ONE_MAX = 4
ONE_MAX_DENSE: dict[GGMLType, int] = {
    **{t: 4 for t in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.NVFP4)},
    **{t: 2 for t in (GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.IQ2_XXS,
                      GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ1_S)}}
GEMM_SHAPE = dict(BM=64, BN=32, TM=4, TN=4)
# the tensor-core GEMM (`tc.py`): BM rows x 32 token pairs per block, WM x WN warps (CV: shared-memory
# carveout in percent, -1 the driver's choice)
TC_SHAPE = dict(BM=64, WM=4, WN=1, CV=-1, BN=32)
# a dense product (one group of T tokens): 64-token tiles (BN=64, each decoded weight tile serving twice the
# tokens) measured slower on the H200 (Q4_K 4096 x 14336 at 512 tokens: 2879 us at best against 2439 us with 32)
TC_DENSE_SHAPE = dict(BM=64, WM=4, WN=1, CV=-1, BN=32)
# the quant-domain tensor-core GEMM (`tcq.py`: Q4_K's 4-bit integers unsplit, two mma a fragment): MT 16-row tiles a
# warp, WM warps a block, BN pairs a tile (the group table's tile: moe.BN for expert dispatch)
# (MT=4, WM=2 measured best of 17 shapes and latency variants: benchmarks/expert_prefill.py, BENCHMARKS.md session 25);
# H=1 (not timed yet): the f16 variant on mma.m16n8k16 (`tcq.gemm_tcq16_kernel`: half the mma and A-fragment work)
TCQ_SHAPE = dict(MT=4, WM=2, BN=32)
# "auto" takes tcq where it would take tc, the type has it (tcq.TYPES) and the groups average at most one tile of
# pairs (expert dispatch at prefill: DeepSeek-V3's 256 experts see ~16 of 512 tokens' pairs each). Measured on the
# H200 (session 25): V3's experts at 512 tokens 5.7 / 5.5 ms (gate / down) against tc's 8.5 / 9.2, a whole
# deepseek2 prefill 53.3 -> 48.1 ms; full tiles (a dense 4096 x 14336 product at 512 tokens) 2.97 ms against tc's
# 2.48: dense and per-head products stay on tc
TCQ = True
TC = not SIM                       # "auto" takes it on the GPU; the simulator (no tensor cores: an emulation,
                                   # slow) takes the float32 SIMT GEMM, and tests `tc` on its own
NT_MAX = 8
# a resident product of at least SGEMM_MIN tokens (2-D or per-head weight) decodes the weight to float32 and runs
# cuBLAS's SGEMM (`dequant_gemm.py`); 0: never. Measured on the H200 (BENCHMARKS.md, issue 23's section): a
# DeepSeek-V3 2-block prefill of 512 tokens, dense products 32 ms on the tensor-core kernel, 17 + 5 (decode) here
# (128 is not tuned: the crossover against the tensor-core kernel between 8 and 512 tokens was not measured)
SGEMM_MIN = 128
# how that path decodes the weight: "rows" (`rows.rows_kernel`, one thread per block part) or "staged"
# (`dequant_gemm.staged_kernel`: shared memory, coalesced writes; bit-identical). Measured on the H200 (session 21,
# benchmarks/profile_prefill.py, DeepSeek-V3 2 blocks, 512 tokens): decode 5.06 ms rows, 1.88 ms staged
SGEMM_DECODE = "staged"
# the GEMM of that path: "sgemm" (cuBLAS float32, CUDA cores) or "h3" (`hgemm.py`: each operand split into two
# float16 halves, three tensor-core products with float32 sums over K chunks of H3_KC, combined in float32).
# Measured on the H200 (session 21): one product of K = 14336 h3 1.16 ms vs sgemm 1.45, but a DeepSeek-V3 2-block
# prefill 71.8 ms vs 54.7 (split and combine passes, a slow batched kernel on the wide products): sgemm stays
# "tcq16" (not timed yet): a Q4_K weight's product of SGEMM_MIN tokens or more on the quant-domain f16 kernel
# (`tcq.gemm_tcq16_kernel`, TCQ_DENSE_SHAPE): no decode, no cuBLAS, so inside a graph capture too; other types and
# per-head weights stay on sgemm
PREFILL_GEMM = "sgemm"
H3_KC = 512                        # "h3": the K columns of one tensor-core sum (hgemm.py)
TCQ_DENSE_SHAPE = dict(MT=2, WM=4, BN=32, H=1)   # "tcq16": its launch (a dense table of BN-token tiles: any BN)
# expert dispatch (several groups) with at most PAIRS_AVG pairs per group on average (n_pairs <= PAIRS_AVG *
# gmax): one block per pair (`fgemv1_kernel(IDM=3)`, kernel "pairs"): the pairs of one expert read its rows
# together, one from DRAM and the rest from L2; up to GROUP_AVG on average: one block per group, 8 tokens a
# pass (each decoded weight serves them all); more: the tensor-core GEMM's 32-pair tiles. Measured on the
# H200 (benchmarks/cuda_dispatch.py, 128 experts of 768 x 2048, 8 used, BENCHMARKS.md): at 2 pairs a group
# (32 tokens) "pairs" is 1.1-1.5x faster than one block per group and 2.1-5.3x faster than the tensor
# cores; at 4 the group kernel wins for 4 of 6 types; at 8 it wins for 5 of 6, the tensor cores for IQ4_XS.
PAIRS_AVG = 2
GROUP_AVG = 8                      # (PAIRS_AVG = GROUP_AVG = 0: the choice by the batch's tokens alone, as before)
# a dense product of 2..PAIRS_DENSE tokens takes the "pairs" kernel too (one block per token and row block);
# 0: measured no faster than the one-token passes / the 8-token kernel at 2, 4, 8 tokens (4096 x 14336)
PAIRS_DENSE = 0


def supported(w: QTensor) -> bool:
    """True when the kernels read this tensor directly (type with a decoder, row a whole number of blocks)."""
    s = SPECS.get(w.type)
    return s is not None and w.shape[-1] % s.BS == 0


def _nt(n: int) -> int:
    """Tokens per pass of the warp GEMV: 1 (decode) or 8 (one compiled variant serves 2..8 tokens)."""
    return 1 if n <= 1 else 8


@functools.lru_cache(maxsize=None)
def _ones(n: int):
    return upload(np.ones(n, dtype=np.float32))


@functools.lru_cache(maxsize=None)
def _izero():
    return upload(np.zeros(1, dtype=np.int32))


@functools.lru_cache(maxsize=64)
def _dense_groups_dev(T: int, bn: int = GEMM_SHAPE["BN"]):
    return upload(dense_groups(T, bn))


def grouped(dw: DeviceWeight, xd, yd, grp, gmax: int, n_pairs: int, max_per_group: int, *, sc=None, rw=None,
            up: DeviceWeight | None = None, kernel: str = "auto", shape=None, stream=0, causal: int = 0, cpos=None,
            ch: int = 1, split=None) -> None:
    """yd[out(j)] = sc[e] * xd[tok(j)] @ W_e^T for every pair j of every group, in one launch.

    dw: the weights ([E, O, I] or [O, I]); xd [*, I], yd [*, O] float32 device arrays; grp the group
    table on the device (`GroupTable`); max_per_group bounds the pairs of one group (picks the kernel).
    sc: float32 [E] (or [2E] with `up`) per-matrix scales, default 1; rw: float32 [n_out] row weights.
    up: a second matrix of the same type and shape: writes silu(gate) * up instead (gemv only).
    causal, cpos, ch: the attention products' causal skips (tc only, see `tc.gemm_tc_kernel`).
    split: xd already split for tcq (`tcq_split` / `shared_split`: one split for the products of one input); tcq
    only, the other kernels ignore it.
    """
    O, I, E = dw.O, dw.I, dw.E
    if sc is None:
        sc = _ones(2 * E)
    rwa = rw if rw is not None else _ones(1)
    if kernel == "auto":
        kernel = auto_kernel(dw, xd, gmax, n_pairs, max_per_group, up is not None)
    tab = dw.tab
    if kernel == "naive":
        k = naive_kernel(dw.type)
        k[(math.ceil(O / 128), n_pairs), 128, stream](dw.w32, dw.w16, tab, xd, yd, sc, grp, O, I, dw.rowb,
                                                      dw.estride, gmax, n_pairs)
        if rw is not None:
            raise QuantError("naive kernel: row weights are not supported")
    elif kernel == "gemv":
        RW, KS, U = shape or GEMV_SHAPE.get(dw.type, GEMV_DEFAULT)
        KS = max(1, min(KS, (I // dw.spec.BS * dw.spec.P + 31) // 32))      # no idle warps on short rows
        k = gemv_kernel(dw.type, _nt(max_per_group), RW, KS, up is not None, rw is not None, U)
        u = up if up is not None else dw
        k[(math.ceil(O / RW), gmax), 32 * KS, stream](
            dw.w32, dw.w16, u.w32, u.w16, tab, xd, yd, sc, rwa, grp, O, I, dw.rowb, dw.estride, gmax, n_pairs, E)
    elif kernel == "fast":
        _need_fast(kernel, dw, xd)
        one = max_per_group <= (ONE_MAX if gmax > 1 else min(ONE_MAX, max(1, ONE_MAX_DENSE.get(dw.type, 1))))
        default = (FAST1_SHAPE_BY_DIMS.get((dw.type, O, I), FAST1_SHAPE.get(dw.type, FAST1_DEFAULT)) if one
                   else FAST_SHAPE.get(dw.type, FAST_DEFAULT))
        sh = tuple(shape or default)
        RW, KS = sh[0], _ks(dw, sh[1])
        if one:
            k = _k1(dw.type, RW, KS, up is not None, rw is not None, sh)
        else:
            if up is not None:                   # gate and up decoded side by side: half the rows (no spills)
                RW = max(1, RW // 2)
            k = fgemv_kernel(dw.type, _nt(max_per_group), RW, KS, up is not None, rw is not None)
        u = up if up is not None else dw
        k[(math.ceil(O / RW), gmax), 32 * KS, stream](
            dw.w32, dw.w16, u.w32, u.w16, tab, xd, yd, sc, rwa, grp, O, I, dw.rowb, dw.estride, gmax, n_pairs, E)
    elif kernel == "pairs":
        _need_fast(kernel, dw, xd)
        k, RW, KS = _ids_kernel(dw, shape, up is not None, rw is not None, 3)
        u = up if up is not None else dw
        k[(n_pairs, math.ceil(O / RW)), 32 * KS, stream](
            dw.w32, dw.w16, u.w32, u.w16, tab, xd, yd, sc, rwa, grp, O, I, dw.rowb, dw.estride, gmax, n_pairs, E)
    elif kernel == "gemm":
        if I % 128:
            raise QuantError(f"gemm kernel needs I % 128 == 0, got I = {I}")
        sh = dict(GEMM_SHAPE, **(shape or {}))
        k = gemm_kernel(dw.type, sh["BM"], sh["BN"], sh["TM"], sh["TN"], rw is not None)
        ntiles = gmax + n_pairs // sh["BN"] + 1
        nth = (sh["BM"] // sh["TM"]) * (sh["BN"] // sh["TN"])
        k[(math.ceil(O / sh["BM"]), ntiles), nth, stream](dw.w32, dw.w16, tab, xd, yd, sc, rwa, grp, O, I, dw.rowb,
                                                          dw.estride, gmax, n_pairs, E)
    elif kernel == "tc":
        if I % 128:
            raise QuantError(f"tc kernel needs I % 128 == 0, got I = {I}")
        sh = dict(TC_SHAPE, **(shape or {}))
        k = gemm_tc_kernel(dw.type, sh["BM"], sh["WM"], sh["WN"], rw is not None, sh.get("CV", -1), sh.get("BN", 32),
                           causal)
        ntiles = gmax + n_pairs // sh.get("BN", 32) + 1
        k[(math.ceil(O / sh["BM"]), ntiles), 32 * sh["WM"] * sh["WN"], stream](
            dw.w32, dw.w16, tab, xd, yd, sc, rwa, grp, O, I, dw.rowb, dw.estride, gmax, n_pairs, E,
            cpos if cpos is not None else _izero(), ch)
    elif kernel == "tcq":
        if not tcq_supported(dw.type, I):
            raise QuantError(f"tcq kernel: no quant-domain kernel for {dw.type.name} rows of {I} columns "
                             "(Q4_K, I % 256 == 0)")
        sh = dict(TCQ_SHAPE, **(shape or {}))
        half = bool(sh.get("H", 0))
        if split is None or len(split) != (4 if half else 3):     # (a split made for the other variant: anew)
            split = tcq_split(xd, stream, half)
        if half:                         # on mma.m16n8k16 (tcq.gemm_tcq16_kernel)
            k = gemm_tcq16_kernel(dw.type, sh["MT"], sh["WM"], sh["BN"], rw is not None)
            k[(math.ceil(O / (16 * sh["MT"] * sh["WM"])), gmax + n_pairs // sh["BN"] + 1), 32 * sh["WM"], stream](
                dw.w32, dw.w16, *split, yd, sc, rwa, grp, O, I, dw.rowb, dw.estride, gmax, n_pairs)
            return
        xh, xl, sx = split
        if sh.get("ST", 0):              # weights staged through shared memory (tcq.gemm_tcq_staged_kernel)
            k = gemm_tcq_staged_kernel(dw.type, sh["MT"], sh["WM"], sh["BN"], rw is not None)
        else:
            k = gemm_tcq_kernel(dw.type, sh["MT"], sh["WM"], sh["BN"], rw is not None, sh.get("MR", 0),
                                bool(sh.get("PW", 0)), bool(sh.get("PF", 0)))
        ntiles = gmax + n_pairs // sh["BN"] + 1
        k[(math.ceil(O / (16 * sh["MT"] * sh["WM"])), ntiles), 32 * sh["WM"], stream](
            dw.w32, dw.w16, xh, xl, sx, yd, sc, rwa, grp, O, I, dw.rowb, dw.estride, gmax, n_pairs)
    elif causal:
        raise QuantError("causal skips: the tc kernel only")
    else:
        raise ValueError(f"unknown kernel {kernel!r} (naive, gemv, fast, pairs, gemm, tc, tcq, auto)")


def auto_kernel(dw: DeviceWeight, xd, gmax: int, n_pairs: int, max_per_group: int, glu: bool = False, *,
                pairs_avg: int | None = None, group_avg: int | None = None) -> str:
    """The kernel `grouped(kernel="auto")` runs (see the module docstring and PAIRS_AVG / PAIRS_DENSE);
    pairs_avg, group_avg: the dispatch thresholds (default PAIRS_AVG, GROUP_AVG)."""
    pairs_avg = PAIRS_AVG if pairs_avg is None else pairs_avg
    group_avg = GROUP_AVG if group_avg is None else group_avg
    fast = fast_ids_ok(dw, xd)
    if fast and max_per_group > 1 and (n_pairs <= pairs_avg * gmax if gmax > 1 else max_per_group <= PAIRS_DENSE):
        return "pairs"
    if max_per_group <= NT_MAX or dw.I % 128 or glu or (fast and gmax > 1 and n_pairs <= group_avg * gmax):
        return "fast" if fast else "gemv"
    if TC and TCQ and tcq_supported(dw.type, dw.I) and n_pairs <= TCQ_SHAPE["BN"] * gmax:
        return "tcq"
    return "tc" if TC else "gemm"


def tcq_split(xd, stream=0, half: bool | None = None):
    """xd split for tcq into scratch memory: `tcq.split_rows` (TF32 hi / lo bits and the sub-block sums) or, for the
    half-precision variant (half; None: TCQ_SHAPE's H), `tcq.split16_rows` (f16 halves, scaled sums, row scales)."""
    half = bool(TCQ_SHAPE.get("H", 0)) if half is None else half
    return (split16_rows if half else split_rows)(xd, stream, lambda n, dt: scratch(n, dt, stream))


def shared_split(dw: DeviceWeight, xd, gmax: int, n_pairs: int, max_per_group: int, kernel: str = "auto", stream=0):
    """The split of xd when `grouped` would multiply it by dw on tcq, else None: made once for the several products
    of one input (an expert's gate and up) and passed to each as `grouped(..., split=)`."""
    k = auto_kernel(dw, xd, gmax, n_pairs, max_per_group) if kernel == "auto" else kernel
    return tcq_split(xd, stream) if k == "tcq" else None


def fast_ids_ok(dw: DeviceWeight, xd) -> bool:
    """True when the fast kernels (`grouped_ids`, and `grouped`'s "fast" and "pairs") serve this weight and input."""
    return fast_supported(dw.type, dw.rowb, dw.estride) and aligned16(xd)


def _need_fast(kernel: str, dw: DeviceWeight, xd) -> None:
    if not fast_ids_ok(dw, xd):
        raise QuantError(f"{kernel} kernel: no fast decoder for {dw.type.name} with {dw.rowb}-byte rows "
                         "(or the input is not 16-byte aligned)")


def _ks(dw: DeviceWeight, KS: int) -> int:
    """KS warps a block, no more than a row's units fill (no idle warps on short rows)."""
    return max(1, min(KS, (dw.I // dw.spec.BS * _units(dw.type) + 31) // 32))


def _ids_kernel(dw: DeviceWeight, shape, glu: bool, rwt: bool, IDM: int):
    """The one-token kernel of an expert dispatch (shape, default FAST1_IDS_SHAPE) -> (kernel, RW, KS)."""
    sh = tuple(shape or FAST1_IDS_SHAPE.get(dw.type, FAST1_DEFAULT))
    RW, KS = sh[0], _ks(dw, sh[1])
    return _k1(dw.type, RW, KS, glu, rwt, sh, IDM), RW, KS


def grouped_ids(dw: DeviceWeight, xd, yd, ids, A: int, *, sc=None, rw=None, up: DeviceWeight | None = None,
                slot_rows: bool = False, shape=None, stream=0) -> None:
    """Expert dispatch of one token without a group table: yd[a] = sc[e] * x @ W_e^T for e = ids[a], a < A.

    ids: int32 [A] on the device (the router's output); x = xd[0] (xd[a] when `slot_rows`: the down
    projection reads one activation row per slot). sc, rw, up as in `grouped`. One launch (the fast
    one-token kernel); `fast_ids_ok` says whether the type has it.
    """
    O, I, E = dw.O, dw.I, dw.E
    if sc is None:
        sc = _ones(2 * E)
    rwa = rw if rw is not None else _ones(1)
    k, RW, KS = _ids_kernel(dw, shape, up is not None, rw is not None, 2 if slot_rows else 1)
    u = up if up is not None else dw
    k[(math.ceil(O / RW), A), 32 * KS, stream](
        dw.w32, dw.w16, u.w32, u.w16, dw.tab, xd, yd, sc, rwa, ids, O, I, dw.rowb, dw.estride, 0, A, E)


def _k1(t: GGMLType, RW, KS, glu, rwt, sh, IDM=0):
    """The one-token kernel for a type and shape (RW, KS[, P[, register cap[, X[, DB]]]]) (see FAST1_SHAPE)."""
    P = sh[2] if len(sh) > 2 else 4
    MR = sh[3] if len(sh) > 3 and not glu else 0
    DB = bool(sh[5]) if len(sh) > 5 else False
    if len(sh) > 4 and sh[4] and t in CW:
        return igemv1_kernel(t, RW, KS, glu, rwt, P, IDM, MR, DB)
    return fgemv1_kernel(t, RW, KS, glu, rwt, P, IDM, MR, None, DB)


def _units(t: GGMLType) -> int:
    return FSPECS[t].UPB


def aligned16(xd) -> bool:
    """The fast kernels read activations in 16-byte loads: the array must start 16-byte aligned."""
    cai = getattr(xd, "__cuda_array_interface__", None)
    return cai is None or cai["data"][0] % 16 == 0        # None: the simulator (host arrays, no alignment)


def dense(dw: DeviceWeight, xd, yd, *, kernel: str = "auto", shape=None, stream=0) -> None:
    """yd [T, O] = xd [T, I] @ W^T on the device."""
    T = xd.shape[0]
    if kernel == "auto" and TC and T > NT_MAX and dw.I % 128 == 0:
        kernel = "tc"
    if kernel == "tcq":
        sh = dict(TCQ_SHAPE, **(shape or {}))
        grouped(dw, xd, yd, _dense_groups_dev(T, sh["BN"]), 1, T, T, kernel="tcq", shape=sh, stream=stream)
        return
    if kernel == "tc":
        sh = dict(TC_DENSE_SHAPE, **(shape or {}))
        grouped(dw, xd, yd, _dense_groups_dev(T, sh["BN"]), 1, T, T, kernel="tc", shape=sh, stream=stream)
        return
    grouped(dw, xd, yd, _dense_groups_dev(T), 1, T, T, kernel=kernel, shape=shape, stream=stream)


def _check(x, w: QTensor, mode: str) -> np.ndarray:
    if mode != "exact":
        raise QuantError(f"matmul: mode {mode!r} is not implemented (available: exact)")
    if w.ndim != 2:
        raise QuantError(f"matmul: weight {w.name!r} must be 2-D, got shape {list(w.shape)}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise QuantError(f"matmul: input {list(x.shape)} does not match weight {w.name!r} {list(w.shape)} "
                         f"(need [T, {w.shape[1]}])")
    return x


def matmul(x: np.ndarray, w: QTensor, *, mode: str = "exact", kernel: str = "auto", shape=None) -> np.ndarray:
    """y = x @ dequantize(w).T on the GPU.   x [T, I] float32, w [O, I]  ->  [T, O] float32 (host arrays).

    Same contract as `quant.ref.matmul`. Types without a CUDA decoder (or rows that are not whole
    blocks) are multiplied by the NumPy reference instead.
    """
    x = _check(x, w, mode)
    if not supported(w):
        return ref.matmul(x, w, mode=mode)
    dw = device_weight(w).ensure()
    xd = cuda.to_device(x)
    yd = cuda.device_array((x.shape[0], w.shape[0]), dtype=np.float32)
    dense(dw, xd, yd, kernel=kernel, shape=shape)
    return yd.copy_to_host()


__all__ = ["matmul", "dense", "grouped", "grouped_ids", "fast_ids_ok", "supported", "tcq_split", "shared_split",
           "GroupTable", "GEMV_SHAPE", "GEMM_SHAPE"]
