"""Compile the quant.cuda kernels for Hopper (sm_90) without a GPU: `python -m quant.cuda.ptx [--all] [-j N]`.

Default: every kernel for every type (naive, warp GEMV, tiled GEMM) plus the GLU / row-weight variants
for two types, and the fast kernels (`fast.py`, `fast8.py`) in the shapes the host code launches by default, which
must not use local memory; `--all`: every variant for every type. Exit status 0: all compiled; 1: a kernel
failed (named); 3: NVVM/NVRTC missing (numba-cuda[cu13]). Needs NUMBA_ENABLE_CUDASIM unset.
"""
from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import quant.cuda  # noqa: F401  (numpy shim)
from numba import cuda

from .device import SIM
from ..formats import GGMLType
from .decoders import SPECS
from .fast import FSPECS, fgemv1_kernel, fgemv_kernel
from .fast8 import CW, igemv1_kernel
from .gemv import gemm_kernel, gemv_kernel, naive_kernel
from .tc import gemm_tc_kernel
from .tcq import gemm_tcq16_kernel, gemm_tcq_kernel, gemm_tcq_staged_kernel, split16_kernel as tcq16_split_kernel
from .tcq import split_kernel as tcq_split_kernel
from .dequant_gemm import staged_kernel
from .hgemm import combine_kernel as h3_combine_kernel, split_kernel as h3_split_kernel
from .moe import bucket_kernel, combine_kernel, swiglu_kernel
from .timing import spin_kernel

A1U32, A1F16, A1F32, A1I32 = "uint32[::1]", "float16[::1]", "float32[::1]", "int32[::1]"
A2F32 = "float32[:, ::1]"
I64 = "int64"
SIG_NAIVE = f"void({A1U32}, {A1F16}, {A1U32}, {A2F32}, {A2F32}, {A1F32}, {A1I32}, " + ", ".join([I64] * 6) + ")"
SIG_GEMV = (f"void({A1U32}, {A1F16}, {A1U32}, {A1F16}, {A1U32}, {A2F32}, {A2F32}, {A1F32}, {A1F32}, {A1I32}, "
            + ", ".join([I64] * 7) + ")")
SIG_GEMM = f"void({A1U32}, {A1F16}, {A1U32}, {A2F32}, {A2F32}, {A1F32}, {A1F32}, {A1I32}, " + ", ".join([I64] * 7) + ")"
SIG_TC = SIG_GEMM[:-1] + f", {A1I32}, {I64})"
SIG_TCQ = (f"void({A1U32}, {A1F16}, {A1U32}, {A1U32}, {A1F32}, {A2F32}, {A1F32}, {A1F32}, {A1I32}, "
           + ", ".join([I64] * 6) + ")")
SIG_TCQ16 = (f"void({A1U32}, {A1F16}, {A1U32}, {A1U32}, {A1F32}, {A1F32}, {A2F32}, {A1F32}, {A1F32}, {A1I32}, "
             + ", ".join([I64] * 6) + ")")


def kernels(all_variants: bool = False):
    """(name, python function, signature) for the kernels the host code launches."""
    out = []
    for t in SPECS:
        n = t.name
        variants = all_variants or t.name in ("Q4_K", "Q8_0")
        out.append((f"naive[{n}]", naive_kernel(t), SIG_NAIVE))
        out.append((f"gemv[{n}, NT=1]", gemv_kernel(t, 1, 2, 8, False, False, 2), SIG_GEMV))
        out.append((f"gemm[{n}]", gemm_kernel(t, 64, 32, 4, 4, False), SIG_GEMM))
        out.append((f"tc[{n}]", gemm_tc_kernel(t, 64, 4, 1, False), SIG_TC))
        out.append((f"tc[{n}, BN=64]", gemm_tc_kernel(t, 64, 2, 2, False, -1, 64), SIG_TC))
        if variants:
            out.append((f"gemv[{n}, NT=8, glu]", gemv_kernel(t, 8, 2, 4, True, False, 2), SIG_GEMV))
            out.append((f"gemv[{n}, NT=8, rw]", gemv_kernel(t, 8, 2, 4, False, True, 2), SIG_GEMV))
            out.append((f"gemm[{n}, rw]", gemm_kernel(t, 64, 32, 4, 4, True), SIG_GEMM))
            out.append((f"tc[{n}, rw]", gemm_tc_kernel(t, 64, 4, 1, True), SIG_TC))
        if (st := staged_kernel(t)) is not None:        # the cuBLAS path's weight decode (dequant_gemm.py)
            out.append((f"staged[{n}]", st[0], f"void({A1U32}, {A1F16}, {A1U32}, {A2F32}, {I64}, {I64}, {I64})"))
        if t.name == "F32":                   # the prefill attention's products
            for c in (1, 2):
                out.append((f"tc[{n}, causal={c}]", gemm_tc_kernel(t, 64, 4, 1, False, -1, 32, c), SIG_TC))
    for t in FSPECS:
        n = t.name
        out.append((f"fast1[{n}]", fgemv1_kernel(t, 8, 4, False, False, 8), SIG_GEMV))
        out.append((f"fast1[{n}, glu]", fgemv1_kernel(t, 8, 4, True, False, 8), SIG_GEMV))
        out.append((f"fast1[{n}, ids]", fgemv1_kernel(t, 8, 4, False, True, 8, 2), SIG_GEMV))
        if n in ("Q4_K", "Q8_0", "F16"):                 # one block per pair (the prologue is type-independent)
            out.append((f"fast1[{n}, pairs, rw]", fgemv1_kernel(t, 8, 4, False, True, 8, 3), SIG_GEMV))
        out.append((f"fast[{n}, NT=8, glu]", fgemv_kernel(t, 8, 2, 2, True, False), SIG_GEMV))
        out.append((f"fast[{n}, NT=8, rw]", fgemv_kernel(t, 8, 4, 2, False, True), SIG_GEMV))
    for t in CW:
        n = t.name
        out.append((f"fast8[{n}]", igemv1_kernel(t, 8, 4, False, False, 8), SIG_GEMV))
        out.append((f"fast8[{n}, P=4]", igemv1_kernel(t, 8, 4, False, False, 4), SIG_GEMV))
        out.append((f"fast8[{n}, glu]", igemv1_kernel(t, 8, 4, True, False, 8, 1), SIG_GEMV))
        out.append((f"fast8[{n}, ids]", igemv1_kernel(t, 8, 4, False, True, 8, 2), SIG_GEMV))
        out.append((f"fast8[{n}, pairs, glu]", igemv1_kernel(t, 8, 4, True, False, 8, 3), SIG_GEMV))
        if t in (GGMLType.Q4_K, GGMLType.Q4_0):          # the pipelined one-token kernel (shape flag DB)
            out.append((f"fast8[{n}, DB]", igemv1_kernel(t, 8, 4, False, False, 2, 0, 128, True), SIG_GEMV))
        else:
            out.append((f"fast1[{n}, DB]", fgemv1_kernel(t, 8, 4, False, False, 2, 0, 128, None, True), SIG_GEMV))
    out.append(("tcq[Q4_K]", gemm_tcq_kernel(GGMLType.Q4_K, 4, 2, 32), SIG_TCQ))
    out.append(("tcq[Q4_K, rw]", gemm_tcq_kernel(GGMLType.Q4_K, 4, 2, 32, True), SIG_TCQ))
    out.append(("tcq[Q4_K, staged]", gemm_tcq_staged_kernel(GGMLType.Q4_K, 2, 4, 32), SIG_TCQ))
    out.append(("tcq split", tcq_split_kernel, f"void({A2F32}, uint32[::1], uint32[::1], {A1F32}, int64, int64)"))
    out.append(("tcq16[Q4_K]", gemm_tcq16_kernel(GGMLType.Q4_K, 4, 2, 32), SIG_TCQ16))
    out.append(("tcq16[Q4_K, rw]", gemm_tcq16_kernel(GGMLType.Q4_K, 2, 4, 32, True), SIG_TCQ16))
    out.append(("tcq16 split", tcq16_split_kernel, f"void({A2F32}, {A1F16}, {A1F16}, {A1F32}, {A1F32}, int64)"))
    out.append(("bucket", bucket_kernel, f"void({A1I32}, int64, int64, int64, int64, {A1I32}, {A1I32}, {A1I32}, {A1I32})"))
    out.append(("swiglu", swiglu_kernel, f"void({A2F32}, {A2F32}, {A2F32}, boolean)"))
    out.append(("combine", combine_kernel, f"void({A2F32}, int64, {A2F32}, boolean, {A2F32})"))
    out.append(("h3 split", h3_split_kernel, f"void(float32[:, :], float16[:, :, :], {A1I32}, int64)"))
    out.append(("h3 combine", h3_combine_kernel, "void(float32[:, :, :, ::1], float32[:, :, :, ::1], int32[:, :], "
                "int32[:, :], float32[:, :, :], int64)"))
    out.append(("spin", spin_kernel, f"void(int64, {A1F32})"))
    return out


def resources(ptx: str, cc=(9, 0)) -> dict | None:
    """What ptxas makes of a kernel's PTX (None without ptxas on PATH): registers a thread, spill bytes, shared
    bytes, cubin bytes (line info included). NVVM may write a newer PTX version than the local ptxas reads: the
    version line is lowered to the one ptxas names (numba's kernels use nothing newer)."""
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        for _ in range(2):
            with open(src, "w") as f:
                f.write(ptx)
            r = subprocess.run([exe, f"-arch=sm_{cc[0]}{cc[1]}", "-v", src, "-o", out], capture_output=True,
                               text=True)
            m = re.search(r"Unsupported \.version [\d.]+; current version is '([\d.]+)'", r.stderr)
            if not m:
                break
            ptx = re.sub(r"^\.version [\d.]+", f".version {m.group(1)}", ptx, count=1, flags=re.M)
        if r.returncode != 0:
            return {"error": r.stderr.strip()[-300:]}
        def field(pat: str) -> int:
            f = re.search(pat, r.stderr)
            return int(f.group(1)) if f else 0
        return dict(registers=field(r"Used (\d+) registers"), spill_stores=field(r"(\d+) bytes spill stores"),
                    spill_loads=field(r"(\d+) bytes spill loads"), smem=field(r"(\d+) bytes smem"),
                    cubin_bytes=os.path.getsize(out))


def compile_all(items, cc=(9, 0), verbose=True, with_resources=False) -> list[str]:
    """Each (name, kernel, signature) compiled to PTX for cc; the failures' lines. with_resources: each kernel's
    registers, spills and cubin size from ptxas (`resources`) on its line."""
    failed = []
    for name, k, sig in items:
        t0 = time.perf_counter()
        try:
            ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=cc)
            assert ".entry" in ptx
            if name.startswith(("fast", "tc")) and ".local" in ptx:
                # the fast kernels' working arrays must stay in registers: local memory means a loop
                # over them was not unrolled (see fast_units.FSpec.PMAX / PGLU)
                failed.append(f"{name}: uses local memory")
                print(f"FAIL {name}: uses local memory", flush=True)
                continue
            if verbose:
                res = resources(ptx, cc) if with_resources else None
                extra = "" if not res else res.get("error") or (
                    f"  {res['registers']} registers, spills {res['spill_stores']}/{res['spill_loads']} B, "
                    f"smem {res['smem']} B, cubin {res['cubin_bytes']} B")
                print(f"ok   {name:32s} {time.perf_counter() - t0:5.1f} s  {ptx.count(chr(10))} lines "
                      f"{'LOCAL MEMORY' if '.local' in ptx else ''}{extra}", flush=True)
        except Exception as e:                            # noqa: BLE001 - report every failure
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:500]}")
            print(f"FAIL {name}: {e}", flush=True)
    return failed


def main() -> int:
    if SIM:
        print("NUMBA_ENABLE_CUDASIM is set: nothing to compile")
        return 3
    try:
        importlib.import_module("cuda.bindings")
        from numba.cuda.cudadrv import nvvm
        nvvm.NVVM()
    except Exception as e:                                # noqa: BLE001
        print(f"NVVM is not available ({e}); pip install 'numba-cuda[cu13]'")
        return 3
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--all", action="store_true", help="every variant for every type")
    ap.add_argument("-j", type=int, default=1, help="worker processes")
    ap.add_argument("--resources", action="store_true", help="each kernel's registers, spills and cubin size "
                    "(ptxas on PATH)")
    a = ap.parse_args()
    n = len(kernels(a.all))
    if a.j > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(a.j) as ex:
            failed = sum(ex.map(_worker, [(a.all, i, a.j, a.resources) for i in range(a.j)]), [])
    else:
        failed = compile_all(kernels(a.all), with_resources=a.resources)
    print(f"{len(failed)} of {n} failed" if failed else f"all {n} kernels compile for sm_90")
    return 1 if failed else 0


def _worker(args):
    all_variants, i, j, res = args
    return compile_all(kernels(all_variants)[i::j], with_resources=res)


if __name__ == "__main__":
    sys.exit(main())
