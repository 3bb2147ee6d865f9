"""The nearest routing ties of a run, and what choosing the runner-up there does to the logits.

    python benchmarks/route_ties.py SAVED.npz MODEL.gguf [--top 10] [--flip auto | STEP:LAYER:ROW ...]

A MoE router picks the k largest of E scores per token: where the k-th and the (k+1)-th are closer than two
backends' rounding of the router's input, the backends may pick different experts, and that token's layer output
then differs by a whole expert's share, not by a rounding. This script runs the ids saved by
`benchmarks/graph_decode.py --save-logits` (a prompt and two decode steps) on the host (`--backend cpu`), lists the
rows whose k-th and (k+1)-th router logits are closest (absolute gap, and the gap over the row's largest |logit|),
and compares the host's logits with the saved (GPU) ones. `--flip`: the run again with the runner-up chosen at the
named rows (step 0 is the prompt, 1 and 2 the decode steps; `auto`: the nearest tie), each compared with the saved
logits too: a flip that brings the distance down to the rounding's is the tie the other backend took the other way.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_logits import fingerprint, host_rows, rel_rms  # noqa: E402


class RouteProbe:
    """Wraps refengine.moe.block.route: records each call's router logits' k-th / (k+1)-th gap per row, and moves
    the (k+1)-th just above the k-th at the rows in `flips` ((step, layer, row) keys)."""

    def __init__(self, route, flips=()):
        self.route, self.flips, self.step, self.gaps = route, set(flips), 0, []
        self.ids = {}                         # (step, layer) -> the ids [T, k] the router chose

    def __call__(self, logits, w, mc, k, *, record, il):
        lg = np.asarray(logits, dtype=np.float32)
        order = np.argsort(-lg, axis=-1, kind="stable")
        rows = np.arange(lg.shape[0])
        kth, nxt = lg[rows, order[:, k - 1]], lg[rows, order[:, k]]
        scale = np.max(np.abs(lg), axis=-1)
        for r in range(lg.shape[0]):
            self.gaps.append((float(kth[r] - nxt[r]), float((kth[r] - nxt[r]) / max(scale[r], 1e-30)),
                              self.step, il, r, int(order[r, k - 1]), int(order[r, k])))
        hit = [r for r in range(lg.shape[0]) if (self.step, il, r) in self.flips]
        if hit:
            lg = lg.copy()
            for r in hit:                     # the runner-up just above the k-th: the other backend's choice
                lg[r, order[r, k]] = np.nextafter(kth[r], np.float32(np.inf))
            logits = lg
        ids, weights = self.route(logits, w, mc, k, record=record, il=il)
        self.ids[(self.step, il)] = np.asarray(ids)
        return ids, weights


def run(model, prompt, tokens, backend, flips=(), probe_out=None):
    """(the logits rows of the prompt's last token and of each decode token, the routed rows' gaps) on a host
    backend, the runner-up chosen at `flips`; probe_out (a list): gets the RouteProbe."""
    import refengine.moe.block as block
    from refengine.runtime import Runtime
    probe = RouteProbe(block.route, flips)
    if probe_out is not None:
        probe_out.append(probe)
    saved, block.route = block.route, probe
    try:
        rows = host_rows(model, Runtime(backend=backend), prompt, tokens,
                         before_token=lambda: setattr(probe, "step", probe.step + 1))
    finally:
        block.route = saved
    return rows, probe.gaps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("saved", help="the .npz written by graph_decode.py --save-logits")
    ap.add_argument("model", help="the model file the saved run ran")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "numpy"))
    ap.add_argument("--top", type=int, default=10, help="the nearest ties listed (default 10)")
    ap.add_argument("--flip", action="append", default=[], metavar="STEP:LAYER:ROW",
                    help="a run with the runner-up chosen at that row (repeatable; 'auto': the nearest tie)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from refengine.model import Model
    saved = np.load(a.saved)
    fp = fingerprint(a.model)
    if fp != str(saved["fingerprint"]):
        print(f"{a.model}: fingerprint {fp} is not the saved file's {saved['fingerprint']} ({saved['model']})",
              file=sys.stderr)
        return 2
    model = Model(a.model)
    prompt, tokens, gpu = [int(t) for t in saved["prompt"]], saved["tokens"], saved["logits"]
    host, gaps = run(model, prompt, tokens, a.backend)
    rels = [rel_rms(g, h) for g, h in zip(gpu, host)]
    print(f"{os.path.basename(a.model)}: saved vs {a.backend} rel-RMS {', '.join(f'{r:.2e}' for r in rels)}; "
          f"{len(gaps)} routed rows", flush=True)
    near = sorted(gaps, key=lambda g: g[1])[:a.top]
    print("  the nearest ties (step, layer, row: k-th - (k+1)-th logit, that over the row's max |logit|, experts):")
    for g in near:
        print(f"    {g[2]}:{g[3]}:{g[4]}  {g[0]:.3e}  {g[1]:.3e}  experts {g[5]} / {g[6]}")
    rec = dict(model=os.path.basename(a.model), backend=a.backend, rel_rms=rels,
               nearest=[dict(step=g[2], layer=g[3], row=g[4], gap=g[0], rel_gap=g[1], kth=g[5], next=g[6])
                        for g in near], flips=[])
    for f in a.flip:
        key = (near[0][2], near[0][3], near[0][4]) if f == "auto" else tuple(int(v) for v in f.split(":"))
        rows, _ = run(model, prompt, tokens, a.backend, [key])
        fr = [rel_rms(g, h) for g, h in zip(gpu, rows)]
        own = [rel_rms(h, r) for h, r in zip(host, rows)]
        rec["flips"].append(dict(at=list(key), rel_rms_vs_saved=fr, rel_rms_vs_unflipped=own))
        print(f"  runner-up at {':'.join(map(str, key))}: saved vs it rel-RMS {', '.join(f'{r:.2e}' for r in fr)} "
              f"(it vs the unflipped run {', '.join(f'{r:.2e}' for r in own)})", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rec, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
