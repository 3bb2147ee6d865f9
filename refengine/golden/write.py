"""`refengine golden`: the reference's per-layer outputs and logits, in files other engines read.

    make_golden("model.gguf", tokens, "golden/")   ->  golden/
        tensors.safetensors   every named intermediate (llama.cpp's graph names, NumPy order = reversed
                              ggml ne, so the flat bytes equal what llama.cpp's eval callback sees) + `logits`
        manifest.json         the model file (name, size, sha256), arch, tokens, mode, backend, versions,
                              per tensor: shape, dtype and the tolerance it is held to
        results.gguf          llama.cpp's `llama-results` file (`llama-results --check` reads it)
        logits.kld            llama.cpp's `llama-perplexity --kl-divergence-base` file (one chunk: the tokens)

Over a corpus (`golden --file TEXT --ctx N --chunks K`): `make_golden_corpus` in corpus.py, a K-chunk logits.kld.

A name llama.cpp gives to several tensors of one layer (deepseek2's `q-0`) holds the last one; the earlier
ones are kept as `NAME#0`, `NAME#1`, ... in the order computed (`Trace.earlier`).
Tolerances are `refengine.compare`'s table: NMSE per tensor by the weight types and the mode; expert ids
(`ffn_moe_topk`, `ffn_moe_argsort`, `ffn_moe_group_topk`) are compared as sets, near-ties reported.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import platform
import time
from importlib import metadata as importlib_metadata

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError
from ..trace import Trace
from .formats import write_kld_base, write_llama_results, write_safetensors

TENSORS_FILE = "tensors.safetensors"
MANIFEST_FILE = "manifest.json"
RESULTS_FILE = "results.gguf"
KLD_FILE = "logits.kld"
FORMAT_VERSION = 1
ID_TENSORS = ("ffn_moe_topk", "ffn_moe_argsort", "ffn_moe_group_topk")
ID_RULE = ("expert ids compared as sets per token; a difference where the reference's k-th and (k+1)-th "
           "scores are within the measured probability error is a near-tie: reported, not failed")


class _ProgressTrace(Trace):
    """A Trace that advances a progress bar the first time each layer index shows up."""

    def __init__(self, names, bar):
        super().__init__(names)
        self.bar, self.seen = bar, set()

    def __call__(self, name, il, value):
        super().__call__(name, il, value)
        if il not in self.seen:
            self.seen.add(il)
            self.bar.update(1)


def base_name(name: str) -> str:
    """`l_out-3` -> `l_out`; `result_norm` -> `result_norm`; `q-0#1` -> `q`."""
    name = name.split("#")[0]
    base, _, il = name.rpartition("-")
    return base if il.isdigit() else name


def sha256_file(paths: list[str], progress: bool = False) -> str:
    """sha256 over the bytes of every shard in order (one shard: the file's sha256)."""
    h = hashlib.sha256()
    total = sum(os.path.getsize(p) for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc="sha256", disable=not progress or total < 1 << 28) as bar:
        for p in paths:
            with open(p, "rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
                    bar.update(len(chunk))
    return h.hexdigest()


def versions() -> dict:
    def v(pkg):
        try:
            return importlib_metadata.version(pkg)
        except importlib_metadata.PackageNotFoundError:
            return None
    from .. import __version__
    lcp = v("llama-cpp-python")
    return {"refengine": __version__, "llama-cpp-python": lcp,
            "llama.cpp": f"vendored in llama-cpp-python {lcp}" if lcp else None,
            "numpy": np.__version__, "gguf": v("gguf"), "python": platform.python_version()}


def select(names, spec: str) -> list[str]:
    """--tensors: `all`, `logits` (none of the intermediates), or comma-separated glob patterns."""
    if spec == "all":
        return list(names)
    if spec == "logits":
        return []
    pats = [p.strip() for p in spec.split(",") if p.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(base_name(n), p) for p in pats)]


def expert_record(rt) -> dict | None:
    """The manifest's `experts` (issue 24): the expert cache's counters and the routing trace's size, when the run
    had either."""
    out = {}
    if getattr(rt, "expert_cache", None) is not None:
        rt.expert_cache.wait()                    # a prefetch's copies in flight, counted
        out["cache"] = rt.expert_cache.as_dict()
    if getattr(rt, "expert_stats", None) is not None:
        out["routing"] = {"expert_calls": len(rt.expert_stats.calls), "tokens": rt.expert_stats.tokens()}
    return out or None


def model_record(model, progress: bool = False) -> dict:
    """The manifest's `model`: file name, shards, size, sha256, arch and the sizes a reader checks first."""
    from ..compare import matmul_weight_types, weight_class
    cfg, types = model.cfg, matmul_weight_types(model)
    shards = [s.path for s in model.gf.shards]
    return {"file": os.path.basename(model.path), "shards": [os.path.basename(p) for p in shards],
            "size": int(sum(os.path.getsize(p) for p in shards)),
            "sha256": sha256_file(shards, progress), "arch": cfg.arch, "name": cfg.name,
            "n_layer": cfg.n_layer, "n_vocab": cfg.n_vocab, "n_embd": cfg.n_embd,
            "weight_types": sorted(t.name for t in types), "weight_class": weight_class(types)}


def make_golden(path, tokens, out_dir, *, mode: str = "exact", backend: str = "numpy", tensors: str = "all",
                progress: bool = False, model=None, path_model: str | None = None, qsa_rule: str = "authors",
                n_ubatch: int | None = None, runtime_kw: dict | None = None) -> dict:
    """Run the reference on `tokens` (one prefill) and write the golden directory; returns the manifest.

    n_ubatch: the prefill runs as successive ubatches of this many tokens (Model.forward); the intermediates are
    then the first ubatch's, the logits every position's. None: one batch, every intermediate the whole batch's.

    path_model: the string stored as `path_model` in results.gguf, which `llama-results --check` compares with
    its `-m` argument byte for byte (default: `path` as given). qsa_rule: QSA's selection rule (qwen4exp;
    attention/qsa.py), recorded in the manifest. runtime_kw: more Runtime arguments (the expert cache's
    `expert_budget` / `expert_stats`: their counters go into the manifest's `experts`)."""
    from ..compare import matmul_weight_types, tolerance
    from ..model import Model
    from ..runtime import Runtime
    t0 = time.perf_counter()
    model = model or Model(path)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    os.makedirs(out_dir, exist_ok=True)
    cfg = model.cfg
    bar = tqdm(total=cfg.n_layer + 1, unit="layer", desc=f"golden {os.path.basename(model.path)}",
               disable=not progress)
    trace = _ProgressTrace(set() if tensors == "logits" else None, bar)   # logits only: nothing kept (blocked attention)
    rt = Runtime(mode=mode, backend=backend, trace=trace, qsa_rule=qsa_rule, **(runtime_kw or {}))
    ub = min(int(n_ubatch or tokens.size), tokens.size)
    logits = model.forward(tokens, rt=rt, n_ubatch=ub)                           # [T, V]
    bar.close()
    t_run = time.perf_counter() - t0

    types = matmul_weight_types(model)
    tol = tolerance(types, mode)
    out: dict[str, np.ndarray] = {}
    for name in select(trace.tensors, tensors):
        for k, a in enumerate(trace.earlier.get(name, [])):
            out[f"{name}#{k}"] = a
        out[name] = trace.tensors[name]
    out = {k: (np.asarray(v, dtype=np.int32) if np.issubdtype(np.asarray(v).dtype, np.integer)
               else np.asarray(v, dtype=np.float32)) for k, v in out.items()}
    out["logits"] = np.asarray(logits, dtype=np.float32)
    if not np.all(np.isfinite(out["logits"])):
        raise ConfigError(f"{model.path}: the logits hold NaN/inf; no golden written")

    manifest = {
        "format": f"refengine-golden {FORMAT_VERSION}",
        "model": model_record(model, progress),
        "tokens": [int(t) for t in tokens],
        "mode": mode, "backend": backend, "tensors": tensors, "qsa_rule": qsa_rule,
        "n_ctx": model.n_ctx, "n_ubatch": ub,
        "intermediates_rows": [0, ub],        # the token rows the intermediates cover (the first ubatch)
        "versions": versions(),
        "tolerance": {"nmse": tol, "table": "refengine.compare: F32 1e-8, F16 1e-5, BF16 1e-3, quantized 1e-2 "
                      "(exact mode); 1e-7 for every class in llamacpp mode (F32 1e-8)"},
        "names": "llama.cpp graph names (cb(cur, NAME, il) -> NAME-il); NumPy order = reversed ggml ne; "
                 "NAME#k = the k-th earlier tensor of a reused name; `logits` = [T, V] (result_output)",
        "files": {"tensors": TENSORS_FILE, "llama_results": RESULTS_FILE, "kld_base": KLD_FILE},
        "order": list(out),
        "tensor_table": {n: {"shape": list(a.shape), "dtype": str(a.dtype),
                             "tolerance": ID_RULE if base_name(n) in ID_TENSORS else tol} for n, a in out.items()},
    }
    t1 = time.perf_counter()
    size = write_safetensors(os.path.join(out_dir, TENSORS_FILE), out,
                             {"format": manifest["format"], "arch": cfg.arch, "model_sha256": manifest["model"]["sha256"]})
    write_llama_results(os.path.join(out_dir, RESULTS_FILE), tokens, out["logits"], path_model or os.fspath(path or model.path))
    manifest["llama_results"] = {"path_model": path_model or os.fspath(path or model.path),
                                 "check": f"llama-results -m {path_model or os.fspath(path or model.path)} -p PROMPT "
                                          f"-o {RESULTS_FILE} --check -ctk f32 -ctv f32 -fa off "
                                          "(PROMPT must tokenize to `tokens`; -m must equal path_model)"}
    if len(tokens) >= 3:
        write_kld_base(os.path.join(out_dir, KLD_FILE), tokens, out["logits"])
        manifest["kld_base"] = {"n_ctx": len(tokens), "n_chunk": 1, "scored_positions": [len(tokens) // 2, len(tokens) - 2],
                                "check": f"llama-perplexity -m MODEL --kl-divergence-base {KLD_FILE} --kl-divergence "
                                         f"-c {len(tokens)} -b {len(tokens)} -ctk f32 -ctv f32 -fa off "
                                         "(llama.cpp replaces the first token by BOS when the vocabulary adds one)"}
        bos = model.gf.get("tokenizer.ggml.bos_token_id")
        if model.gf.get("tokenizer.ggml.add_bos_token") and bos is not None and int(tokens[0]) != int(bos):
            manifest["kld_base"]["warning"] = (f"the vocabulary adds BOS ({bos}) but tokens[0] = {int(tokens[0])}: "
                                               "llama-perplexity evaluates BOS at position 0, these logits did not")
    else:
        manifest["files"]["kld_base"] = None
    if expert_record(rt):
        manifest["experts"] = expert_record(rt)
    manifest["timing_s"] = {"forward": round(t_run, 3), "write": round(time.perf_counter() - t1, 3)}
    manifest["bytes"] = {"tensors": size}
    with open(os.path.join(out_dir, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest
