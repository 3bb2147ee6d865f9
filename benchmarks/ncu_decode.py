"""Driver for a hardware-counter profile of one decode step of real-size qwen3moe layers, kernel by kernel:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size,\\
        launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python3 benchmarks/ncu_decode.py --type Q4_K --layers 2

The `qwen3-30b-a3b` preset cut to `--layers` blocks with random packed weights (`refengine.cuda.randmodel`), a
16-token prompt, then decode steps through a `GraphDecoder` (`Runtime(backend="cuda", fixed_shapes=True)`: the
concept modules resident on the GPU): an eager step, the captured one, a replay, then one profiled replay (ncu
profiles each kernel node of the graph: `--graph-profiling node`, its default).
"""
from __future__ import annotations

import argparse

import numpy as np

# isort: off
import quant.cuda  # noqa: F401  (numpy shim before numba)
from numba import cuda
# isort: on

from cuda_layers import random_model  # the script's folder is on sys.path

from refengine.cuda.graph_step import GraphDecoder
from refengine.model import Model
from refengine.runtime import Runtime


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    model = Model(random_model(a.dir, a.type, a.layers))
    rt = Runtime(backend="cuda", fixed_shapes=True)
    st = model.new_state()
    rng = np.random.default_rng(1)
    tok = int(np.argmax(model.forward(rng.integers(0, model.cfg.n_vocab, 16).tolist(), st, rt=rt)[-1]))
    dec = GraphDecoder(model, rt, st)
    for _ in range(3):                                   # eager (compiles, warms), captured, replayed
        tok = int(np.argmax(dec.step(tok)))
    assert dec.replays == 1, (dec.eager, dec.captures, dec.replays, dec.failed)
    cuda.synchronize()
    cuda.profile_start()
    dec.step(tok)
    cuda.synchronize()
    cuda.profile_stop()
    print(f"profiled one replayed decode step ({dec.replays} replays)", flush=True)


if __name__ == "__main__":
    main()
