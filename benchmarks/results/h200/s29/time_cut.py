"""Session 29: a 512-token prompt's forward(last_only=True) on the cpu backend, timed twice (the cut written in
/tmp/rs if absent). Run from a checkout with PYTHONPATH=<that checkout> to time its code:
    PYTHONPATH=$PWD python3 benchmarks/results/h200/s29/time_cut.py deepseek2 deepseek-v3 2 512"""
import sys, time, os
import numpy as np
from refengine.model import Model
from refengine.runtime import Runtime
from refengine.cuda.randmodel import cut_file
import refengine
print(refengine.__file__)                                  # which checkout runs
arch, preset, layers, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
path = cut_file("/tmp/rs", arch, preset, layers, "Q4_K")
m = Model(path)
ids = [int(t) for t in np.random.default_rng(0).integers(0, m.cfg.n_vocab, T)]
rt = Runtime(backend="cpu")
times = []
for i in range(2):
    t0 = time.perf_counter()
    out = m.forward(ids, m.new_state(), rt=rt, last_only=True)
    times.append(time.perf_counter() - t0)
print(arch, preset, layers, T, "prefill (cpu backend, last_only) s:", [round(t, 2) for t in times], "argmax", int(out.argmax()))
np.save(f"/tmp/rs/last_{os.path.basename(os.getcwd())}_{arch}.npy", out)
