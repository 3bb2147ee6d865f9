"""Where does a loaded state's continuation on the resident GPU path leave the uninterrupted run's bits?"""
import tempfile, os
import numpy as np
from refengine.model import Model
from refengine.runtime import Runtime
from refengine.cuda.randmodel import write_random_model
from refengine.state_file import load_state, save_state
from refengine.cache import Rows

RT = (lambda: Runtime(resident=True)) if os.environ.get("DIAG_SIM") else (lambda: Runtime(backend="cuda"))
d = tempfile.mkdtemp()
path = write_random_model(os.path.join(d, "m.gguf"), "Q8_0", arch="llama", preset="tiny")
m = Model(path)
prompt, toks = [3, 17, 42, 5, 9], [7, 11, 13, 2]

def rows(st):
    out = []
    def walk(v, p):
        if isinstance(v, Rows):
            w = v.view()
            if w is not None:
                out.append((p, np.asarray(w.get() if hasattr(w, "get") else getattr(w, "raw", w))))
        elif isinstance(v, (list, tuple)):
            for i, e in enumerate(v): walk(e, f"{p}.{i}")
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            for k, e in vars(v).items(): walk(e, f"{p}.{k}")
    walk(st.layers, "L")
    return out

def host(a):
    a = getattr(a, "raw", a)
    return a.get() if hasattr(a, "get") else np.asarray(a)

def run(fresh_each):
    rt = RT(); st = m.new_state(); outs = []
    for t in [prompt] + [[x] for x in toks]:
        outs.append(m.forward(t, st, rt=RT() if fresh_each else rt)[-1:].copy())
    return outs, st

def cmp(name, a, b):
    print(name, [("eq" if np.array_equal(x, y) else f"{np.max(np.abs(x - y)):.2e}") for x, y in zip(a, b)], flush=True)

A, sA = run(False)
A2, _ = run(False)
B, sB = run(True)
cmp("single rt twice", A, A2)
cmp("fresh rt each vs single", A, B)
for mode in ("single", "fresh"):
    st = m.new_state(); rt = RT()
    m.forward(prompt, st, rt=rt); m.forward(toks[:1], st, rt=rt)
    f = os.path.join(d, f"s_{mode}.safetensors"); save_state(f, m, st)
    saved = rows(st)
    m2 = Model(m.path); ld = load_state(f, m2)
    lr = rows(ld)
    print(mode, "saved rows == loaded rows:", all(np.array_equal(host(a[1]), host(b[1])) for a, b in zip(saved, lr)), len(saved), len(lr))
    r2 = RT()
    got = [m2.forward([t], ld, rt=RT() if mode == "fresh" else r2)[-1:].copy() for t in toks[1:]]
    cmp(f"loaded ({mode}) vs single", A[2:], got)
    ra, rl = rows(sA), rows(ld)
    for (p, a), (_, b) in zip(ra, rl):
        a, b = host(a), host(b)
        if a.shape != b.shape or not np.array_equal(a, b):
            diff = [i for i in range(min(len(a), len(b))) if not np.array_equal(a[i], b[i])]
            print("  cache", p, a.shape, b.shape, "rows differing:", diff[:10])
