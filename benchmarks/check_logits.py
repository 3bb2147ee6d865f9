"""GPU == CPU on a real-size cut, the comparison done on the host: logits saved on the GPU machine against a host run.

    python benchmarks/check_logits.py SAVED.npz [MODEL.gguf | --arch A --preset P --layers L [--override K=V]]
                                      [--backend cpu] [--dir /tmp] [--json out.json]

`benchmarks/graph_decode.py FILE --prefill 512 --save-logits SAVED.npz` saves, from the GPU's eager resident run,
the logits of a prompt's last row and of two decode steps after it, the ids, and the model file's fingerprint. This
script runs the same ids through the same file on a host backend (`cpu`: the Numba kernels; `numpy`: the oracle's
own NumPy) and compares each row: issue 23's bar is rel-RMS <= 1e-5 and the same argmax. Without a model path the
random-packed cut is written here (`refengine.cuda.randmodel`, the same seed as the GPU machine's) and its
fingerprint must equal the saved one: a different file is an error, not a comparison.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

TOL = 1e-5
SAMPLES, SPAN = 64, 1 << 16


def fingerprint(path: str) -> str:
    """The file's size and a BLAKE2b of 64 KiB at 64 evenly spaced offsets (the header, every tensor region's
    neighbourhood, the end): enough to tell two random-packed cuts apart without reading gigabytes."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for i in range(SAMPLES):
            f.seek(max(0, min(size - SPAN, i * (size // SAMPLES))))
            h.update(f.read(SPAN))
    return f"{size}:{h.hexdigest()}"


def rel_rms(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


def host_rows(model, rt, prompt, tokens, before_token=None):
    """The prompt's last logits row, then one row per decode token, on `rt` (before_token(): called before each
    decode token's forward)."""
    st = model.new_state()
    rows = [model.forward(prompt, st, rt=rt, last_only=True)[-1]]
    for t in tokens:
        if before_token is not None:
            before_token()
        rows.append(model.forward([int(t)], st, rt=rt)[-1])
    return np.stack(rows)


def add_cut_args(ap) -> None:
    """The model file, or the random-packed cut to write (--arch, --preset, --layers, --type, --override, --dir)."""
    ap.add_argument("model", nargs="?", default=None, help="the model file (default: write the random-packed cut)")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--dir", default="/tmp")


def cut_path(ap, a) -> str:
    """`add_cut_args`' file: the model given, or the random-packed cut (written in --dir if it is not there)."""
    if a.model is not None:
        return a.model
    if not (a.arch and a.preset and a.layers):
        ap.error("give the model file, or --arch, --preset and --layers of the random-packed cut")
    from refengine.cuda.randmodel import cut_file
    print(f"the {a.arch} {a.preset} cut of {a.layers} layers (written if missing, in {a.dir})", flush=True)
    return cut_file(a.dir, a.arch, a.preset, a.layers, a.type, a.override)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("saved", help="the .npz written by graph_decode.py --save-logits")
    add_cut_args(ap)
    ap.add_argument("--backend", default="cpu", choices=("cpu", "numpy"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from refengine.model import Model
    from refengine.runtime import Runtime

    saved = np.load(a.saved)
    path = cut_path(ap, a)
    fp = fingerprint(path)
    if fp != str(saved["fingerprint"]):
        print(f"{path}: fingerprint {fp} is not the saved file's {saved['fingerprint']} ({saved['model']}): "
              "not the file the GPU ran", file=sys.stderr)
        return 2
    model = Model(path)
    t0 = time.perf_counter()
    host = host_rows(model, Runtime(backend=a.backend), [int(t) for t in saved["prompt"]], saved["tokens"])
    secs = time.perf_counter() - t0
    gpu = saved["logits"]
    rels = [rel_rms(g, h) for g, h in zip(gpu, host)]
    argmax = [int(np.argmax(g)) == int(np.argmax(h)) for g, h in zip(gpu, host)]
    ok = max(rels) <= TOL and all(argmax)
    rec = dict(file=os.path.basename(path), fingerprint=fp, backend=a.backend, prompt_tokens=len(saved["prompt"]),
               rows=["prompt's last", "decode 1", "decode 2"][:len(rels)], rel_rms=rels, argmax_equal=argmax,
               host_seconds=secs, ok=ok)
    print(f"{rec['file']}: GPU vs {a.backend} ({rec['prompt_tokens']}-token prompt's last row, "
          f"{len(rels) - 1} decode steps) rel-RMS {', '.join(f'{r:.2e}' for r in rels)}, argmax equal {all(argmax)}"
          f" -> {'OK' if ok else 'FAIL'} (bar {TOL:g}; {secs:.0f} s on the host)", flush=True)
    if max(rels) > 1e-6 and getattr(model.cfg, "n_expert", 0):     # above the kernels' usual rounding, a MoE model
        print(f"  (a router's near-tie taken the other way may explain it: python benchmarks/route_ties.py {a.saved} "
              f"{path} --flip auto)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
