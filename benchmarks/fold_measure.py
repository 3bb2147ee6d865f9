"""The fold's measure read back (issue 23: the concept modules' qwen3moe decode layer at or under DeviceModel's):
the files `benchmarks/results/h200/s31/call.sh` writes with FOLD="1 3" [FOLD_TYPES="Q4_K Q8_0"] [FOLD_PROFILE=N].

    python benchmarks/fold_measure.py DIR [DIR ...]

Per type: DeviceModel's decode GPU time a layer (`cuda_layers.py`'s fit over 1..3 layers) and the modules' captured
step's GPU time a layer, (L3 - L1) / 2 of `graph_decode.py`'s `graph_gpu_ms`. With FOLD_PROFILE, the modules' kernels
a layer by name ((L3 - L1) / 2 of each kernel's GPU time a step, torch.profiler), and DeviceModel's the same way when
`cuda_layers.py` ran with --kernel-profile.
"""
from __future__ import annotations

import argparse
import json
import os
import re


def _load(d: str, name: str) -> dict | None:
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def _by_kernel(prof: dict) -> dict:
    """GPU time a step by kernel, a kernel's specializations together: the names less their `[abi:...]` tags (they
    differ between processes), e.g. every `fgemv1` in one row."""
    out: dict = {}
    for name, us in prof.items():
        k = re.sub(r"\[abi:[^\]]*\]?", "", name).split("::")[-1].strip()
        out[k] = out.get(k, 0.0) + us
    return out


def measure(d: str, ty: str) -> dict | None:
    s = "" if ty == "Q4_K" else f"_{ty}"
    dm, l1, l3 = (_load(d, f"fold_{n}{s}.json") for n in ("devicemodel", "L1", "L3"))
    if dm is None and l1 is None:
        return None
    r = {"dir": d, "type": ty}
    if dm is not None:
        r["devicemodel_us"] = dm.get("decode_gpu_us_per_layer")
        kp = dm.get("kernel_profile_us_per_step") or {}
        L = sorted(int(n) for n in kp)
        if len(L) == 2 and kp[str(L[0])] and kp[str(L[1])]:                   # (JSON keys are strings)
            q1, q3 = _by_kernel(kp[str(L[0])]), _by_kernel(kp[str(L[1])])
            r["devicemodel_kernels_us_per_layer"] = {k: (q3.get(k, 0.0) - q1.get(k, 0.0)) / (L[1] - L[0])
                                                     for k in sorted(set(q1) | set(q3))}
    if l1 is not None and l3 is not None and l1.get("graph_gpu_ms") and l3.get("graph_gpu_ms"):
        r["modules_us"] = 1e3 * (l3["graph_gpu_ms"] - l1["graph_gpu_ms"]) / 2
        p1, p3 = l1.get("profile_us_per_step"), l3.get("profile_us_per_step")
        if p1 and p3:
            p1, p3 = _by_kernel(p1), _by_kernel(p3)
            r["kernels_us_per_layer"] = {k: (p3.get(k, 0.0) - p1.get(k, 0.0)) / 2 for k in sorted(set(p1) | set(p3))}
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    bars = {"Q4_K": 77.7, "Q8_0": 80.0}
    out = []
    for d in a.dirs:
        for ty in ("Q4_K", "Q8_0"):
            r = measure(d, ty)
            if r is None:
                continue
            out.append(r)
            dm, mo = r.get("devicemodel_us"), r.get("modules_us")
            f = (lambda v: "-" if v is None else f"{v:.1f} us")
            verdict = "" if dm is None or mo is None else \
                ("  modules at or under DeviceModel" if mo <= dm else f"  modules {mo - dm:+.1f} us over DeviceModel")
            print(f"{d} {ty}: DeviceModel {f(dm)} a layer, modules {f(mo)} a layer (issue's bar {bars[ty]} us, H200)"
                  f"{verdict}")
            for who, key in (("the modules", "kernels_us_per_layer"), ("DeviceModel", "devicemodel_kernels_us_per_layer")):
                ks = r.get(key, {})
                if ks:
                    print(f"  {who}' kernels a layer: {sum(ks.values()):.1f} us")
                for k, v in sorted(ks.items(), key=lambda kv: -kv[1]):
                    if abs(v) >= 0.05:
                        print(f"    {v:7.2f} us  {k}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
