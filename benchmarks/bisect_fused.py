"""Which fused kernel moves a GPU result: GPU == host logits with groups of fused entries left to the NumPy statements.

    python benchmarks/bisect_fused.py MODEL.gguf [--prompt 512] [--off a,b --off c ...] [--each] [--all]
    python benchmarks/bisect_fused.py --arch A --preset P --layers L [--override K=V] ...   (the random-packed cut)

The host's rows (`--backend cpu`, the Numba kernels; or `numpy`) of a prompt's last logits and of two decode steps
are made once; then the GPU's eager resident run of the same ids, first with every fused kernel, then once per
`--off` group under `KernelPolicy.fused_off` (those entries run as the NumPy statements on the device arrays),
`--each`: each entry the default run reached, alone; `--all`: all of them at once (only the products' kernels left).
Each line is the run's rel-RMS against the host rows, per row, and whether the argmax is the same (issue 23's bar:
1e-5). The group whose removal brings the distance down is the kernel to read against its NumPy statement.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_logits import add_cut_args, cut_path, host_rows, rel_rms  # noqa: E402


def gpu_rows(model, prompt, tokens, off=(), sim=False, settings=()):
    """(rows, the fused entries the run reached) of a GPU (or the sim's) eager resident run with `off` left out
    (and the KernelPolicy `settings`, KEY=VALUE strings)."""
    from quant.cuda.policy import KernelPolicy
    from refengine.runtime import Runtime
    if sim:                       # the sim device with the stand-ins (entries computing the NumPy functions)
        from refengine.cuda.standin import StandIn
        rt = Runtime(resident=True)
        rt.device.fused = StandIn(rt.device)
        rt.device.fused_off = frozenset(off)
    else:
        pol = KernelPolicy.default().with_settings(list(settings)).replace(fused_off=tuple(off))
        rt = Runtime(backend="cuda", kernel_policy=pol)
    reached = set()
    probe = lambda op: op.startswith("fused ") and reached.add(op[6:])      # noqa: E731  (Device.note's probes)
    rt.device.probes.append(probe)
    rows = host_rows(model, rt, prompt, tokens)
    rt.device.probes.remove(probe)
    reached |= set(getattr(rt.device.fused, "hits", {}))                    # (the stand-ins count their calls)
    del rt
    gc.collect()
    return rows, reached


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cut_args(ap)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512, as check_logits)")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "numpy"), help="the host reference")
    ap.add_argument("--off", action="append", default=[], metavar="A,B",
                    help="a group of fused entries left out in one run (repeatable)")
    ap.add_argument("--policy", action="append", default=[], metavar="K=V;K=V",
                    help="a run under these KernelPolicy settings, all fused entries on (repeatable): e.g. "
                         "sgemm_min=1000000 (no cuBLAS products), tcq=False")
    ap.add_argument("--each", action="store_true", help="also each fused entry the default run reached, alone")
    ap.add_argument("--all", action="store_true", help="also every fused entry at once")
    ap.add_argument("--sim", action="store_true",
                    help="the sim device with NumPy stand-ins for the fused entries (a dry run: every distance the "
                         "host's)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from refengine.cuda.standin import numpy_twins
    from refengine.model import Model
    from refengine.runtime import Runtime
    path = cut_path(ap, a)
    known = set(numpy_twins())
    groups = [tuple(n.strip() for n in g.split(",") if n.strip()) for g in a.off]
    for g in groups:
        for n in g:
            if n not in known:
                ap.error(f"--off {','.join(g)}: no fused entry {n!r}; the entries: {', '.join(sorted(known))}")
    model = Model(path)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.prompt)]
    tokens = [int(t) for t in rng.integers(0, model.cfg.n_vocab, 2)]
    t0 = time.perf_counter()
    host = host_rows(model, Runtime(backend=a.backend), prompt, tokens)
    print(f"{os.path.basename(path)}: the host's rows ({a.backend}, {a.prompt}-token prompt, 2 decode steps) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    runs = []

    def one(off, settings=()):
        rows, reached = gpu_rows(model, prompt, tokens, off, a.sim, settings)
        rels = [rel_rms(g, h) for g, h in zip(rows, host)]
        same = all(int(np.argmax(g)) == int(np.argmax(h)) for g, h in zip(rows, host))
        runs.append(dict(off=list(off), policy=list(settings), rel_rms=rels, argmax_equal=same,
                         reached=sorted(reached)))
        what = f"policy {';'.join(settings)}" if settings else f"off {','.join(off) or '(none)'}"
        print(f"  {what:<44} rel-RMS {', '.join(f'{r:.2e}' for r in rels)}  "
              f"argmax equal {same}", flush=True)
        return reached

    reached = one(())
    if reached:
        print(f"  the default run reached: {', '.join(sorted(reached))}", flush=True)
    for g in groups:
        one(g)
    for v in a.policy:
        one((), tuple(x.strip() for x in v.split(";") if x.strip()))
    if a.each:
        for n in sorted(reached & known):
            one((n,))
    if a.all:
        one(tuple(sorted(known)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(file=os.path.basename(path), backend=a.backend, prompt_tokens=a.prompt, runs=runs), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
