"""Where a resident prefill's time goes: GPU time per kernel (CUPTI through torch.profiler, which records every
kernel of the process: numba's, CuPy's, cuBLAS's) and the host's part (cProfile), at real size.

    python benchmarks/profile_prefill.py [MODEL.gguf] [--arch deepseek2 --preset deepseek-v3 --layers 2]
                                         [--tokens 512] [--top 30] [--trace out.json]

Writes the random-packed Q4_K cut (refengine.cuda.randmodel) when no file is given, runs one warm-up prefill of
`--tokens` random ids (the last position's logits, as graph_decode.py --prefill times it), times three, then
profiles one: kernels grouped by name (total GPU ms, launches), the sum of kernel time against the wall time (the
difference is the host's: launches, Python, synchronisations), with --segments the GPU time between the forward's
named tensors (which part of a block), and the host functions by own time.
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import os
import pstats
import re
import time

import numpy as np

import quant.cuda  # noqa: F401  (numpy shim before numba)
from refengine.model import Model
from refengine.runtime import Runtime


def short(name: str) -> str:
    """A kernel's name without its mangling: `_ZN<len><word>...` (numba's, C++'s) -> the last two words; other
    C++ names cut at the first '<' or '('."""
    if name.startswith("_ZN"):
        i, words = 3, []
        while i < len(name) and name[i].isdigit():
            j = i
            while name[j].isdigit():
                j += 1
            words.append(name[j:j + int(name[i:j])])
            i = j + int(name[i:j])
        if words:
            return ".".join(words[-2:])[:70]
    return re.split(r"[<(]", name)[0][:70]


def kernel_table(prof):
    """torch.profiler's CUDA events grouped by short kernel name -> ({name: [ms, count]}, total ms, launches)."""
    by = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        dt = getattr(ev, "device_time", 0.0)
        if str(getattr(ev, "device_type", "")).endswith("CUDA") and dt:
            k = short(ev.name)
            by[k][0] += dt / 1e3
            by[k][1] += 1
    return by, sum(v[0] for v in by.values()), sum(v[1] for v in by.values())


def print_table(by, total: float, top: int, scale: float = 1.0, unit: str = "ms") -> None:
    """The kernel table, largest first (times and counts divided by `scale`: per step)."""
    for k, (ms, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {ms / scale:9.3f} {unit} {100 * ms / max(total, 1e-9):5.1f}% {c / scale:7.1f}x  {k}")


def segments(run, rt, cp, top: int) -> None:
    """One prefill with a CUDA event recorded on the current stream at every `rt.record(name, il, ...)` call: the
    GPU time from one named point to the next is charged to 'previous -> next' (layer indices dropped), summed
    over the layers, and printed largest first."""
    marks = []
    orig = type(rt).record

    def record(self, name, *args, **kw):
        ev = cp.cuda.Event()
        ev.record()
        marks.append((name, ev))
        return orig(self, name, *args, **kw)
    type(rt).record = record
    try:
        start = cp.cuda.Event()
        start.record()
        marks.append(("start", start))
        run()
        end = cp.cuda.Event()
        end.record()
        marks.append(("end", end))
        end.synchronize()
    finally:
        type(rt).record = orig
    by = collections.defaultdict(float)
    for (n0, e0), (n1, e1) in zip(marks, marks[1:]):
        by[f"{n0} -> {n1}"] += cp.cuda.get_elapsed_time(e0, e1)
    total = cp.cuda.get_elapsed_time(marks[0][1], marks[-1][1])
    print(f"segments: {len(marks) - 2} named points, {total:.1f} ms from first to last event")
    for k, ms in sorted(by.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {ms:9.2f} ms {100 * ms / max(total, 1e-9):5.1f}%  {k}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--arch", default="deepseek2")
    ap.add_argument("--preset", default="deepseek-v3")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3, help="timed prefills (the median reported)")
    ap.add_argument("--wall-only", action="store_true", help="only the prefill's median time (no profiles)")
    ap.add_argument("--sort", default="tottime", help="the host profile's order (pstats: tottime, cumulative)")
    ap.add_argument("--trace", default=None, help="also write the chrome trace here")
    ap.add_argument("--segments", action="store_true", help="also the GPU time between the forward's named tensors "
                    "(a CUDA event at each `rt.record` point, stream-ordered: e.g. 'ffn_inp-1 .. ffn_out-1' is layer "
                    "1's FFN), summed by name")
    ap.add_argument("--fixed-shapes", action="store_true", help="the fixed-shape runtime a captured ubatch runs "
                    "(Runtime(fixed_shapes=True)) with a capture's kernels (timing.graph_kernels: no cuBLAS), "
                    "as a graph decoder's eager ubatch step: where a 512-token ubatch graph's time goes")
    ap.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                    help="a KernelPolicy setting, e.g. group_avg=16 or sgemm_decode=staged (repeatable)")
    ap.add_argument("--device-model", action="store_true", help="llama / qwen3moe: the hand-written DeviceModel "
                    "(Runtime(device_model=True)); without it the concept modules, as every arch")
    a = ap.parse_args(argv)
    if a.device_model and not hasattr(Runtime, "device_forward"):
        ap.error("--device-model: this tree has no DeviceModel (refengine/cuda/runner.py)")
    import cupy as cp
    path = a.model
    if path is None:
        from refengine.cuda.randmodel import cut_file
        path = cut_file(a.dir, a.arch, a.preset, a.layers, a.type, a.override)
    m = Model(path)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, m.cfg.n_vocab, a.tokens)]
    from quant.cuda.policy import KernelPolicy
    pol = KernelPolicy.default().with_settings(a.policy) if a.policy else None
    rt = Runtime(backend="cuda", kernel_policy=pol, fixed_shapes=a.fixed_shapes,
                 **({"device_model": True} if a.device_model else {}))
    from contextlib import nullcontext

    from quant.cuda.timing import graph_kernels

    def run():
        with graph_kernels() if a.fixed_shapes else nullcontext():
            m.forward(ids, m.new_state(), rt=rt, last_only=True)
        cp.cuda.Device().synchronize()

    def launch_paths():
        """One more prefill's numba launches by path (quant/cuda/fastlaunch.py): the short one, or numba's whole
        way (~170-260 us of host each: a strided array or another argument type), by kernel."""
        from quant.cuda import fastlaunch
        if not fastlaunch.INSTALLED:
            print("numba launches: fastlaunch not installed (every launch numba's whole way)")
            return
        fastlaunch.reset_stats()
        run()
        slow = ", ".join(f"{k} {v}" for k, v in sorted(fastlaunch.slow_by.items(), key=lambda kv: -kv[1])[:12])
        print(f"numba launches: {fastlaunch.stats['short']} short, {fastlaunch.stats['numba']} numba's whole way"
              + (f" ({slow})" if slow else ""), flush=True)

    run()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    wall = 1e3 * float(np.median(times))
    print(f"{os.path.basename(path)}: prefill of {a.tokens} tokens {wall:.1f} ms (median of {a.reps}; "
          f"{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f})"
          + (f", policy {' '.join(a.policy)}" if a.policy else "")
          + (", fixed shapes with a capture's kernels" if a.fixed_shapes else ""), flush=True)
    launch_paths()
    if a.wall_only:
        return 0
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        print("torch.profiler not importable: no kernel table")
    else:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            run()
            prof_wall = 1e3 * (time.perf_counter() - t0)
        by, total, n = kernel_table(prof)
        print(f"kernels: {n} launches, {total:.1f} ms of GPU time in a {prof_wall:.1f} ms prefill (profiled); "
              f"host's part ~{prof_wall - total:.1f} ms")
        print_table(by, total, a.top)
        if a.trace:
            prof.export_chrome_trace(a.trace)
    if a.segments:
        try:
            segments(run, rt, cp, a.top)
        except Exception as e:                       # an optional view: the rest of the report stands without it
            print(f"segments: {type(e).__name__}: {e}")
    pr = cProfile.Profile()
    pr.enable()
    run()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats(a.sort).print_stats(a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
