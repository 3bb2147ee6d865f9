"""Real-size DeepSeek-V3 layers with `--backend cuda` (resident and op by op) against the NumPy backend on the CPU.

    python benchmarks/cuda_deepseek2.py --type Q4_K [--layers 2] [--dir /tmp] [--prompt 8] [--decode 2] [--json out.json]
    python benchmarks/cuda_deepseek2.py --arch glm-dsa --preset glm-5.2 --layers 2      (DSA: GLM-5.2's shapes)
    python benchmarks/cuda_deepseek2.py --arch deepseek32 --preset deepseek-v3.2 --layers 2
    python benchmarks/cuda_deepseek2.py --arch kimi-k3 --preset kimi-k3 --layers 3 --override full_attn=2
                                        (K3: KDA dense, KDA latent MoE, gated MLA latent MoE)

For the DSA archs the indexer's projections run through the same backend; the scores, the top-k and the
attention stay in NumPy. A prompt shorter than the preset's top-k (2048) keeps every key (dense MLA).

The model is the `deepseek-v3` preset (DeepSeek-V3's published shapes: hidden 7168, 128 heads, q-LoRA 1536,
kv-LoRA 512, rope 64, 256 experts of 2048 x 7168, 8 used in 4 of 8 groups, 1 shared expert, vocab 129280,
YaRN factor 40) cut to `--layers` blocks; `--layers N` keeps the first N-1 dense blocks and makes the last
one MoE (archs/deepseek2_synth.py `synth_resolve`), so `--layers 2` holds one dense and one MoE layer.
Matrices hold random packed bytes scaled to std 1/sqrt(fan_in) (refengine.cuda.randmodel).

`--backend cuda` runs the NumPy block code, on device arrays (`--paths resident`) or on host arrays with every
matmul (including MLA's per-head attn_k_b / attn_v_b products) and the routed experts on the GPU (`opbyop`:
attention itself in NumPy). Reported:

    check:  prompt then `--decode` tokens on both backends: logits rel-RMS per step, argmax equal
    time:   wall time per layer (each block timed; results come back to the host after every op) and per token,
            prefill of the prompt and one decoded token, after a warm-up forward
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import quant.cuda  # noqa: F401  (numpy shim before numba)
from refengine.cuda.randmodel import cut_file
from refengine.model import Model
from refengine.runtime import Runtime


def rel_rms(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def sync(rt: Runtime):
    if rt.device is not None and rt.device.kind == "cupy":
        rt.device.xp.cuda.Device().synchronize()


def timed_forward(model: Model, tokens, state, rt: Runtime, per_layer: bool = True):
    """Model.forward with each block's wall time: (logits, [seconds per layer], seconds in all). A resident run is
    synchronised after each block when timed per layer (per_layer False: only at the end, as Model.forward runs)."""
    tokens = model._check_tokens(tokens, state.n_past)
    step = model._step(tokens, state.n_past, rt.device)
    a, cfg = model.arch, model.cfg
    sync(rt)
    t0 = time.perf_counter()
    x = rt.to_device(a.embed(model.g, cfg, step, rt))
    per = []
    for il in range(cfg.n_layer):
        t1 = time.perf_counter()
        x = a.block(x, model.layer(il), cfg=cfg, il=il, state=state.layers[il], step=step, rt=rt)
        if per_layer:
            sync(rt)
        per.append(time.perf_counter() - t1)
    logits = rt.to_host(a.head(x, model.g, cfg, rt))
    state.n_past += tokens.size
    return logits, per, time.perf_counter() - t0


def run(model, rt, prompt, n_dec, per_layer=True):
    st = model.new_state()
    lg, per, total = timed_forward(model, prompt, st, rt, per_layer)
    out = dict(logits=[lg], prefill_layer_s=per, prefill_s=total, decode_layer_s=[], decode_s=[], stats=[])
    for _ in range(n_dec):
        before = rt.device.stats.as_dict() if rt.device is not None else None
        lg, per, total = timed_forward(model, [int(np.argmax(out["logits"][-1][-1]))], st, rt, per_layer)
        out["logits"].append(lg)
        out["decode_layer_s"].append(per)
        out["decode_s"].append(total)
        if before is not None:
            out["stats"].append(rt.device.stats.since(before))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--arch", default="deepseek2", help="deepseek2, deepseek32, glm-dsa, kimi-linear, kimi-k3, qwen3next")
    ap.add_argument("--preset", default="deepseek-v3", help="a preset of the arch (tiny for a quick check)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--backend", default="cuda", help="the backend under test (cpu: a dry run without a GPU)")
    ap.add_argument("--paths", default="resident,opbyop",
                    help="the GPU paths timed: resident (activations and state on the device, Runtime(resident=True)), "
                         "opbyop (host activations, each product on the GPU: resident=False)")
    ap.add_argument("--prefill-time", type=int, default=0, metavar="T",
                    help="also time a prefill of T tokens on the resident path (no CPU check)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="replace a preset entry, e.g. idx_top_k=8 so a short prompt drops keys (DSA)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        path = cut_file(a.dir, a.arch, a.preset, a.layers, a.type, a.override, suffix="-random")
    except ValueError as e:
        ap.error(str(e))
    print(f"model {path}: {os.path.getsize(path) / 1e9:.2f} GB, written in {time.perf_counter() - t0:.1f} s", flush=True)
    model = Model(path)
    print("layers:", [(s.attn, s.ffn) for s in model.cfg.layers], flush=True)
    prompt = list(np.random.default_rng(0).integers(0, model.cfg.n_vocab, a.prompt))
    cpu = run(model, Runtime(), prompt, a.decode)
    print(f"cpu (numpy): prefill {cpu['prefill_s']:.1f} s", flush=True)
    res = dict(type=a.type, layers=[f"{s.attn}/{s.ffn}" for s in model.cfg.layers], prompt=a.prompt,
               cpu_prefill_layer_s=cpu["prefill_layer_s"], cpu_prefill_s=cpu["prefill_s"])
    for path in a.paths.split(","):
        gpu_rt = Runtime(backend=a.backend, resident=path == "resident")
        warm = run(model, gpu_rt, prompt, 1)                               # uploads, compiles every kernel
        gpu = run(model, gpu_rt, prompt, a.decode)
        whole = run(model, gpu_rt, prompt, a.decode, per_layer=False)      # no sync between blocks
        print(f"gpu {path}: prefill {gpu['prefill_s']:.3f} s, decode {gpu['decode_s']} s, unsynced decode "
              f"{whole['decode_s']} s (warm-up {warm['prefill_s']:.1f} s)", flush=True)
        res[path] = dict(
            rel_rms=[rel_rms(g, c) for g, c in zip(gpu["logits"], cpu["logits"])],
            argmax_equal=[bool(np.array_equal(np.argmax(g, -1), np.argmax(c, -1)))
                          for g, c in zip(gpu["logits"], cpu["logits"])],
            prefill_layer_ms=[x * 1e3 for x in gpu["prefill_layer_s"]],
            decode_layer_ms=[statistics.median(col) * 1e3 for col in zip(*gpu["decode_layer_s"])],
            prefill_s=gpu["prefill_s"], decode_token_s=statistics.median(gpu["decode_s"]),
            decode_token_unsynced_s=statistics.median(whole["decode_s"]), decode_device_stats=gpu["stats"][-1:])
        if path == "resident" and a.prefill_time:
            long = list(np.random.default_rng(1).integers(0, model.cfg.n_vocab, a.prefill_time))
            run(model, gpu_rt, long, 0, per_layer=False)
            res[path][f"prefill{a.prefill_time}_s"] = statistics.median(
                run(model, gpu_rt, long, 0, per_layer=False)["prefill_s"] for _ in range(3))
    print(json.dumps(res, indent=1), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    ok = all(r <= 1e-5 for p in a.paths.split(",") for r in res[p]["rel_rms"]) and \
        all(e for p in a.paths.split(",") for e in res[p]["argmax_equal"])
    print("GPU == CPU (rel-RMS <= 1e-5, same argmax):", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
