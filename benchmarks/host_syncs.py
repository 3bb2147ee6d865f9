"""Where a device-resident prefill waits for the GPU: every read-back and every upload of one forward, by call site.

    python benchmarks/host_syncs.py [MODEL.gguf | --arch A --preset P --layers L [--override K=V]] [--tokens 512]
                                    [--backend sim|cuda] [--dir /tmp] [--json out.json]

A read-back (`float(x)`, `np.asarray(x)`, a `.get()`) of a device array waits until the GPU has run everything
queued before it: the host stops launching while the GPU drains, then the GPU idles while the host launches the
next ops. A prefill whose host part is near its GPU part (glm-dsa, kimi-linear, qwen3next on the H200) loses up to
the smaller of the two at each one. This runs a prompt of `--tokens` random ids through a random-packed cut on the
resident path (`sim`: NumPy standing in for the device, no GPU needed: the same module code, the same read-backs;
`cuda`: the GPU) and lists each read-back and upload with its three innermost call sites outside the device layer.
What a prefill must read back: the routing ids of an eager MoE layer (its group tables are built on the host), the
NaN/inf flags once, the logits.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import time
import traceback

import numpy as np


def site() -> str:
    """The three innermost frames outside the device layer and NumPy, innermost first."""
    st = [f for f in traceback.extract_stack()[:-2]
          if not f.filename.endswith("devarray.py") and "/numpy/" not in f.filename]
    return " <- ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in st[-3:][::-1])


def trace_syncs(model, rt, ids) -> collections.Counter:
    """Read-backs and uploads of one resident forward of `ids` (last row's logits), by kind, shape and call site
    (a warm-up forward first: weights' first uploads are not counted)."""
    model.forward(ids[:8], model.new_state(), rt=rt, last_only=True)
    dev = rt.device
    seen: collections.Counter = collections.Counter()
    download, copy_in = dev._download, dev._copy_in

    def dl(raw, op):
        seen[f"read-back {op} {list(raw.shape)} @ {site()}"] += 1
        return download(raw, op)

    def up(h):
        seen[f"upload {list(np.shape(h))} @ {site()}"] += 1
        return copy_in(h)
    dev._download, dev._copy_in = dl, up
    try:
        model.forward(ids, model.new_state(), rt=rt, last_only=True)
    finally:
        dev._download, dev._copy_in = download, copy_in
    return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--arch", default="deepseek2")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--backend", default="sim", choices=("sim", "cuda"))
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from refengine.model import Model
    from refengine.runtime import Runtime

    path = a.model
    if path is None:
        from refengine.cuda.randmodel import cut_file
        path = cut_file(a.dir, a.arch, a.preset, a.layers, a.type, a.override)
    model = Model(path)
    rt = Runtime(resident=True) if a.backend == "sim" else Runtime(backend="cuda")
    ids = [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.n_vocab, a.tokens)]
    t0 = time.perf_counter()
    seen = trace_syncs(model, rt, ids)
    secs = time.perf_counter() - t0
    n_read = sum(v for k, v in seen.items() if k.startswith("read-back"))
    print(f"{os.path.basename(path)}: a {a.tokens}-token resident prefill ({a.backend}): {n_read} read-backs, "
          f"{sum(seen.values()) - n_read} uploads ({secs:.1f} s with the warm-up)")
    for k, v in seen.most_common():
        print(f"{v:5d}  {k}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=os.path.basename(path), tokens=a.tokens, backend=a.backend, read_backs=n_read,
                           sites=dict(seen)), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
