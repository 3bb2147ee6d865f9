"""Kernel choices as one object: which GEMV / GEMM / dispatch kernel serves which product, and its launch shape.

    pol = KernelPolicy.default()                          # the shapes measured on the H200 (BENCHMARKS.md)
    pol = pol.replace(gemv_default=(8, 1, 1), tc=False)   # another choice, e.g. for the simulator's small blocks
    rt = Runtime(backend="cuda", kernel_policy=pol)       # every product of that runtime runs under it
    with pol.applied(): ...                               # or around any call into quant.cuda

The fields are the switches of `quant/cuda/ops.py`, named in lower case; their meaning is documented there, beside
the measurements that chose them. `applied()` sets them for the duration of a call and restores them after (the
kernels read them where they launch), so two runtimes with two policies can run in one process, one call at a time.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
from dataclasses import dataclass

from . import ops

# field -> (module, its global)
_SWITCHES = {
    "gemv_shape": (ops, "GEMV_SHAPE"), "gemv_default": (ops, "GEMV_DEFAULT"),
    "fast_shape": (ops, "FAST_SHAPE"), "fast_default": (ops, "FAST_DEFAULT"),
    "fast1_shape": (ops, "FAST1_SHAPE"), "fast1_ids_shape": (ops, "FAST1_IDS_SHAPE"),
    "fast1_default": (ops, "FAST1_DEFAULT"), "fast1_shape_by_dims": (ops, "FAST1_SHAPE_BY_DIMS"),
    "one_max": (ops, "ONE_MAX"), "one_max_dense": (ops, "ONE_MAX_DENSE"),
    "gemm_shape": (ops, "GEMM_SHAPE"), "tc_shape": (ops, "TC_SHAPE"), "tc_dense_shape": (ops, "TC_DENSE_SHAPE"),
    "tc": (ops, "TC"), "nt_max": (ops, "NT_MAX"), "pairs_avg": (ops, "PAIRS_AVG"),
    "sgemm_min": (ops, "SGEMM_MIN"), "sgemm_decode": (ops, "SGEMM_DECODE"),
    "prefill_gemm": (ops, "PREFILL_GEMM"), "h3_kc": (ops, "H3_KC"), "group_avg": (ops, "GROUP_AVG"),
    "pairs_dense": (ops, "PAIRS_DENSE"), "tcq": (ops, "TCQ"), "tcq_shape": (ops, "TCQ_SHAPE"),
    "tcq_dense_shape": (ops, "TCQ_DENSE_SHAPE"),
}


@dataclass(frozen=True)
class KernelPolicy:
    gemv_shape: dict
    gemv_default: tuple
    fast_shape: dict
    fast_default: tuple
    fast1_shape: dict
    fast1_ids_shape: dict
    fast1_default: tuple
    fast1_shape_by_dims: dict
    one_max: int
    one_max_dense: dict
    gemm_shape: dict
    tc_shape: dict
    tc_dense_shape: dict
    tc: bool
    nt_max: int
    pairs_avg: int
    group_avg: int
    pairs_dense: int
    sgemm_min: int = 128                  # resident products of this many tokens on cuBLAS (cuda/dequant_gemm.py)
    sgemm_decode: str = "staged"          # that path's weight decode: "rows" or "staged"
    prefill_gemm: str = "sgemm"           # that path's GEMM: "sgemm" (float32), "h3" (3 float16 products, hgemm.py)
                                          # or "tcq16" (Q4_K on tcq's f16 kernel, no decode; ops.PREFILL_GEMM)
    h3_kc: int = 512                      # "h3": K columns per tensor-core sum (hgemm.py)
    flag_batch: int | None = None         # resident NaN/inf flags written per launch (refengine/cuda/fused.py
                                          # all_finite_many, its FLAG_BATCH at most; 1: a launch per product;
                                          # None: FLAG_BATCH)
    fused_ops: bool = True                # resident small ops as one-launch kernels (refengine/cuda/fused.py)
    fused_off: tuple = ()                 # ... but these of them (entry names, e.g. ("gated_mean",)) as NumPy
                                          # states them, op by op: to find which kernel moves a result (set on
                                          # the runtime's device, Device.fused_off; "a,b" on the command line)
    tcq: bool = True                      # "auto" takes the quant-domain tensor-core GEMM for small groups where it
                                          # takes tc and the type has it (quant/cuda/tcq.py: Q4_K; ops.TCQ)
    tcq_shape: dict = dataclasses.field(default_factory=lambda: dict(MT=4, WM=2, BN=32))   # its launch (ops.TCQ_SHAPE;
                                          # ST=1 the weights staged through shared memory, H=1 the f16 variant)
    tcq_dense_shape: dict = dataclasses.field(default_factory=lambda: dict(MT=2, WM=4, BN=32, H=1))   # "tcq16"'s
                                          # launch (ops.TCQ_DENSE_SHAPE: a dense product's own table, any BN)
    stacked_products: bool = True         # one input's projections as one product where the kernels take the
                                          # weights together (refengine Runtime.matmul_many / prefetch, a
                                          # quant.QStack); False: a product a weight, as before session 30
    gathered_prefill: str | None = None   # a prefill's gathered attention (DSA, CSA, k-pool) on a resident GPU
                                          # run: "batched" (mha's query blocks, batched products) or "fused" (one
                                          # kernel, a block per query and head); None: refengine/cuda/fused.py's
                                          # GATHERED_PREFILL. Set on the runtime's device (Device.gathered_prefill)
    prefill_attention: str | None = None  # a prefill's dense attention (causal or none) on a resident GPU run: "rows"
                                          # (one kernel, a warp per query and head), "batched" (mha's query
                                          # blocks, batched products) or "auto" (rows for heads of <= 256 dims);
                                          # None: refengine/cuda/fused.py's PREFILL_ATTENTION ("auto"). Set on the
                                          # runtime's device (Device.prefill_attention)

    def __post_init__(self):
        # the expert dispatch's group tables (moe.groups_from_ids, moe.bucket_kernel) are built with tiles of moe.BN
        # pairs, and the tiled kernels take a tile's pairs as [first, first + their BN): a kernel of a smaller BN
        # would skip pairs, of a larger one repeat them. (tc_dense_shape builds its own table with its own BN: free.)
        if self.gathered_prefill not in (None, "batched", "fused"):
            raise ValueError(f"KernelPolicy.gathered_prefill = {self.gathered_prefill!r}: expected None, 'batched' or "
                             f"'fused'")
        if self.prefill_attention not in (None, "auto", "batched", "rows"):
            raise ValueError(f"KernelPolicy.prefill_attention = {self.prefill_attention!r}: expected None, 'auto', "
                             f"'batched' or 'rows'")
        for name, allowed in (("prefill_gemm", ("sgemm", "h3", "tcq16")), ("sgemm_decode", ("rows", "staged"))):
            if getattr(self, name) not in allowed:         # the code compares with one of them, else takes the other
                raise ValueError(f"KernelPolicy.{name} = {getattr(self, name)!r}: expected one of {allowed}")
        if not (isinstance(self.h3_kc, int) and self.h3_kc > 0):
            raise ValueError(f"KernelPolicy.h3_kc = {self.h3_kc!r}: expected a positive number of K columns")
        from .moe import BN
        for name in ("tc_shape", "gemm_shape", "tcq_shape"):
            bn = dict(getattr(self, name) or {}).get("BN", BN)
            if bn != BN:
                raise ValueError(f"KernelPolicy.{name} BN={bn}: the expert group tables are built with tiles of "
                                 f"{BN} pairs (quant/cuda/moe.BN); a tiled kernel of BN={bn} would skip or repeat "
                                 f"pairs. Other tile sizes: tc_dense_shape (dense products build their own table)")

    @classmethod
    def default(cls) -> "KernelPolicy":
        """The choices in force now (at import: the measured defaults), copied."""
        return cls(**{f: copy.deepcopy(getattr(mod, name)) for f, (mod, name) in _SWITCHES.items()})

    def replace(self, **changes) -> "KernelPolicy":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"KernelPolicy has no field {sorted(unknown)[0]!r}; fields: "
                             f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)

    def with_settings(self, items) -> "KernelPolicy":
        """The policy with `KEY=VALUE` strings applied (a benchmark's or the command line's `--policy`): the value
        a Python literal (16, False, (8, 4, 8, 128, 1)) or else a string ("staged"); a key not a field is an error
        naming the fields."""
        changes = {}
        for item in items:
            key, sep, text = item.partition("=")
            if not sep:
                raise ValueError(f"kernel policy setting {item!r}: expected KEY=VALUE")
            try:
                value = ast.literal_eval(text.strip())
            except (ValueError, SyntaxError):
                value = text.strip()
            old = getattr(self, key.strip(), None)
            if isinstance(old, tuple) and isinstance(value, str):        # a list of names: "a,b"
                value = tuple(v.strip() for v in value.split(",") if v.strip())
            if old is not None and type(value) is not type(old):
                raise ValueError(f"kernel policy setting {item!r}: {key.strip()} expects {type(old).__name__} "
                                 f"(now {old!r}), got {type(value).__name__}")
            changes[key.strip()] = value
        return self.replace(**changes)

    @contextlib.contextmanager
    def applied(self):
        """The kernels launched inside run under this policy; the previous choices are restored after."""
        saved = {f: getattr(mod, name) for f, (mod, name) in _SWITCHES.items()}
        try:
            for f, (mod, name) in _SWITCHES.items():
                setattr(mod, name, getattr(self, f))
            yield self
        finally:
            for f, (mod, name) in _SWITCHES.items():
                setattr(mod, name, saved[f])
