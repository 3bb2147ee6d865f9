"""The GPU expert cache (issue 24) at several budgets: logits against the fully resident run, decode speed, hit rate.

    python benchmarks/expert_cache.py MODEL.gguf [--budgets 0.125,0.25,0.5,1] [--policy lru] [--prompt 16]
                                      [--decode 64] [--tokens random|greedy] [--no-reference] [--json out.json]
                                      [--save-reference R.npz | --reference R.npz] [--backend cuda] [--prefetch]
    python benchmarks/expert_cache.py --arch kimi-k3 --preset kimi-k3 --layers 3 --type Q2_K [--dir /tmp]
                                      (a random-weight cut of the published shapes, refengine.cuda.randmodel)

For each budget (a fraction of the routed-expert bytes, or bytes: "8GiB") a fresh `Runtime(expert_budget=
ExpertCache.for_model(...))` runs the prompt, then `--decode` tokens one at a time, and each step's logits are
compared with the reference's bit for bit. The decode tokens are fixed in advance (teacher forcing: every budget sees
the same routing input): `--tokens random` (the default) draws them at random, seeded, so that each step routes
afresh as text does; `--tokens greedy` takes the reference's argmax, which a random-weight model turns into a loop of
one token (the same experts every step: the hit rate then measures only the first touches). The reference is the
resident run without a budget, so only the expert addressing differs; it needs every expert on the GPU:
`--no-reference` for a model larger than the GPU (then only the budgeted runs, no check). `--save-reference R.npz`
writes the reference's tokens and logits, `--reference R.npz` compares with them instead of running it: one process
per budget (the peak each reports is then its own, with no earlier run's allocations in the process).

Reported per budget: slots, decode tokens/s (synchronised), hit rate, misses per token (prompt included), bytes moved
host->device, seconds in the loader (the time stalled on misses: copies from the pageable mmap are synchronous),
and the peak device memory in use (cudaMemGetInfo after every step, minus the figure before the model was opened:
measured, not computed) beside its bound: the budget plus the bytes of the file that are not routed experts (the
resident part's weights). `--backend numpy` runs the same on the "sim" device (a dry run without a GPU).
`--prefetch` builds the budgeted caches with prefetch (refengine/expert_prefetch.py: the next MoE layer's guessed
experts copied on a worker thread) and adds its counters: experts prefetched, of those used, seconds the copies took
in the background and seconds a batch waited for one.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np

from refengine.expert_cache import ExpertCache
from refengine.model import Model
from refengine.runtime import Runtime


def sync(rt: Runtime) -> None:
    if rt.device is not None and rt.device.kind == "cupy":
        rt.device.xp.cuda.Device().synchronize()


def used_bytes(rt: Runtime) -> int:
    """Device memory in use now (every allocator: CuPy's pool and numba's arrays alike), 0 off the GPU."""
    if rt.device is None or rt.device.kind != "cupy":
        return 0
    free, total = rt.device.xp.cuda.runtime.memGetInfo()
    return int(total - free)


def free_device(rt: Runtime) -> None:
    """Drop the whole-tensor device copies a run left (the reference's experts), so the next peak is its own."""
    gc.collect()                     # the finished run's slot pool and state, unreferenced by now
    if rt.device is None or rt.device.kind != "cupy":
        return
    from numba import cuda

    from quant.cuda import weights
    weights.clear()
    cuda.current_context().deallocations.clear()
    rt.device.xp.get_default_memory_pool().free_all_blocks()


def run(model: Model, rt: Runtime, prompt, decode, tokens=None, base: int = 0):
    """Prompt, then `decode` single-token steps (the given tokens, else greedy): (logits per step, tokens, decode
    seconds, peak device bytes above `base`)."""
    st = model.new_state()
    out = [model.forward(prompt, st, rt=rt)[-1:]]
    peak = used_bytes(rt)
    toks = [] if tokens is None else list(tokens)
    sync(rt)
    t0 = time.perf_counter()
    for i in range(decode):
        if tokens is None:
            toks.append(int(np.argmax(out[-1][-1])))
        out.append(model.forward([toks[i]], st, rt=rt))
        peak = max(peak, used_bytes(rt))
    if rt.expert_cache is not None:
        rt.expert_cache.wait()                   # a prefetch's copies still in flight
    sync(rt)
    return out, toks, time.perf_counter() - t0, max(0, peak - base)


def table_head(prefetch: bool) -> str:
    pf = " prefetched | used | s copying (bg) | s waited |" if prefetch else ""
    return ("| budget | slots | decode tok/s | hit rate | GB moved | s loading | peak GiB | budget + rest GiB | "
            "= resident |" + pf + "\n|---|---|---|---|---|---|---|---|---|" + "---|" * pf.count("|"))


def table_row(r: dict) -> str:
    """One budget's figures as the cells of the closing table (after its budget cell): printed as each run ends
    and again in the table."""
    pf = r["prefetch"]
    return (f"| {r['slots']} | {r['decode_tok_s']:.2f} | {r['hit_rate']:.3f} | {r['bytes_moved'] / 1e9:.2f} | "
            f"{r['load_seconds']:.2f} | {r['peak_bytes'] / 2**30:.2f} | {r['bound_bytes'] / 2**30:.2f} | "
            f"{r['bit_identical']} |"
            + ("" if pf is None else f" {pf['experts']} | {pf['used']} | {pf['seconds']:.2f} | "
               f"{pf['wait_seconds']:.2f} |"))


def budget_arg(s: str):
    try:
        return float(s)
    except ValueError:
        return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="a GGUF (else one is written: --arch/--preset/--layers)")
    ap.add_argument("--arch", default="kimi-k3")
    ap.add_argument("--preset", default="kimi-k3")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--type", default="Q2_K")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--budgets", default="0.125,0.25,0.5,1.0", help="comma-separated fractions or byte sizes")
    ap.add_argument("--policy", default="lru", choices=("lru", "lfu", "decay"))
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--ubatch", type=int, default=None, help="n_ubatch (a small one lets small budgets take the "
                    "prompt: one batch's distinct experts of a layer must fit)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--tokens", default="random", choices=("random", "greedy"),
                    help="the decode tokens: drawn at random (seeded) or the reference's argmax")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--save-reference", default=None, help="write the reference's tokens and logits (.npz)")
    ap.add_argument("--reference", default=None, help="compare with a saved reference instead of running it")
    ap.add_argument("--prefetch", action="store_true", help="the budgeted caches prefetch the next MoE layer's "
                    "guessed experts (ExpertCache.for_model(prefetch=True))")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    path = a.model
    if path is None:
        from refengine.cuda.randmodel import write_random_model
        path = os.path.join(a.dir, f"{a.arch}-{a.preset}-L{a.layers}-{a.type}-random.gguf")
        if not os.path.exists(path):
            write_random_model(path, a.type, a.layers, arch=a.arch, preset=a.preset)
    probe = Runtime(backend=a.backend, resident=True)
    base = used_bytes(probe)
    model = Model(path, **({"n_ubatch": a.ubatch} if a.ubatch else {}))
    geo = ExpertCache.for_model(model, 1.0).geometry
    rest = os.path.getsize(path) - geo.expert_bytes          # everything else in the file: the resident part's bound
    print(f"model {path}: {os.path.getsize(path) / 1e9:.2f} GB, routed experts {geo.expert_bytes / 1e9:.2f} GB "
          f"({len(geo.layers)} layers x {geo.n_expert}), slot {geo.slot_bytes / 2**20:.2f} MiB, the rest of the "
          f"file {rest / 2**30:.2f} GiB", flush=True)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.prompt)]
    tokens = [int(t) for t in rng.integers(0, model.cfg.n_vocab, a.decode)] if a.tokens == "random" else None
    ref = None
    if a.reference:
        z = np.load(a.reference)
        ref, tokens = [z[f"step{i}"] for i in range(a.decode + 1)], [int(t) for t in z["tokens"]]
    elif not a.no_reference:
        rt = Runtime(backend=a.backend, resident=True)
        run(model, rt, prompt, 1)                                           # warm-up: uploads, kernel compiles
        ref, tokens, secs, peak = run(model, rt, prompt, a.decode, tokens=tokens, base=base)
        print(f"resident: decode {a.decode / secs:.2f} tokens/s, peak {peak / 2**30:.2f} GiB", flush=True)
        if a.save_reference:
            np.savez(a.save_reference, tokens=np.asarray(tokens), **{f"step{i}": x for i, x in enumerate(ref)})
        del rt
        free_device(probe)
    rows = []
    print(table_head(a.prefetch).splitlines()[0], flush=True)       # each budget's row as its run ends
    for b in a.budgets.split(","):
        if ref is None or a.reference:       # no reference run in this process: a warm-up (kernel compiles) first,
            warm = Runtime(backend=a.backend, resident=True,          # with a cache of its own, then dropped
                           expert_budget=ExpertCache.for_model(model, budget_arg(b), policy=a.policy,
                                                               prefetch=a.prefetch))
            run(model, warm, prompt, 1, tokens=tokens)
            if a.prefetch:
                warm.expert_cache.prefetcher.close()
            del warm
            free_device(probe)
        cache = ExpertCache.for_model(model, budget_arg(b), policy=a.policy, prefetch=a.prefetch)
        rt = Runtime(backend=a.backend, expert_budget=cache, resident=True)
        out, toks, secs, peak = run(model, rt, prompt, a.decode, tokens=tokens, base=base)
        same = None if ref is None else all(np.array_equal(x, y) for x, y in zip(ref, out))
        d = cache.as_dict()
        row = dict(budget=b, budget_bytes=d["budget_bytes"], slots=d["n_slots"], policy=a.policy,
                   decode_tok_s=a.decode / secs, hit_rate=d["hit_rate"], bytes_moved=d["bytes_moved"],
                   load_seconds=d["load_seconds"], misses_per_token=d["misses"] / max(1, d["tokens"]),
                   peak_bytes=peak, bound_bytes=d["budget_bytes"] + rest, bit_identical=same,
                   prefetch=d["prefetch"], layers=d["layers"])
        rows.append(row)
        print(f"| {b} " + table_row(row), flush=True)
        if cache.prefetcher is not None:
            cache.prefetcher.close()
        del rt, cache
        free_device(probe)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=path, rest_of_file_bytes=rest, prompt=a.prompt, decode=a.decode, tokens=a.tokens,
                           rows=rows), f, indent=1, default=str)
    print("\n" + table_head(a.prefetch))
    for r in rows:
        print(f"| {r['budget']} " + table_row(r))
    return 0 if all(r["bit_identical"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
