"""Real-size qwen3moe layers on the GPU: decode and prefill time per layer, and GPU == CPU on the same input.

    python benchmarks/cuda_layers.py --type Q4_K [--layers 3] [--dir /tmp/rs] [--check] [--json out.json]

The model is the `qwen3-30b-a3b` preset (Qwen3-30B-A3B's published shapes: hidden 2048, 32 / 4 heads of
128, 128 experts of 768 x 2048, 8 used, vocab 151936) with `--layers` blocks. Its tensor table and
metadata are `refengine.synth`'s; the matrices hold random packed bytes with block scales set so
that every weight has mean 0 and std 1/sqrt(fan_in) (quantizing 1.8 G weights with ggml's quantizer
takes minutes, and the GPU machine has no libggml). Per-layer cost is the difference between runs of
the first 1 and the first L blocks (the output head cancels), as llama.cpp's anchor does:

    decode:  a 16-token prompt, then 64 tokens one by one (CUDA graph replays); median per token
    prefill: 512 tokens in one forward (fresh cache); median of 3
    check:   the whole file's forward (16-token prompt + 2 decoded tokens) on the GPU and with the NumPy
             backend on the CPU: relative RMS of the logits, and the argmax tokens
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import quant.cuda  # noqa: F401  (numpy shim before numba)
from refengine.cuda.randmodel import write_random_model
from refengine.model import Model
from refengine.runtime import Runtime

LLAMA = {"Q4_K": (53.0, 1.43), "Q8_0": (71.0, 1.66)}        # us decode / ms prefill per layer (anchor, Q4_K_M / Q8_0)


def random_model(directory: str, wtype: str, layers: int) -> str:
    """The preset's file with `layers` blocks of random packed `wtype` weights in `directory` (written once)."""
    path = os.path.join(directory, f"qwen3-30b-a3b-L{layers}-{wtype}-random.gguf")
    if not os.path.exists(path):
        write_random_model(path, wtype, layers)
    return path


def rel_rms(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def time_decode(model, n_layer: int, prompt, n_tok: int) -> dict:
    from refengine.cuda import DeviceModel
    dm = DeviceModel(model, n_layer=n_layer)
    st = model.new_state()
    t0 = time.perf_counter()
    logits = dm.forward(prompt, st)
    t_prompt = time.perf_counter() - t0
    tok = int(np.argmax(logits[-1]))
    dts, gpu = [], []
    for _ in range(n_tok):
        t0 = time.perf_counter()
        logits = dm.forward([tok], st)
        dts.append(time.perf_counter() - t0)
        gpu.append(dm.last_gpu_us)
        tok = int(np.argmax(logits[-1]))
    return dict(decode_gpu_us=statistics.median(gpu[3:]), decode_wall_us=statistics.median(dts[3:]) * 1e6,
                first_wall_us=[d * 1e6 for d in dts[:3]], prompt_s=t_prompt, replays=dm.n_replays)


def time_prefill(model, n_layer: int, tokens, reps: int = 3) -> dict:
    from refengine.cuda import DeviceModel
    dm = DeviceModel(model, n_layer=n_layer)
    dm.forward(tokens, model.new_state())                      # compile + warm
    dts, gpu = [], []
    for _ in range(reps):
        st = model.new_state()
        t0 = time.perf_counter()
        dm.forward(tokens, st)
        dts.append(time.perf_counter() - t0)
        gpu.append(dm.last_gpu_us)
    return dict(gpu_ms=statistics.median(gpu) / 1e3, wall_ms=statistics.median(dts) * 1e3)


def kernel_profile(model, n_layer: int, prompt, n_tok: int) -> dict:
    """DeviceModel's decode steps (graph replays, after 4 unprofiled ones) under torch.profiler: GPU time a step by
    kernel name (the same table `graph_decode.py --profile` writes for the concept modules' graph)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from profile_prefill import kernel_table
    except ImportError as e:
        print(f"no kernel profile: {e}", flush=True)
        return {}
    from refengine.cuda import DeviceModel
    dm = DeviceModel(model, n_layer=n_layer)
    st = model.new_state()
    tok = int(np.argmax(dm.forward(prompt, st)[-1]))
    for _ in range(4):
        tok = int(np.argmax(dm.forward([tok], st)[-1]))
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n_tok):
                tok = int(np.argmax(dm.forward([tok], st)[-1]))
    except (AssertionError, RuntimeError) as e:          # (no CUDA activity to profile: the simulator)
        print(f"no kernel profile: {type(e).__name__}: {e}", flush=True)
        return {}
    by, total, n = kernel_table(prof)
    print(f"DeviceModel L={n_layer}: {n / n_tok:.0f} launches, {1e3 * total / n_tok:.1f} us of GPU time a step "
          f"({n_tok} profiled steps)", flush=True)
    return {name: 1e3 * ms / n_tok for name, (ms, _) in by.items()}


def check(model, prompt, n_dec=2) -> dict:
    """The whole file on the GPU (device path) and on the CPU (NumPy backend), same tokens."""
    out = {}
    for name, rt in (("gpu", Runtime(backend="cuda")), ("cpu", Runtime())):
        st = model.new_state()
        t0 = time.perf_counter()
        lg = [model.forward(prompt, st, rt)]
        toks = []
        for _ in range(n_dec):
            toks.append(int(np.argmax(lg[-1][-1])))
            lg.append(model.forward([toks[-1]], st, rt))
        out[name] = dict(logits=lg, tokens=toks, s=time.perf_counter() - t0)
    g, c = out["gpu"], out["cpu"]
    r = dict(prefill_rel_rms=rel_rms(g["logits"][0], c["logits"][0]),
             decode_rel_rms=[rel_rms(a, b) for a, b in zip(g["logits"][1:], c["logits"][1:])],
             argmax_equal=bool(np.array_equal(np.argmax(g["logits"][0], -1), np.argmax(c["logits"][0], -1))),
             tokens_gpu=g["tokens"], tokens_cpu=c["tokens"], cpu_s=c["s"], gpu_s=g["s"])
    r["max_abs"] = float(max(np.max(np.abs(a - b)) for a, b in zip(g["logits"], c["logits"])))
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--layers", type=int, default=3, help="blocks in the file (per-layer cost from 1..L)")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--decode-tokens", type=int, default=40)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--check", action="store_true", help="GPU logits against the NumPy backend on the CPU")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-profile", action="store_true", help="skip the per-stage profile (eager launches)")
    ap.add_argument("--no-prefill", action="store_true", help="decode only")
    ap.add_argument("--kernel-profile", type=int, default=0, metavar="N",
                    help="N more decode steps at 1 and at --layers layers under torch.profiler (CUPTI): each kernel's "
                         "GPU time a step, written as kernel_profile_us_per_step (benchmarks/fold_measure.py takes "
                         "(L3 - L1) / 2 a kernel against the concept modules' graph)")
    ap.add_argument("--fast1", default="", help="one-token GEMV shapes per matrix size (quant.cuda.ops."
                    "FAST1_SHAPE_BY_DIMS), e.g. 5120x2048=4x2x4x128x1,2048x4096=8x4x8x128x1 (for --type)")
    ap.add_argument("--dispatch-avg", default="", help="expert dispatch kernel choice: ops.PAIRS_AVG,ops.GROUP_AVG "
                    "(0,0: by the batch's tokens alone, the choice before session 11)")
    a = ap.parse_args(argv)
    if a.dispatch_avg:
        from quant.cuda import ops
        try:
            ops.PAIRS_AVG, ops.GROUP_AVG = (int(v) for v in a.dispatch_avg.split(","))
        except ValueError:
            ap.error(f"--dispatch-avg: {a.dispatch_avg!r} is not two integers P,G (e.g. 2,8)")
    if a.fast1:
        from quant import GGMLType
        from quant.cuda import ops
        for item in a.fast1.split(","):
            try:
                dims, sh = item.split("=")
                O, I = (int(v) for v in dims.split("x"))
                ops.FAST1_SHAPE_BY_DIMS[(GGMLType[a.type], O, I)] = tuple(int(v) for v in sh.split("x"))
            except (ValueError, KeyError):
                ap.error(f"--fast1: {item!r} is not OxI=RWxKSxPxCAPxX (e.g. 5120x2048=8x4x8x128x1), "
                         f"or --type {a.type!r} is not a ggml type")
    t0 = time.perf_counter()
    path = random_model(a.dir, a.type, a.layers)
    print(f"{path}: {os.path.getsize(path) / 2**30:.2f} GiB written in {time.perf_counter() - t0:.0f} s", flush=True)
    model = Model(path)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, model.cfg.n_vocab, 16).tolist()
    long = rng.integers(0, model.cfg.n_vocab, a.prefill).tolist()
    res = dict(type=a.type, file=os.path.basename(path), layers=a.layers, decode={}, prefill_ms={}, fast1=a.fast1,
               dispatch_avg=a.dispatch_avg)
    Ls = sorted({1, min(2, a.layers), a.layers})
    for L in Ls:
        res["decode"][L] = d = time_decode(model, L, prompt, a.decode_tokens)
        print(f"L={L}: decode {d['decode_gpu_us']:.1f} us GPU, {d['decode_wall_us']:.1f} us wall per token "
              f"({d['replays']} graph replays)", flush=True)
    for L in ([] if a.no_prefill else sorted({1, a.layers})):
        res["prefill_ms"][L] = p = time_prefill(model, L, long)
        print(f"L={L}: prefill {a.prefill} tokens {p['gpu_ms']:.2f} ms GPU, {p['wall_ms']:.2f} ms wall", flush=True)
    Lmax = Ls[-1]
    if a.kernel_profile:
        res["kernel_profile_us_per_step"] = {L: kernel_profile(model, L, prompt, a.kernel_profile) for L in (1, Lmax)}
    if not a.no_profile:
        from refengine.cuda import DeviceModel
        dm = DeviceModel(model, n_layer=Lmax)
        st = model.new_state()
        dm.forward(prompt, st)
        res["profile_decode_us"] = dm.profile([int(prompt[0])], st)
        res["profile_prefill_us"] = dm.profile(long, model.new_state())
        for k in ("profile_decode_us", "profile_prefill_us"):
            print(f"{k} (L={Lmax}): " + ", ".join(f"{n} {v:.1f}" for n, v in res[k].items()), flush=True)
    if Lmax > 1:
        d, p = res["decode"], res["prefill_ms"]
        for k in ("gpu", "wall"):
            res[f"decode_{k}_us_per_layer"] = (d[Lmax][f"decode_{k}_us"] - d[1][f"decode_{k}_us"]) / (Lmax - 1)
            if p:
                res[f"prefill_{k}_ms_per_layer"] = (p[Lmax][f"{k}_ms"] - p[1][f"{k}_ms"]) / (Lmax - 1)
        ll = LLAMA.get(a.type)
        pre = (f", prefill {a.prefill} {res['prefill_gpu_ms_per_layer']:.2f} ms GPU "
               f"({res['prefill_wall_ms_per_layer']:.2f} ms wall)") if p else ""
        print(f"{a.type}: per layer decode {res['decode_gpu_us_per_layer']:.1f} us GPU "
              f"({res['decode_wall_us_per_layer']:.1f} us wall){pre}"
              + (f"  (llama.cpp {ll[0]} us, {ll[1]} ms)" if ll else ""), flush=True)
    if a.check:
        res["check"] = check(model, prompt)
        print("check:", {k: v for k, v in res["check"].items()}, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
