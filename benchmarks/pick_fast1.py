"""The fastest one-token GEMV shape per matrix size from a `cuda_gemv1.py --dims ... --json` file, printed as
`cuda_layers.py --fast1` takes it:   python benchmarks/pick_fast1.py gemv1.json [TYPE]  ->  5120x2048=8x4x8x128x1,...
"""
from __future__ import annotations

import json
import sys


def pick(res: list, tname: str) -> str:
    best: dict[str, tuple[float, str]] = {}
    for r in res:
        if r["type"] != tname:
            continue
        for key, v in r["gemv"].items():
            if ":" not in key:
                continue
            dims, sh = key.split(":")
            if dims not in best or v["us"] < best[dims][0]:
                best[dims] = (v["us"], sh)
    return ",".join(f"{d}={sh}" for d, (_, sh) in best.items())


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = json.load(f)
    print(pick(data, sys.argv[2] if len(sys.argv) > 2 else data[0]["type"]))
