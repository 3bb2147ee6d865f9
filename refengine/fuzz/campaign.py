"""The campaign: seeds, mutants by index, the JSON-lines record, the tables in docs/fuzz.md, the command line.

    python -m refengine.fuzz -n 5100 --jobs 2 --out fuzz.jsonl --table fuzz.md

Mutant i of a campaign seeded s is seed file `sorted(SEEDS)[i % 6]`, kind `KINDS[(i // 6) % 17]`, mutated with
`numpy.random.default_rng([s, i])`: any record can be made again from its index.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict

import numpy as np

from .bounded import OUTCOMES, llamacpp_setup, run_bounded, run_llamacpp, run_refengine
from .mutate import KINDS, mutate

SEEDS = {   # name -> (arch, write_synth options): dense, MoE, quantized (MLA + MoE), split, sparse attention
    "dense-f32": ("llama", dict(wtype="F32")),
    "moe-q8_0": ("qwen3moe", dict(wtype="Q8_0")),
    "moe-f16": ("llama", dict(preset="tiny-moe", wtype="F16")),
    "mla-q4_k": ("deepseek2", dict(wtype="Q4_K")),
    "split3-q8_0": ("llama", dict(wtype="Q8_0", shards=3)),
    "dsa-q8_0": ("glm-dsa", dict(wtype="Q8_0")),
}


def make_seeds(root: str, names=None) -> dict[str, list[str]]:
    """Write the seed files; name -> its files (first: the one to open)."""
    from ..synth import write_synth
    out = {}
    for name in names or SEEDS:
        arch, kw = SEEDS[name]
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        first = write_synth(arch, os.path.join(d, f"{name}.gguf"), seed=1, progress=False, **kw)
        files = sorted(os.path.join(d, f) for f in os.listdir(d))
        out[name] = [str(first)] + [f for f in files if f != str(first)]
    return out


def fuzz_one(seeds: dict[str, list[str]], index: int, seed: int, work: str, *, oracle: bool) -> dict:
    names = sorted(seeds)
    seed_name = names[index % len(names)]
    kind = KINDS[(index // len(names)) % len(KINDS)]
    rng = np.random.default_rng([seed, index])
    d = os.path.join(work, f"m{index}")
    os.makedirs(d, exist_ok=True)
    try:
        path, desc = mutate(seeds[seed_name], kind, rng, d)
        rec = {"index": index, "seed": seed_name, "kind": kind, "desc": desc}
        rec["refengine"] = run_bounded(run_refengine, path)
        if oracle:
            rec["llamacpp"] = run_bounded(run_llamacpp, path)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rec


def campaign(n: int, *, seed: int = 0, seeds: dict | None = None, oracle: bool = True, progress: bool = False,
             out=None, start: int = 0, step: int = 1) -> list[dict]:
    """Mutants start, start+step, ... below n; returns their records (and writes JSON lines to `out`)."""
    from tqdm import tqdm
    if oracle:
        llamacpp_setup()
    from ..model import Model  # noqa: F401  (imported before forking, so children start warm)
    tmp = tempfile.mkdtemp(prefix="refengine-fuzz-")
    try:
        seeds = seeds or make_seeds(os.path.join(tmp, "seeds"))
        recs = []
        for i in tqdm(range(start, n, step), desc="fuzz", unit="mutant", disable=not progress):
            rec = fuzz_one(seeds, i, seed, tmp, oracle=oracle)
            recs.append(rec)
            if out is not None:
                out.write(json.dumps(rec) + "\n")
                out.flush()
        return recs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- tables

def accepts(rec: dict) -> bool:
    return rec["refengine"]["outcome"] in ("ran", "warned")


def outcome_table(recs: list[dict]) -> str:
    by = defaultdict(Counter)
    for r in recs:
        by[r["kind"]][r["refengine"]["outcome"]] += 1
        by["(all)"][r["refengine"]["outcome"]] += 1
    peak = max((r["refengine"].get("peak_mb", 0) for r in recs), default=0)
    rows = ["| kind | mutants | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 2) + "|"]
    for k in [*KINDS, "(all)"]:
        if k in by:
            c = by[k]
            rows.append(f"| {k} | {sum(c.values())} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    return "\n".join(rows) + f"\n\nPeak RSS of any refengine child: {peak:.0f} MB (the fork's inherited pages included)."


def differential_table(recs: list[dict]) -> str:
    by = defaultdict(Counter)
    for r in recs:
        if "llamacpp" not in r:
            continue
        lo = r["llamacpp"]["outcome"]
        la = "accepts" if lo == "accepted" else "refuses" if lo == "refused" else lo
        ra = "runs" if accepts(r) else "refuses"
        if r["refengine"]["outcome"] == "warned":
            ra = "runs, says llama.cpp refuses"
        by[r["kind"]][(la, ra)] += 1
        by["(all)"][(la, ra)] += 1
    cols = [("accepts", "runs"), ("refuses", "refuses"), ("refuses", "runs, says llama.cpp refuses"),
            ("accepts", "refuses"), ("refuses", "runs")]
    extra = sorted({c for k in by for c in by[k]} - set(cols))
    cols += extra
    head = " | ".join(f"llama.cpp {a} / refengine {b}" for a, b in cols)
    rows = [f"| kind | mutants | agree | {head} |", "|---" * (len(cols) + 3) + "|"]
    for k in [*KINDS, "(all)"]:
        if k in by:
            c = by[k]
            agree = c[("accepts", "runs")] + c[("refuses", "refuses")]
            rows.append(f"| {k} | {sum(c.values())} | {agree} | " + " | ".join(str(c[x]) for x in cols) + " |")
    return "\n".join(rows)


def reader_table(recs: list[dict]) -> str:
    """The GGUF reader alone: ggml's gguf_init_from_file against refengine's reader (a GGUFError)."""
    by = defaultdict(Counter)
    for r in recs:
        if "llamacpp" not in r or r["llamacpp"]["outcome"] not in ("accepted", "refused"):
            continue
        g = "refuses" if r["llamacpp"].get("stage") == "gguf" and r["llamacpp"]["outcome"] == "refused" else "reads"
        mine = "refuses" if r["refengine"].get("reader") else "reads"
        by[r["kind"]][(g, mine)] += 1
        by["(all)"][(g, mine)] += 1
    cols = [("reads", "reads"), ("refuses", "refuses"), ("reads", "refuses"), ("refuses", "reads")]
    rows = ["| kind | " + " | ".join(f"ggml {a} / refengine {b}" for a, b in cols) + " |", "|---" * 5 + "|"]
    for k in [*KINDS, "(all)"]:
        if k in by:
            rows.append(f"| {k} | " + " | ".join(str(by[k][c]) for c in cols) + " |")
    return "\n".join(rows)


def _cause(r: dict) -> tuple[str, str]:
    """(direction, cause) of a disagreement: refengine's error class when it refuses, else llama.cpp's reason
    with paths, numbers and quoted names blanked, so that one cause is one row."""
    la, ro = r["llamacpp"], r["refengine"]
    if accepts(r):
        how = "llama.cpp aborts / refengine runs" if la["outcome"] == "crash" else "llama.cpp refuses / refengine runs"
        how += ", says so" if ro["outcome"] == "warned" else ", silently"
        why = la["msg"] if la["outcome"] != "crash" else la["msg"]             # "killed by SIGABRT"
        if ro["outcome"] == "warned":                                         # refengine's note, quoting llama.cpp
            why = ro["msg"].split("refuses this file: ")[-1].split("llama.cpp refuses the file: ")[-1]
    else:
        how = "llama.cpp " + {"accepted": "accepts", "crash": "aborts", "hang": "hangs"}.get(la["outcome"], "refuses") \
            + " / refengine refuses"
        why = ro.get("error", ro["outcome"])
    why = re.sub(r"key \S+ has wrong type \S+ but expected type \S+", "key K has wrong type T but expected type T'", why)
    why = re.sub(r"(wrong number of tensors\"\)): .*", r"\1: ...", why)
    why = re.sub(r"^\S+\.gguf: ", "", re.sub(r"(^|\s)/\S+/", r"\1", why))
    why = re.sub(r"'[^']*'", "'…'", why)
    why = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "N", why)
    return how, why[:110]


def disagreement_table(recs: list[dict]) -> str:
    """Every mutant where llama.cpp and refengine do not give the same verdict, refengine runs with a note, or
    llama.cpp aborts."""
    rows = defaultdict(list)
    for r in recs:
        if "llamacpp" not in r:
            continue
        agree = ((r["llamacpp"]["outcome"] == "accepted") == accepts(r) and r["refengine"]["outcome"] != "warned"
                 and r["llamacpp"]["outcome"] in ("accepted", "refused"))     # an abort is listed too
        if not agree:
            rows[_cause(r)].append(r)
    out = ["| direction | cause | mutants | kinds | example |", "|---|---|---|---|---|"]
    for (how, why), rs in sorted(rows.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        kinds = ", ".join(sorted({r["kind"] for r in rs}))
        ex = rs[0]["desc"].replace("|", "/")[:60]
        out.append(f"| {how} | {why.replace('|', '/')} | {len(rs)} | {kinds} | {ex} |")
    return "\n".join(out)


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    from . import __doc__ as package_doc
    p = argparse.ArgumentParser(prog="python -m refengine.fuzz", description=package_doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Seeds: " + ", ".join(SEEDS) + ". Kinds: " + ", ".join(KINDS) + ".")
    p.add_argument("-n", type=int, default=200, help="number of mutants (default 200)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--no-oracle", action="store_true", help="skip the llama.cpp column")
    p.add_argument("--out", default=None, help="write one JSON line per mutant here")
    p.add_argument("--table", default=None, help="write the markdown tables here")
    p.add_argument("--from-jsonl", default=None, help="only tabulate an earlier --out file")
    p.add_argument("-q", "--quiet", action="store_true")
    a = p.parse_args(argv)
    t0 = time.time()
    if a.from_jsonl:
        recs = [json.loads(line) for line in open(a.from_jsonl)]
    else:
        recs = _parallel(a)
    bad = [r for r in recs if r["refengine"]["outcome"] in ("untyped", "crash", "hang", "memory")]
    text = (f"{len(recs)} mutants, seed {a.seed}, {time.time() - t0:.0f} s\n\n## Outcomes\n\n{outcome_table(recs)}\n\n"
            f"## Differential (llama.cpp's loader)\n\n{differential_table(recs)}\n\n"
            f"## The GGUF reader alone (ggml's gguf_init_from_file)\n\n{reader_table(recs)}\n\n## Disagreements by cause\n\n"
            + disagreement_table(recs) + "\n\n## Failures\n\n"
            + ("\n".join(f"- #{r['index']} {r['seed']} {r['kind']} ({r['desc']}): {r['refengine']}" for r in bad[:50])
               or "none") + "\n")
    if a.table:
        open(a.table, "w").write(text)
    print(text)
    return 1 if bad else 0


def _parallel(a) -> list[dict]:
    out = open(a.out, "w") if a.out else None
    if a.jobs <= 1:
        recs = campaign(a.n, seed=a.seed, oracle=not a.no_oracle, progress=not a.quiet, out=out)
    else:
        import multiprocessing as mp
        tmp = tempfile.mkdtemp(prefix="refengine-fuzz-seeds-")
        seeds = make_seeds(tmp)
        ctx = mp.get_context("fork")
        parts = [os.path.join(tmp, f"part{j}.jsonl") for j in range(a.jobs)]
        procs = [ctx.Process(target=_worker, args=(a, seeds, j, parts[j])) for j in range(a.jobs)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
        recs = sorted((json.loads(line) for f in parts for line in open(f)), key=lambda r: r["index"])
        if out:
            for r in recs:
                out.write(json.dumps(r) + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
    if out:
        out.close()
    return recs


def _worker(a, seeds, j, path):
    with open(path, "w") as f:
        campaign(a.n, seed=a.seed, seeds=seeds, oracle=not a.no_oracle, progress=not a.quiet and j == 0,
                 out=f, start=j, step=a.jobs)


if __name__ == "__main__":
    sys.exit(main())
