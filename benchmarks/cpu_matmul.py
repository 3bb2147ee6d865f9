"""GEMV speed on the CPU per ggml type: quant.cpu (Numba) next to the NumPy oracle and llama.cpp.

    python benchmarks/cpu_matmul.py [--types q4_K,q8_0] [--rows 4096] [--cols 14336] [--rounds 5]
                                    [--threads N] [--write BENCHMARKS.md]

Weights O x I = 4096 x 14336 (the llama.cpp anchor's shape), Gaussian rows quantized by ggml's own
quantizer (`ggml_quantize_chunk`, an importance matrix of ones where the type needs one); one f32
activation row. GB/s counts the packed weight bytes read once per GEMV.

  numba   quant.cpu.matmul (fused dequantize + dot on the packed bytes, Numba's default thread count)
  oracle  quant.ref.matmul (NumPy decode to float32 + BLAS), the reference every kernel is tested against
  ggml    llama.cpp's own CPU matmul, `ggml_mul_mat` on the bundled libggml-cpu through ctypes
          (benchmarks/ggml_mulmat.py), with as many threads as Numba, reading the same weight buffer
          (not a copy: same pages, same TLB / huge-page state); it rounds the activations to the
          weight's partner type (Q8_0/Q8_1/Q8_K) and uses integer SIMD dot products

The machine is shared, so numba and ggml are timed in alternating rounds within one run, and each
figure is the median over all rounds; the ratio ggml_time / numba_time is what to compare across runs
(> 1: quant.cpu is faster). OpenMP workers are told to sleep when idle (OMP_WAIT_POLICY=PASSIVE) so
Numba's threads do not spin against ggml's.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ggml_mulmat import GGMLMulMat

from quant import QTensor, cpu, ref
from quant import ggml as qggml
from quant.formats import GGMLType, type_info

# the types llama.cpp's test-backend-ops measures for MUL_MAT (../shared/anchors/llamacpp-cpu.md)
TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q1_0", "q2_0", "mxfp4", "nvfp4",
         "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "tq2_0", "tq1_0", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs",
         "iq1_s", "iq1_m", "iq4_nl", "iq3_s", "iq4_xs"]
SECTION = "## CPU (project machine: 2 cores, no GPU)"
NOTE_AVX2 = ('Not like for like (see the AVX-512 section): llama.cpp rounds the activation row to 8 bits and '
             'multiplies in 8-bit integer SIMD (maddubs: 32 multiply-adds per instruction), quant.cpu keeps the '
             'oracle\'s exact float32 product. On AVX2 the kernels, written for 16 float32 lanes, run as two ymm '
             'halves (16 ymm registers hold 8 such vectors: some spill), so every per-weight step costs twice: a '
             'convert and an FMA per 8 weights, where llama.cpp spends about an instruction per 32 weights; the '
             '16- and 32-bit float types and Q8_0 are bounded by memory and stay level or ahead. Code-book '
             'lookups, one `vpermps` with AVX-512, are two `vpermps` per 8 lanes and a blend here (lut), integer '
             'shift/and/subtract/convert for the centred integer books (lut_affine), one `pshufb` on the packed '
             'bytes for the 4-bit books of IQ4_NL, IQ4_XS and MXFP4 (nib_lut). Q4_K and TQ2_0 read one weight '
             'row at a time here (dot.PAIRED_GEMV: their two-row kernels spill).')
NOTE = ('Not like for like: llama.cpp first rounds the activation row to 8 bits (Q8_0/Q8_K) and multipli'
        'es in 8-bit integer SIMD (maddubs / VNNI: 32-64 multiply-adds per instruction); quant.cpu keeps'
        ' the exact float32 product the NumPy oracle defines (rel-RMS column): an FMA per 16 weights (on'
        'e per cycle on this Zen 4 core) plus at least one decode operation, and 64 bytes of float32 x pe'
        'r 16 weights, which for a 14336-long row (57 KB) stream from L2 at about 2.3 cycles per 16 weigh'
        'ts -- where llama.cpp reads 16 bytes of Q8 activations and spends about 1.1 cycles on TQ2_0. Q1_'
        '0, Q4_K and TQ2_0 therefore read two weight rows per pass, each 16 x loaded once for'
        ' both; the 2-bit and ternary types stay behind on instruction count; the i-quants are bound by t'
        'he scalar work of their grid indices; the 16/32-bit float types and Q8_0 are bounded by memory '
        'and read two weight rows at a time. The machine is shared: figures move by up to 2x between run'
        's; the ratio is measured in one run.')


def weights(t: GGMLType, wf: np.ndarray) -> np.ndarray:
    if t == GGMLType.F32:
        return np.ascontiguousarray(wf).view(np.uint8)
    imat = np.ones(wf.shape[1], np.float32) if qggml.requires_imatrix(t) else None
    return qggml.quantize(wf, t, imatrix=imat)


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure(name: str, wf: np.ndarray, x: np.ndarray, rounds: int, reps: int, oracle_reps: int) -> dict:
    t = type_info(name).type
    O, I = wf.shape
    raw = weights(t, wf)
    w = QTensor.from_raw(name, t, (O, I), raw)
    y = cpu.matmul(x, w)                                        # compiles (or loads the cache)
    gm = GGMLMulMat(raw, t, O, I, 1, numba.get_num_threads(), share=True)   # the same pages as quant.cpu
    gm.run(x)
    t_nb, t_gg = [], []
    for _ in range(rounds):                                     # alternate: both see the same machine load
        t_nb += timed(lambda: cpu.matmul(x, w), reps)
        t_gg += timed(lambda: gm.run(x), reps)
    gm.close()
    # the oracle last: OpenBLAS leaves its threads spinning for a while after a call, which slowed
    # both engines measured right after it by ~2x
    t_or = timed(lambda: ref.matmul(x, w), oracle_reps)
    y_ref = ref.matmul(x, w)
    err = float(np.sqrt(np.mean((y.astype(np.float64) - y_ref) ** 2) / np.mean(y_ref.astype(np.float64) ** 2)))
    time.sleep(0.5)
    nb, gg, orc = float(np.median(t_nb)), float(np.median(t_gg)), float(np.median(t_or))

    def gbs(s: float) -> float:
        return raw.nbytes / s / 1e9
    return {"type": name, "bpw": 8 * type_info(t).type_size / type_info(t).block_size, "numba_us": nb * 1e6,
            "numba": gbs(nb), "ggml": gbs(gg), "oracle": gbs(orc), "vs_ggml": gg / nb, "vs_oracle": orc / nb,
            "relrms": err}


def table(rows: list[dict]) -> str:
    out = [("| type | bits/weight | quant.cpu us | quant.cpu GB/s | llama.cpp GB/s | NumPy oracle GB/s | "
            "vs llama.cpp | vs oracle | rel-RMS vs oracle |"),
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['type']} | {r['bpw']:.4g} | {r['numba_us']:.0f} | {r['numba']:.1f} | {r['ggml']:.1f} | "
                   f"{r['oracle']:.2f} | {r['vs_ggml']:.2f}x | {r['vs_oracle']:.0f}x | {r['relrms']:.1e} |")
    return "\n".join(out)


def isa() -> str:
    """The widest vector extension the kernels compile for on this host (quant.cpu.simd)."""
    from quant.cpu import simd
    return "AVX-512" if simd.HAVE_AVX512 else ("AVX2, no AVX-512" if simd.HAVE_AVX2 else "no AVX2")


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model} ({isa()}), {os.cpu_count()} cores, {platform.system()}; numba {numba.__version__} ({numba.get_num_threads()} threads, {numba.threading_layer()} layer), numpy {np.__version__}"


def write_section(path: str, text: str, sub: str) -> None:
    """Put `text` under the heading `### {sub}` of the CPU section of BENCHMARKS.md (one per vector
    extension: the kernels differ), replacing what was there up to the next heading; a new one goes first."""
    with open(path) as f:
        lines = f.read().split("\n")
    i = lines.index(SECTION)
    end = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
    head = f"### {sub}"
    if head in lines[i:end]:
        i = lines.index(head, i)
        j = next((k for k in range(i + 1, end) if lines[k].startswith(("## ", "### "))), end)
        lines[i + 1:j] = ["", text, ""]
    else:
        k = next((k for k in range(i + 1, end) if lines[k].startswith("### ")), end)
        lines[k:k] = [head, "", text, ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", default=",".join(TYPES), help="comma-separated ggml type names")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=14336)
    p.add_argument("--rounds", type=int, default=5, help="alternating numba/ggml rounds")
    p.add_argument("--reps", type=int, default=4, help="GEMVs per engine per round")
    p.add_argument("--oracle-reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="threads for both engines (default: Numba's)")
    p.add_argument("--write", default=None, help="BENCHMARKS.md to update (its CPU section)")
    a = p.parse_args(argv)
    if a.threads:
        numba.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    wf = rng.standard_normal((a.rows, a.cols), dtype=np.float32)
    x = rng.standard_normal((1, a.cols), dtype=np.float32)
    rows = []
    for name in a.types.split(","):
        r = measure(name, wf, x, a.rounds, a.reps, a.oracle_reps)
        rows.append(r)
        print(f"{name:8s} quant.cpu {r['numba']:6.1f} GB/s  llama.cpp {r['ggml']:6.1f} GB/s  "
              f"oracle {r['oracle']:6.2f} GB/s  vs llama.cpp {r['vs_ggml']:.2f}x  rel-RMS {r['relrms']:.1e}", flush=True)
    t = table(rows)
    print()
    print(t)
    if a.write:
        cmd = "python benchmarks/cpu_matmul.py " + " ".join(argv if argv is not None else sys.argv[1:])
        ahead = sum(r["vs_ggml"] > 1 for r in rows)
        text = "\n".join([
            f"GEMV y = x W^T, W {a.rows} x {a.cols} per ggml type (Gaussian rows quantized by ggml), one f32",
            "activation row; GB/s of packed weights read once; median over alternating rounds in one run.",
            f"quant.cpu ahead of llama.cpp's CPU kernels on {ahead} of {len(rows)} types.",
            NOTE if isa() == "AVX-512" else NOTE_AVX2,
            "",
            f"- command: `{cmd.strip()}`",
            f"- machine: {machine()}",
            f"- date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}",
            "",
            t])
        write_section(a.write, text, f"{isa()} host")
        print(f"\nwrote the CPU section of {a.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
