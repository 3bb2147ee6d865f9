"""Decode from a captured CUDA graph (refengine/cuda/graph_step.py) against the eager device-resident decode.

    python benchmarks/graph_decode.py [MODEL.gguf] [--arch deepseek2 --preset tiny --layers N --type Q8_0]
                                      [--prompt 8] [--decode 16] [--json out.json]

A prompt (random ids, seeded) is prefilled, then `--decode` tokens (random, seeded: the same for every run) are
decoded one at a time by three runs of their own state: eager resident with fixed shapes (the graph's own numbers:
the same kernels in the same order), the graph decoder, and the ordinary eager resident run (the cache grows a row
per token). Reported: milliseconds per decoded token of each, the median over the steps after the first two (the
graph's: over its replayed steps, not the eager step and the capture a full cache's recapture costs; the logits read
back every token), the graph's own
GPU time per replay (events around the launch: what the step costs without the host's part), the largest
difference graph vs eager-fixed (expected 0: bit-identical), rel-RMS graph vs the ordinary run (float summation
order only, tests/test_capture.py), the decoder's counters (eager steps, captures, replays). Without a model path a
file is written: the tiny synthetic preset (refengine.synth), or with --preset other than tiny a random-packed cut of
the published shapes (refengine.cuda.randmodel).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from refengine.compare import metrics
from refengine.model import Model
from refengine.runtime import Runtime


SIM = False                  # --backend numpy: the sim device (a tape for a graph): a dry run of this script
POLICY = None                # --policy KEY=VALUE ...: the GPU runs' KernelPolicy (None: the defaults)


def sync():
    if SIM:
        return
    import cupy as cp
    cp.cuda.Device().synchronize()


def runtime(**kw):
    return Runtime(resident=True, **kw) if SIM else Runtime(backend="cuda", kernel_policy=POLICY, **kw)


def decode_eager(model, rt, prompt, tokens, first=None):
    """Per-token logits and times of an eager decode after the prompt; `first` (a list): gets the prompt's last
    logits row."""
    st = model.new_state()
    y = model.forward(prompt, st, rt=rt, last_only=True)
    if first is not None:
        first.append(y[-1])
    out, times = [], []
    for t in tokens:
        sync()
        t0 = time.perf_counter()
        out.append(model.forward([t], st, rt=rt)[-1])
        times.append(time.perf_counter() - t0)
    return out, times


def decode_graph(model, rt, prompt, tokens):
    from refengine.cuda.graph_step import GraphDecoder
    st = model.new_state()
    model.forward(prompt, st, rt=rt)
    dec = GraphDecoder(model, rt, st, timing=True)     # (the sim: no events, the phases only)
    rows = np.ones((len(tokens), model.cfg.n_vocab), dtype=np.float32)    # the caller's memory (`out=`), touched
    out, times, replayed = [], [], []                                     # once: as a generate loop's reused buffer
    for i, t in enumerate(tokens):
        sync()
        n = dec.replays
        t0 = time.perf_counter()
        out.append(dec.step(t, out=rows[i]))
        times.append(time.perf_counter() - t0)
        replayed.append(dec.replays > n)
    dec.replayed = replayed                  # which steps were replays (not an eager step or a (re)capture)
    return out, times, dec


def profile_steps(dec, tokens, rec) -> None:
    """`tokens` more steps of the graph decoder under torch.profiler: the kernels' GPU time per step by name."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from profile_prefill import kernel_table, print_table
    except ImportError as e:
        print(f"no kernel profile: {e}")
        return
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for t in tokens:
            dec.step(t)
    by, total, n = kernel_table(prof)
    k = len(tokens)
    rec["profile_us_per_step"] = {name: 1e3 * ms / k for name, (ms, _) in by.items()}
    print(f"kernels of {k} profiled steps: {n / k:.0f} launches, {1e3 * total / k:.1f} us of GPU time a step")
    print_table({name: [1e3 * ms, c] for name, (ms, c) in by.items()}, 1e3 * total, 40, scale=k, unit="us")
    import cProfile
    import pstats
    pr = cProfile.Profile()                               # the host's part of the same steps (replays)
    pr.enable()
    for t in tokens:
        dec.step(t)
    pr.disable()
    print(f"host functions over {k} more steps (cProfile, by own time):")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def time_prefill(model, ids, reps: int = 3, rt=None, out=None, times_out=None) -> float:
    """Milliseconds of an eager resident forward of `ids` from a new state, the last position's logits read back
    (`last_only`: llama-bench's pp test asks for no other row), median of `reps` after one warm-up. out (a list):
    gets the last run's logits row; times_out (a list): the timed runs' seconds."""
    rt = rt or runtime()
    times = []
    for i in range(reps + 1):
        st = model.new_state()
        sync()
        t0 = time.perf_counter()
        y = model.forward(ids, st, rt=rt, last_only=True)
        sync()
        times.append(time.perf_counter() - t0)
    if out is not None:
        out.append(np.asarray(y[-1]))
    if times_out is not None:
        times_out.extend(times[1:])
    return 1e3 * float(np.median(times[1:]))


def time_prefills(model, ids, rec, reps: int = 3) -> str | None:
    """rec["prefill_ms"]: the default runtime's prefill of ids (the concept modules); where the hand-written
    DeviceModel serves the arch (llama, qwen3moe: `Runtime(device_model=True)`), also rec["prefill_device_model_ms"]
    and the two last rows' rel-RMS: a line saying so (else None)."""
    row = []
    rec["prefill_ms"] = time_prefill(model, ids, reps, rt=runtime(), out=row)
    rt_d = None if SIM or not hasattr(Runtime, "device_forward") else runtime(device_model=True)   # (the fold: none)
    if rt_d is None or not device_model_serves(model, rt_d):
        return None
    dm = []
    rec["prefill_device_model_ms"] = time_prefill(model, ids, reps, rt=rt_d, out=dm)
    rel = float(np.sqrt(metrics(row[0], dm[0])[0]))                       # sqrt(NMSE)
    rec["prefill_device_model_vs_modules_rel_rms"] = rel
    return (f"prefill of {len(ids)} tokens on the concept modules {rec['prefill_ms']:.1f} ms, DeviceModel "
            f"(device_model=True) {rec['prefill_device_model_ms']:.1f} ms; last rows rel-RMS {rel:.2e}")


def device_model_serves(model, rt) -> bool:
    """Whether `rt`'s eager forward of `model` runs on the hand-written DeviceModel (llama, qwen3moe) rather than
    the concept modules."""
    serves = getattr(rt, "device_forward", None)         # (a tree without DeviceModel has no such method)
    return serves is not None and serves(model) is not None


def prefill_ubatches(model, ids, U: int):
    """A prompt through one GraphDecoder in ubatches of U tokens (room reserved for all of it: no cache grows), and
    through an eager fixed-shape runtime the same way: per ubatch its milliseconds, its kind (e eager, c capture, r
    replay) and the last position's logits of both."""
    from refengine.cuda.graph_step import GraphDecoder
    chunks = [ids[i:i + U] for i in range(0, len(ids), U)]
    dec = GraphDecoder(model, runtime(fixed_shapes=True), model.new_state(), timing=True)
    dec.reserve(len(ids) + 1)
    rt_e, st_e = runtime(fixed_shapes=True), model.new_state()
    out = dict(graph=[], eager=[], graph_ms=[], eager_ms=[], kinds=[])
    for c in chunks:
        n = (dec.eager, dec.captures, dec.replays)
        sync()
        t0 = time.perf_counter()
        out["graph"].append(dec.step(c))
        out["graph_ms"].append(1e3 * (time.perf_counter() - t0))
        out["kinds"].append("ecr"[[a != b for a, b in zip(n, (dec.eager, dec.captures, dec.replays))].index(True)])
        sync()
        t0 = time.perf_counter()
        out["eager"].append(model.forward(c, st_e, rt=rt_e, last_only=True)[-1])
        out["eager_ms"].append(1e3 * (time.perf_counter() - t0))
    out["failed"] = dec.failed
    return out


def greedy_pipelined(model, prompt, n: int, chunk: int):
    """Greedy ids through GraphDecoder.greedy (each replay feeding its argmax to the next on the device, `chunk`
    launched back to back), room reserved: (ids, milliseconds a token over the pipelined run, the decoder), against
    Model.generate on an eager fixed-shape runtime (its ids)."""
    from refengine.cuda.graph_step import GraphDecoder
    rt = runtime(fixed_shapes=True)
    st = model.new_state()
    first = int(np.argmax(model.forward(prompt, st, rt=rt, last_only=True)[-1]))
    dec = GraphDecoder(model, rt, st)
    dec.reserve(len(prompt) + n + 8)
    warm = dec.greedy(first, 4)                           # eager, capture, a first pipelined run
    sync()
    t0 = time.perf_counter()
    rest = dec.greedy(warm[-1], n, chunk=chunk)
    sync()
    ms = 1e3 * (time.perf_counter() - t0) / max(n - 1, 1)
    want = model.generate(prompt, len(warm) + n - 1, rt=runtime(fixed_shapes=True))
    return warm + rest[1:], ms, want, dec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--arch", default="deepseek2", help="an arch, or a comma-separated list (tiny presets: one line "
                    "each, the JSON a list)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--type", default="Q8_0")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="replace a preset entry of a random-packed cut, e.g. n_expert=16")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "numpy"), help="numpy: the sim device, a dry run")
    ap.add_argument("--check-cpu", default=None, choices=("numpy", "cpu"),
                    help="also run the prompt and the first two decode steps on this host backend and compare the GPU "
                         "eager run's logits with them (issue 23: rel-RMS <= 1e-5, the same argmax)")
    ap.add_argument("--save-logits", default=None, metavar="NPZ",
                    help="with --prefill: also save the GPU eager run's logits of that prompt's last row and of two "
                         "decode steps after it, with the ids and the file's fingerprint, for "
                         "benchmarks/check_logits.py to compare on a host backend elsewhere (GPU == CPU on a "
                         "real-size cut without the GPU machine's time)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, N more graph steps under torch.profiler (CUPTI): GPU time per kernel "
                         "per step, largest first (what one replayed step's time is made of)")
    ap.add_argument("--greedy", type=int, default=0, metavar="N",
                    help="also decode N greedy tokens with each replay feeding its own argmax to the next on the "
                         "device, --chunk replays launched back to back (GraphDecoder.greedy): ms a token")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--ubatch", type=int, default=0, metavar="U",
                    help="also prefill --ubatches ubatches of U random tokens through one graph decoder (a graph per "
                         "ubatch size: eager, capture, replays) and eagerly at fixed shapes, each ubatch timed")
    ap.add_argument("--ubatches", type=int, default=4, metavar="N")
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="also time the eager resident prefill of N random tokens (median of 3 after a warm-up)")
    ap.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                    help="a KernelPolicy setting for the GPU runs, e.g. prefill_gemm=tcq16 (repeatable)")
    a = ap.parse_args(argv)
    global SIM, POLICY
    SIM = a.backend == "numpy"
    POLICY = None
    if a.policy and not SIM:
        from quant.cuda.policy import KernelPolicy
        POLICY = KernelPolicy.default().with_settings(a.policy)
    if "," in a.arch:
        recs, rc = [], 0
        for arch in a.arch.split(","):
            try:
                rc |= one(argparse.Namespace(**{**vars(a), "arch": arch, "json": None}), recs)
            except Exception as e:                       # one arch's failure does not stop the others
                print(f"{arch}: {type(e).__name__}: {e}", flush=True)
                rc = 1
        if a.json:
            with open(a.json, "w") as f:
                json.dump(recs, f, indent=1)
        return rc
    return one(a, [])


def one(a, recs) -> int:
    path = a.model
    if path is None:
        from refengine.cuda.randmodel import cut_file
        path = cut_file(a.dir, a.arch, a.preset, a.layers, a.type, a.override)
    model = Model(path)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.prompt)]
    tokens = [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.decode)]
    fixed, t_fixed = decode_eager(model, runtime(fixed_shapes=True), prompt, tokens)
    graph, t_graph, dec = decode_graph(model, runtime(fixed_shapes=True), prompt, tokens)
    first = []
    plain, t_plain = decode_eager(model, runtime(), prompt, tokens, first)
    diff = max(float(np.max(np.abs(g - f))) for g, f in zip(graph, fixed))
    rel = max(float(np.sqrt(np.mean((g - p) ** 2) / np.mean(p ** 2))) for g, p in zip(graph, plain))
    same_argmax = all(int(np.argmax(g)) == int(np.argmax(p)) for g, p in zip(graph, plain))
    med = lambda t: 1e3 * float(np.median(t[2:] if len(t) > 4 else t))     # noqa: E731  (first steps: warm-up)
    rec = dict(model=path, arch=model.cfg.arch if hasattr(model.cfg, "arch") else a.arch, decode=a.decode,
               eager_fixed_ms=med(t_fixed), eager_ms=med(t_plain),
               graph_ms=1e3 * float(np.median([t for t, r in zip(t_graph, dec.replayed) if r] or t_graph)),
               graph_min_ms=1e3 * float(np.min([t for t, r in zip(t_graph, dec.replayed) if r] or t_graph)),
               graph_vs_fixed_max_abs=diff, graph_vs_eager_rel_rms=rel, same_argmax=same_argmax,
               graph_gpu_ms=float(np.median(dec.gpu_ms)) if dec.gpu_ms else None, eager_steps=dec.eager,
               captures=dec.captures, replays=dec.replays,
               writebacks=getattr(dec, "writebacks", None), capture_failed=dec.failed,
               graph_times_ms=[1e3 * t for t in t_graph], graph_replayed=dec.replayed,
               graph_phases_ms={k: float(np.median([p[k] for p in dec.phases])) for k in dec.REPLAY_PHASES}
               if dec.phases else None)
    print(f"{os.path.basename(path)}: decode per token  eager {rec['eager_ms']:.2f} ms, eager fixed-shape "
          f"{rec['eager_fixed_ms']:.2f} ms, graph {rec['graph_ms']:.3f} ms (min {rec['graph_min_ms']:.3f}; "
          f"{rec['eager_ms'] / rec['graph_ms']:.1f}x; "
          f"the graph's GPU time {rec['graph_gpu_ms'] or float('nan'):.3f} ms); "
          f"graph vs eager fixed max |diff| {diff:.3g}, vs eager rel-RMS {rel:.2e}, argmax equal {same_argmax}; "
          f"{dec.eager} eager, {dec.captures} captures, {dec.replays} replays"
          + (f"; capture failed: {dec.failed}" if dec.failed else ""), flush=True)
    if rec["graph_phases_ms"]:
        print(f"{os.path.basename(path)}: a replayed step by phase (median ms): "
              + ", ".join(f"{k} {v:.3f}" for k, v in rec["graph_phases_ms"].items()), flush=True)
    if a.profile and not SIM:
        profile_steps(dec, [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.profile)], rec)
    if a.check_cpu:
        host_first = []
        t0 = time.perf_counter()
        host, _ = decode_eager(model, Runtime(backend=a.check_cpu), prompt, tokens[:2], host_first)
        pairs = list(zip(first + plain[:2], host_first + host))
        rec["cpu_backend"] = a.check_cpu
        rec["cpu_rel_rms"] = [float(np.sqrt(metrics(h, g)[0])) for g, h in pairs]        # sqrt(NMSE)
        rec["cpu_argmax_equal"] = all(int(np.argmax(g)) == int(np.argmax(h)) for g, h in pairs)
        rec["cpu_ok"] = max(rec["cpu_rel_rms"]) <= 1e-5 and rec["cpu_argmax_equal"]
        print(f"{os.path.basename(path)}: GPU vs {a.check_cpu} (prompt's last row, 2 decode steps) rel-RMS "
              f"{', '.join(f'{r:.2e}' for r in rec['cpu_rel_rms'])}, argmax equal {rec['cpu_argmax_equal']} "
              f"({time.perf_counter() - t0:.0f} s on the host)", flush=True)
    if a.greedy:
        ids, ms, want, gdec = greedy_pipelined(model, prompt, a.greedy, a.chunk)
        rec.update(greedy_tokens=a.greedy, greedy_chunk=a.chunk, greedy_ms=ms, greedy_ids_equal=ids == want,
                   greedy_capture_failed=gdec.failed)
        print(f"{os.path.basename(path)}: greedy decode fed on the device, {a.chunk} replays a launch run: {ms:.3f} ms "
              f"a token over {a.greedy}; ids == the eager fixed-shape generate: {ids == want}"
              + (f"; capture failed: {gdec.failed}" if gdec.failed else ""), flush=True)
    if a.ubatch:
        ub = prefill_ubatches(model, [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.ubatch * a.ubatches)],
                              a.ubatch)
        rel = [float(np.sqrt(np.mean((g - e) ** 2) / np.mean(e ** 2))) for g, e in zip(ub["graph"], ub["eager"])]
        reps = [t for t, k in zip(ub["graph_ms"], ub["kinds"]) if k == "r"]
        rec.update(ubatch=a.ubatch, ubatch_kinds="".join(ub["kinds"]), ubatch_graph_ms=ub["graph_ms"],
                   ubatch_eager_fixed_ms=ub["eager_ms"], ubatch_rel_rms=rel, ubatch_capture_failed=ub["failed"],
                   ubatch_argmax_equal=all(int(np.argmax(g)) == int(np.argmax(e))
                                           for g, e in zip(ub["graph"], ub["eager"])),
                   ubatch_replay_ms=float(np.median(reps)) if reps else None)
        print(f"{os.path.basename(path)}: {a.ubatches} ubatches of {a.ubatch} tokens through a graph decoder "
              f"({rec['ubatch_kinds']}): " + ", ".join(f"{t:.1f}" for t in ub["graph_ms"]) + " ms; eager "
              "fixed-shape " + ", ".join(f"{t:.1f}" for t in ub["eager_ms"]) + " ms; a replayed ubatch "
              + (f"{rec['ubatch_replay_ms']:.1f} ms" if reps else "none") + f"; vs eager rel-RMS <= {max(rel):.2e}, "
              f"argmax equal {rec['ubatch_argmax_equal']}" + (f"; capture failed: {ub['failed']}" if ub["failed"]
                                                               else ""), flush=True)
    if a.prefill:
        rec["prefill_tokens"] = a.prefill
        ids = [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.prefill)]
        line = time_prefills(model, ids, rec)
        if line:
            print(f"{os.path.basename(path)}: {line}", flush=True)
        if a.save_logits:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # (benchmarks/check_logits.py)
            from check_logits import fingerprint
            rows, _ = decode_eager(model, runtime(), ids, tokens[:2], head := [])
            np.savez_compressed(a.save_logits, prompt=np.asarray(ids, np.int32),
                                tokens=np.asarray(tokens[:2], np.int32),
                                logits=np.stack(head + rows).astype(np.float32),
                                model=os.path.basename(path), fingerprint=fingerprint(path))
            print(f"{os.path.basename(path)}: the GPU's logits of the {a.prefill}-token prompt and 2 decode steps "
                  f"saved to {a.save_logits}", flush=True)
        print(f"{os.path.basename(path)}: prefill of {a.prefill} tokens (eager resident) {rec['prefill_ms']:.1f} ms",
              flush=True)
    recs.append(rec)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    return 0 if diff == 0.0 and same_argmax and rec.get("cpu_ok", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
