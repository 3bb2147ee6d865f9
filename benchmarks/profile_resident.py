"""cProfile of decode steps on the device-resident path (Runtime(backend="cuda")): where the host time goes.

    python benchmarks/profile_resident.py --arch deepseek2 --preset deepseek-v3 --layers 2 [--decode 3] [--top 45]

Writes the random-packed Q4_K cut (refengine.cuda.randmodel) like cuda_deepseek2.py, runs a prompt and one warm-up
decode, then profiles `--decode` decode steps and prints the functions by own time and by cumulative time.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time


import quant.cuda  # noqa: F401  (numpy shim before numba)
from refengine.cuda.randmodel import write_random_model
from refengine.model import Model
from refengine.runtime import Runtime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="deepseek2")
    ap.add_argument("--preset", default="deepseek-v3")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--decode", type=int, default=3)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args(argv)
    path = os.path.join(a.dir, f"{a.arch}-{a.preset}-L{a.layers}-{a.type}-random.gguf")
    if not os.path.exists(path):
        write_random_model(path, a.type, a.layers, arch=a.arch, preset=a.preset)
    m = Model(path)
    rt = Runtime(backend="cuda")
    st = m.new_state()
    m.forward(list(range(8)), st, rt=rt)
    m.forward([3], st, rt=rt)
    sync = rt.device.xp.cuda.Device().synchronize
    sync()
    t = time.perf_counter()
    pr = cProfile.Profile()
    pr.enable()
    for i in range(a.decode):
        m.forward([5 + i], st, rt=rt)
    sync()
    pr.disable()
    print(f"{a.arch} L{a.layers}: {(time.perf_counter() - t) / a.decode * 1e3:.2f} ms per token (profiled)")
    for key in ("tottime", "cumulative"):
        pstats.Stats(pr).sort_stats(key).print_stats(a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
