"""How many kernels a decode step launches on a GPU, counted without one: the sim device with the fused kernels'
stand-ins (refengine/cuda/standin.py, `note=True`: each fused op one launch, as on a GPU).

    python benchmarks/launches.py [--arch A ...] [--tokens 1 | --prefill 512] [--sites 20] [--json out.json]

A captured decode step replays every launch of its span in order; on the H200 a small kernel takes a few us in a
graph, so a step of a few hundred launches spends most of a millisecond on them whatever its bytes (session 27:
glm5-next and deepseek4, DeepSeek-V4's hyper-connections, the two decodes over 2x llama.cpp). Each arch's tiny
preset (Q4_K), a 20-token prefill and a warm-up decode, then one fixed-shape step of --tokens tokens (the span
`Model.run_step` that graph_decode.py captures) recorded on the device (`Device.recording`). Counted as launches:
every recorded op but views (basic indexing, reshape, transpose, an astype to its own dtype, empty_like); an
indexing by an array (a gather) is one. The layer counts of the tiny presets differ from the real cuts': the
per-layer figure is the comparable one.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import traceback

import numpy as np

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")           # (the stand-ins import the kernels' module)

from refengine.archs import ARCHS                             # noqa: E402
from refengine.cuda.randmodel import cut_file                # noqa: E402
from refengine.cuda.standin import StandIn                   # noqa: E402
from refengine.model import Model                            # noqa: E402
from refengine.runtime import Runtime                        # noqa: E402
from refengine.synth import write_synth                      # noqa: E402

TOKENS = [3, 17, 101, 5, 250, 42, 7] + list(range(40, 53))
VIEWS = {".reshape", ".transpose", ".view", "np.shape", "np.empty_like", "np.empty", ".ravel", "np.reshape",
         "np.transpose", "np.squeeze", "np.expand_dims"}


def _has_array(sig) -> bool:
    if isinstance(sig, tuple):
        if len(sig) == 3 and sig[0] in ("dev", "host") and isinstance(sig[1], tuple):
            return True
        return any(_has_array(e) for e in sig)
    return False


def launches(op: str, args, result) -> bool:
    """Whether a recorded op (name, its arguments' and result's signatures) is a kernel launch on a GPU."""
    if op in VIEWS:
        return False
    if op == "getitem":
        return _has_array(args[1:])                          # x[i] by an array: a gather; else a view
    if op == ".astype":
        return not (isinstance(args, tuple) and isinstance(result, tuple) and len(args) and
                    isinstance(args[0], tuple) and args[0][-1] == result[-1])
    return True


def count(arch: str, directory: str, tokens: int = 1, sites: bool = False, prefill: int = 0,
          stand_in: bool = True, preset: str = "tiny", layers: int | None = None) -> dict:
    """The launches of one fixed-shape step of `tokens` tokens of arch's tiny preset (prefill: instead, an ordinary
    resident forward of a `prefill`-token prompt, as graph_decode.py times one): total, by op, by call site.
    stand_in False: without the fused kernels' stand-ins (every op as NumPy states it, a launch each). preset / layers:
    a random-packed cut of a published config instead (refengine.cuda.randmodel.cut_file, in directory)."""
    if preset == "tiny":
        m = Model(write_synth(arch, os.path.join(directory, f"{arch}.gguf"), wtype="Q4_K"))
    else:
        m = Model(cut_file(directory, arch, preset, layers, "Q4_K"))
    rt = Runtime(resident=True, fixed_shapes=not prefill)
    dev = rt.device
    dev.fused = StandIn(dev, note=True) if stand_in else None
    st = m.new_state()
    if prefill:
        m.forward(TOKENS[:8], st, rt=rt, last_only=True)     # a warm-up: the weights uploaded
        st = m.new_state()
        ids = [int(i) for i in np.random.default_rng(0).integers(0, m.cfg.n_vocab, prefill)]
        step = m.prepare_step(ids, st, rt)
    else:
        m.forward(TOKENS, st, rt=rt)
        m.forward([5], st, rt=rt)
        step = m.prepare_step(list(range(60, 60 + tokens)), st, rt)
    where: list = []
    if sites:
        def probe(op):
            fr = [f for f in traceback.extract_stack()[:-1] if "/refengine/" in f.filename
                  and not f.filename.endswith(("devarray.py", "standin.py"))]
            where.append(" <- ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in fr[-2:][::-1]))
        dev.probes.append(probe)
    strided0 = dict(dev.fused.strided) if stand_in else {}
    with dev.recording() as sig:
        m.run_step(step, st, rt, last_only=bool(prefill))
    strided = {k: v - strided0.get(k, 0) for k, v in (dev.fused.strided if stand_in else {}).items()
               if v > strided0.get(k, 0)}
    if sites:
        dev.probes.clear()
    kept = [k for k, (op, a, r) in enumerate(sig) if launches(op, a, r)]
    by_op = collections.Counter(sig[k][0].split(" blk.")[0] for k in kept)
    out = {"arch": arch, "layers": len(m.cfg.layers), "tokens": prefill or tokens, "prefill": bool(prefill),
           "ops": len(sig), "launches": len(kept), "per_layer": round(len(kept) / len(m.cfg.layers), 1),
           "by_op": dict(by_op.most_common()), "strided": strided}
    if sites:
        out["by_site"] = dict(collections.Counter(where[k] for k in kept if k < len(where)).most_common())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--arch", nargs="*", default=None, help="archs (default: every registered one)")
    ap.add_argument("--tokens", type=int, default=1, help="tokens of the step (1: decode; 8: a small ubatch)")
    ap.add_argument("--prefill", type=int, default=0, help="count an ordinary resident prefill of N tokens instead")
    ap.add_argument("--sites", type=int, default=0, help="also the N call sites launching most")
    ap.add_argument("--top", type=int, default=12, help="ops listed per arch")
    ap.add_argument("--preset", default="tiny", help="a published config's random-packed cut instead of the tiny "
                    "preset (one --arch; the file is written in --dir, kept)")
    ap.add_argument("--layers", type=int, default=None, help="blocks of that cut")
    ap.add_argument("--dir", default=None, help="where that cut is written (default: a temporary folder)")
    ap.add_argument("--json", help="write the counts here")
    a = ap.parse_args(argv)
    archs = a.arch or list(ARCHS)
    if unknown := [x for x in archs if x not in ARCHS]:
        ap.error(f"unknown arch {', '.join(unknown)} (registered: {', '.join(ARCHS)})")
    if a.preset != "tiny" and len(archs) != 1:
        ap.error("--preset names one published config: give one --arch")
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        d = a.dir or tmp
        os.makedirs(d, exist_ok=True)
        for arch in archs:
            r = count(arch, d, a.tokens, bool(a.sites), a.prefill, preset=a.preset, layers=a.layers)
            res.append(r)
            print(f"{arch:12s} {r['launches']:5d} launches ({r['ops']} ops recorded), {r['layers']} layers: "
                  f"{r['per_layer']} a layer")
            print("    " + ", ".join(f"{k} {v}" for k, v in list(r["by_op"].items())[:a.top]))
            if r["strided"]:            # (some entries decline or copy a strided array: check them first)
                print("    fused calls given a strided array: " + ", ".join(f"{k} {v}"
                                                                         for k, v in r["strided"].items()))
            for s, v in list(r.get("by_site", {}).items())[:a.sites]:
                print(f"    {v:5d}  {s}")
            sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
