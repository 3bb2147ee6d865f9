"""Fresh Runtime per forward vs one Runtime on the resident GPU path: pool history or Runtime state?"""
import os, tempfile, sys
import numpy as np
import cupy
from refengine.model import Model
from refengine.runtime import Runtime
from refengine.cuda.randmodel import write_random_model

d = tempfile.mkdtemp()
m = Model(write_random_model(os.path.join(d, "m.gguf"), "Q8_0", arch="llama", preset="tiny"))
prompt, toks = [3, 17, 42, 5, 9], [7, 11, 13, 2]
R = lambda: Runtime(backend="cuda")

def run(kind):
    rt = R(); st = m.new_state(); outs = []
    for i, t in enumerate([prompt] + [[x] for x in toks]):
        if kind == "single":
            r = rt
        elif kind == "fresh":
            r = R()
        else:                                  # fresh, warmed by a throwaway prefill on another state
            r = R(); m.forward(prompt, m.new_state(), rt=r)
        outs.append(m.forward(t, st, rt=r)[-1:].copy())
    return outs

def cmp(name, a, b):
    print(name, [("eq" if np.array_equal(x, y) else f"{np.max(np.abs(x - y)):.2e}") for x, y in zip(a, b)],
          "finite", all(np.isfinite(x).all() for x in b), flush=True)

S = run("single")
cmp("fresh", S, run("fresh"))
cmp("fresh+warm", S, run("warm"))
pool = cupy.get_default_memory_pool()
def nan_alloc(size):
    p = pool.malloc(size)
    cupy.cuda.runtime.memset(p.ptr, 0xFF, size)
    return p
cupy.cuda.set_allocator(nan_alloc)
cmp("single, NaN-filled allocations", S, run("single"))
cmp("fresh, NaN-filled allocations", S, run("fresh"))
def zero_alloc(size):
    p = pool.malloc(size)
    cupy.cuda.runtime.memset(p.ptr, 0, size)
    return p
cupy.cuda.set_allocator(zero_alloc)
cmp("single, zeroed allocations", S, run("single"))
cmp("fresh, zeroed allocations", S, run("fresh"))
