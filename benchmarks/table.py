"""Issue 23's one-session table from a lease's raw output: ours (graph_ARCH.json) beside llama.cpp (llamabench.md).

    python benchmarks/table.py DIR [DIR ...] [--checks DIR] [--json out.json]

Each DIR is what `gpu_session.sh` stage `graphll` left (the calls' $OUT, unpacked): `graph_ARCH.json` per cut
(`benchmarks/graph_decode.py FILE --decode N --prefill 512`) and `llamabench.md` (`llama-bench -p 512 -n 32 -fa 1
-ngl 99` on the same files, one table per file, its model column starting with the file's arch). `--checks`: the
`benchmarks/check_logits.py --json` records (`check_ARCH.json`), GPU == CPU on the same files. Prints the Markdown
table BENCHMARKS.md leads with: decode per token (the graph's median replay, its GPU time) against llama.cpp's
tg32 per token, prefill-512 against llama.cpp's pp512, their ratios, and the GPU == CPU verdict.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

ROW = re.compile(r"^\|\s*(?P<model>[^|]+?)\s*\|.*\|\s*(?P<test>pp\d+|tg\d+)\s*\|"      # a llama-bench row:
                 r"\s*(?P<tps>[\d.]+)(?:\s*±\s*[\d.]+)?\s*\|")                       # model ... test | t/s


def llama_bench(path: str) -> dict:
    """llamabench.md -> {arch: {"pp512": ms for the 512 tokens, "tg32": ms a token}} (the model column's first word
    is the GGUF arch; the last table of an arch wins)."""
    out: dict = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line.strip())
            if not m:
                continue
            arch, test, tps = m["model"].split()[0], m["test"], float(m["tps"])
            n = int(test[2:])
            out.setdefault(arch, {})[test] = 1e3 * n / tps if test.startswith("pp") else 1e3 / tps
    return out


DASHED = ("glm-dsa", "kimi-linear", "kimi-k3", "glm5-next")      # arch names with a dash in them


def split_cut(model_path: str):
    """`.../kimi-k3-kimi-k3-L3-full_attn=2.gguf` -> (arch, preset, layers, extra or None): the graphll file name,
    ARCH-PRESET-L<layers>[-KEY=VALUE]; None for another name."""
    stem = os.path.basename(model_path).removesuffix(".gguf")
    arch = next((a for a in DASHED if stem.startswith(a + "-")), stem.split("-")[0])
    m = re.match(r"(?P<preset>.+)-L(?P<layers>\d+)(?:-(?P<x>.+))?$", stem[len(arch) + 1:])
    return (arch, m["preset"], int(m["layers"]), m["x"]) if m else None


def cut_label(model_path: str) -> str:
    """"deepseek2 (`deepseek-v3`, 2)" for `deepseek2-deepseek-v3-L2.gguf` (the file's name if not graphll's)."""
    c = split_cut(model_path)
    if c is None:
        return os.path.basename(model_path)
    arch, preset, layers, x = c
    return f"{arch} (`{preset}`, {layers}{', ' + x if x else ''})"


def rows(dirs, checks: str | None = None) -> list[dict]:
    ll: dict = {}
    recs = []
    for d in dirs:
        for p in sorted(glob.glob(os.path.join(d, "**", "llamabench.md"), recursive=True)):
            for arch, v in llama_bench(p).items():
                ll.setdefault(arch, {}).update(v)
        for p in sorted(glob.glob(os.path.join(d, "**", "graph_*.json"), recursive=True)):
            with open(p) as f:
                r = json.load(f)
            if isinstance(r, dict) and "graph_ms" in r:
                recs.append(r)
    out = []
    for r in recs:
        c = split_cut(r["model"])
        arch = c[0] if c else os.path.basename(r["model"]).split("-")[0]
        lb = ll.get(arch, {})
        row = dict(arch=arch, cut=cut_label(r["model"]), decode_ms=r["graph_ms"], gpu_ms=r.get("graph_gpu_ms"),
                   ll_tg_ms=lb.get("tg32"), prefill_ms=r.get("prefill_ms"), ll_pp_ms=lb.get("pp512"))
        row["decode_ratio"] = row["decode_ms"] / row["ll_tg_ms"] if row["ll_tg_ms"] else None
        row["prefill_ratio"] = row["prefill_ms"] / row["ll_pp_ms"] if row["ll_pp_ms"] and row["prefill_ms"] else None
        if checks:
            cp = os.path.join(checks, f"check_{arch}.json")
            if os.path.exists(cp):
                with open(cp) as f:
                    c = json.load(f)
                row["gpu_cpu"] = ("ok" if c["ok"] else "FAIL") + f" (rel-RMS <= {max(c['rel_rms']):.1e})"
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)            # noqa: E731
    lines = ["| arch (file: preset, blocks) | decode (graph) | its GPU time | llama.cpp tg32 | **decode ratio** | "
             "prefill-512 | llama.cpp pp512 | **prefill ratio** | GPU == CPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['cut']} | {f(r['decode_ms'], '.3f')} ms | {f(r['gpu_ms'], '.3f')} ms | "
                     f"{f(r['ll_tg_ms'], '.3f')} ms | **{f(r['decode_ratio'], '.2f')}x** | "
                     f"{f(r['prefill_ms'], '.1f')} ms | {f(r['ll_pp_ms'], '.2f')} ms | "
                     f"**{f(r['prefill_ratio'], '.2f')}x** | {r.get('gpu_cpu', 'not checked')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--checks", default=None, help="a folder of check_logits.py --json records (check_ARCH.json)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    table = rows(a.dirs, a.checks)
    if not table:
        ap.error(f"no graph_*.json with a decode time under {', '.join(a.dirs)}")
    print(markdown(table))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(table, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
