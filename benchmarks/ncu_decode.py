"""Driver for a hardware-counter profile of one decode step of real-size qwen3moe layers, kernel by kernel:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size,\\
        launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python3 benchmarks/ncu_decode.py --type Q4_K --layers 2

The `qwen3-30b-a3b` preset with random packed weights (`refengine.cuda.randmodel`), a 16-token prompt, one
warm decode step, then one profiled decode step launched eagerly (the same kernels a CUDA graph replays).
"""
from __future__ import annotations

import argparse

import numpy as np

# isort: off
import quant.cuda  # noqa: F401  (numpy shim before numba)
from numba import cuda
# isort: on

from cuda_layers import random_model  # the script's folder is on sys.path

from refengine.cuda import DeviceModel
from refengine.model import Model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    model = Model(random_model(a.dir, a.type, a.layers))
    dm = DeviceModel(model, graphs=False)
    st = model.new_state()
    rng = np.random.default_rng(1)
    lg = dm.forward(rng.integers(0, model.cfg.n_vocab, 16).tolist(), st)
    tok = int(np.argmax(lg[-1]))
    for _ in range(2):                                   # compiles and warms the one-token kernels
        tok = int(np.argmax(dm.forward([tok], st)[-1]))
    cuda.synchronize()
    cuda.profile_start()
    dm.forward([tok], st)
    cuda.synchronize()
    cuda.profile_stop()
    print("profiled one decode step", flush=True)


if __name__ == "__main__":
    main()
