"""`refengine` command line: synth, compare, run, quantize, info, golden, check, lint, conformance.

Exit status: 0 success / match, 1 divergence from llama.cpp, 2 bad input (the message names the
file, tensor or key at fault).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

from quant import QuantError, UnknownTypeError

from .errors import ConfigError, RefengineError

DEFAULT_ARCH = "qwen3moe"
CORPUS_CTX_DEFAULT = 512              # golden --file without --ctx: llama-perplexity's default -c
QSA_RULES = ("authors", "llamacpp")    # refengine.attention.qsa.RULES (not imported here: the CLI loads lazily)


def _tokens(s: str) -> list[int]:
    try:
        return [int(t) for t in s.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens wants comma-separated integers, got {s!r}") from None


def _input_tokens(args, model) -> list[int]:
    if args.tokens is not None and args.prompt is not None:
        raise RefengineError("give either --tokens or --prompt, not both")
    if args.tokens is not None:
        return args.tokens
    if args.prompt is not None:
        from .tokenizer import Tokenizer
        return Tokenizer(model.path, model.gf).encode(args.prompt)
    rng = np.random.default_rng(0)                        # a fixed default input
    return rng.integers(0, model.cfg.n_vocab, size=16).tolist()


def _positive(flag: str):
    """argparse type: an integer >= 1 (`--ubatch`, `--ctx`), refused by argparse with the flag named."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"{flag} {s}: wants an integer >= 1")
        return v
    return parse


def _ubatch_kw(args) -> dict:
    return {} if args.ubatch is None else {"n_ubatch": args.ubatch}


# ---------------------------------------------------------------- commands

def cmd_synth(args) -> int:
    from .synth import write_synth
    out = write_synth(args.arch, args.output, preset=args.preset, wtype=args.type, seed=args.seed,
                      all_optional=args.all_optional, fused_qkv=args.fused_qkv, tied_output=args.tied_output,
                      layers=args.layers, shards=args.shards, progress=not args.quiet,
                      rope_scaling=args.rope_scaling)
    print(out)
    return 0


def cmd_compare(args) -> int:
    from .compare import format_report, run_compare
    from .model import Model
    path = args.file
    tmp = None
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="refengine-")
        from .synth import write_synth
        path = write_synth(DEFAULT_ARCH, os.path.join(tmp.name, f"{DEFAULT_ARCH}-tiny.gguf"), preset="tiny")
        if not args.json:
            print(f"no FILE given: comparing a synthetic {DEFAULT_ARCH} (tiny preset, F32, seed 0) written to {path}\n")
    try:
        model = Model(path, n_ctx=args.ctx)
        tokens = _input_tokens(args, model)
        if args.against == "transformers":                       # the second oracle: the authors' code
            return _compare_authors(args, model, tokens, None if tmp is not None else path)
        explain = None
        if args.mode == "llamacpp" and not args.local:          # the flip census and, over tolerance, its proof
            from .flips import explain
        rep = run_compare(model, tokens, mode=args.mode, backend=args.backend, tol=args.tol, local=args.local,
                          explain=explain, qsa_rule=args.qsa_rule or "llamacpp", n_ubatch=args.ubatch)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.json:
        d = rep.to_dict()
        d["file"] = None if tmp is not None else path
        d["tokens"] = [int(t) for t in tokens]
        print(json.dumps(d, default=float))
    else:
        print(format_report(rep, all_rows=not args.failures_only))
    return 0 if rep.ok else 1


def _compare_authors(args, model, tokens, path) -> int:
    from .compare_authors import TOL, compare_authors, format_authors
    if args.local:
        raise RefengineError("compare --against transformers: --local feeds llama.cpp's own layer inputs; "
                             "the authors' code has none to give: compare without --local")
    rep = compare_authors(model, tokens, mode=args.mode, tol=args.tol or TOL, qsa_rule=args.qsa_rule or "authors")
    if args.json:
        d = rep.to_dict()
        d["file"], d["tokens"] = path, [int(t) for t in tokens]
        print(json.dumps(d, default=float))
    else:
        print(format_authors(rep))
    return 0 if rep.ok else 1


def cmd_run(args) -> int:
    from .model import Model
    from .runtime import Runtime
    model = Model(args.file, n_ctx=args.ctx, **_ubatch_kw(args))
    state, last, history = model.new_state(), None, []
    if args.load_state is not None:                   # continue a saved sequence: the input is the continuation
        from .state_file import read_state
        saved = read_state(args.load_state, model, progress=not args.quiet)
        state, last = saved.state, saved.logits
        history = [] if saved.tokens is None else saved.tokens.tolist()
        tokens = _input_tokens(args, model) if args.tokens is not None or args.prompt is not None else []
        if not tokens and last is None:
            raise RefengineError(f"{args.load_state}: the state holds no next-token logits: give the continuation "
                                 f"with --tokens or --prompt")
    else:
        tokens = _input_tokens(args, model)
    tok = None
    if model.gf.get("tokenizer.ggml.model") not in (None, "none", "no_vocab"):
        try:
            from .tokenizer import Tokenizer
            tok = Tokenizer(model.path, model.gf)
        except RefengineError:
            tok = None
    rt = Runtime(mode=args.mode, backend=args.backend, qsa_rule=args.qsa_rule or "authors", **_expert_kw(args, model),
                 **_graph_kw(args), **_policy_kw(args))
    stamps = []                                   # time at each new token (the first comes after the prefill)
    bar = _decode_bar(args, rt)

    def show(t):
        stamps.append(time.perf_counter())
        if tok is not None:
            print(tok.piece(t).decode("utf-8", errors="replace"), end="", flush=True)
        else:
            print(t, end=" ", flush=True)
        if bar is not None:
            bar.update(1)
            if rt.expert_cache is not None:
                c = rt.expert_cache
                hr = c.hit_rate
                bar.set_postfix_str(f"hit {'-' if hr is None else f'{hr:.3f}'}, {c.bytes_moved / 2**20:.0f} MiB "
                                    f"moved, {c.load_seconds:.2f} s loading", refresh=False)
    t0 = time.perf_counter()
    if tokens:                                    # the prefill (of the continuation, after --load-state); a bar over
        last = model.forward(tokens, state, rt, progress=not args.quiet, last_only=True)[-1]   # its ubatches,
                                                   # cleared when done; the head on the last position only
    if tok is not None:
        print(tok.decode(tokens), end="", flush=True)
    dec = None
    if args.graph:                                # decode steps replayed from one captured graph (issue 23)
        from .cuda.graph_step import GraphDecoder
        dec = GraphDecoder(model, rt, state)
        dec.reserve(min(state.n_past + args.n + 1, model.n_ctx))   # no cache grows while decoding: one capture
    eos = tok.eos() if tok else None
    try:
        if dec is not None and last is not None and (eos is None or args.save_state is None):
            out = dec.generate(last, args.n, eos=eos, on_token=show)      # each replay feeds its own argmax: runs
        else:                                                             # of 16 launched back to back
            buf = np.empty(model.cfg.n_vocab, dtype=np.float32)          # (the step's logits, reused)
            out = model.generate([], args.n, rt=rt, eos=eos, on_token=show, state=state, logits=last,
                                 step=None if dec is None else (lambda t: dec.step(t, out=buf)))
    finally:
        if bar is not None:
            bar.close()
    print()
    if dec is not None:
        print(f"[graph: {dec.captures} capture(s), {dec.replays} replayed steps, {dec.eager} eager"
              + (f"; not captured: {dec.failed}" if dec.failed else "") + "]", file=sys.stderr)
    prefill = (stamps[0] if stamps else time.perf_counter()) - t0
    decode = f"{(len(stamps) - 1) / (stamps[-1] - stamps[0]):.2f} tokens/s" if len(stamps) > 1 else "-"
    print(f"[prefill {len(tokens)} tokens: {prefill:.2f} s ({len(tokens) / max(prefill, 1e-9):.1f} tokens/s); "
          f"decode {max(len(out) - 1, 0)} tokens: {decode}; backend {args.backend}, mode {args.mode}] ids: {out}",
          file=sys.stderr)
    _expert_report(args, rt.expert_cache, rt.expert_stats)
    if args.json is not None:
        from .golden.write import expert_record
        rec = {"ids": [int(i) for i in out], "prompt_tokens": len(tokens), "prefill_s": round(prefill, 4),
               "decode_tokens_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None,
               "backend": args.backend, "mode": args.mode, "resident": bool(rt.resident),
               "device": rt.device.stats.as_dict() if rt.device is not None else None,
               "experts": expert_record(rt),
               "graph": None if dec is None else {"captures": dec.captures, "replays": dec.replays,
                                                  "eager": dec.eager, "failed": dec.failed}}
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)
    if args.save_state is not None:               # the last new token is fed too: the state holds every token
        from .state_file import save_state
        history += list(tokens) + out
        if out:
            last = model.forward(out[-1:], state, rt)[-1]
        m = save_state(args.save_state, model, state, logits=last, tokens=history, progress=not args.quiet)
        print(f"[state: {m['n_past']} positions, {os.path.getsize(args.save_state) / 2**20:.2f} MiB -> "
              f"{args.save_state}]", file=sys.stderr)
    return 0


def _policy_kw(args) -> dict:
    """`run --kernel-policy KEY=VALUE ...`: a quant.cuda.policy.KernelPolicy (the cuda backend's kernel choices)."""
    if not args.kernel_policy:
        return {}
    if args.backend != "cuda":
        raise ConfigError(f"--kernel-policy sets the cuda kernels' choices; the backend is {args.backend!r}")
    from quant.cuda.policy import KernelPolicy
    try:
        return {"kernel_policy": KernelPolicy.default().with_settings(args.kernel_policy)}
    except ValueError as e:
        raise ConfigError(f"--kernel-policy: {e}") from None


def _graph_kw(args) -> dict:
    """`run --graph`: the fixed-shape resident runtime a captured decode step needs (on a GPU with --backend cuda;
    on the other backends the "sim" device, where the graph is a tape of the step's ops: the same driver, no GPU)."""
    if not args.graph:
        return {}
    if args.gpu_expert_budget is not None:
        raise RefengineError("--graph: the expert cache reads each MoE layer's expert ids back to the host (its misses "
                             "are copied from the file), which a captured step cannot; drop --gpu-expert-budget or "
                             "--graph")
    if args.mode != "exact":
        raise RefengineError(f"--graph runs the device-resident forward, which has the exact mode only (got "
                             f"--mode {args.mode})")
    return {"fixed_shapes": True, "resident": True}


def _decode_bar(args, rt):
    """A tqdm line on stderr over the decoded tokens (tokens/s; with an expert cache its hit rate, bytes moved and
    time loading), shown when stdout is not a terminal: the streamed text and the bar would share one line there."""
    if args.quiet or sys.stdout.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=args.n, desc="decode", unit="tok", file=sys.stderr, dynamic_ncols=True)


def add_expert_flags(p) -> None:
    """run's and golden's expert cache / routing trace flags (issue 24)."""
    p.add_argument("--gpu-expert-budget", metavar="B", default=None, help="routed experts through a GPU expert "
                   "cache of B bytes (\"8GiB\", a byte count, or a fraction of the routed-expert bytes: 0.25, "
                   "\"25%%\"); its counters are printed at the end (and, for golden, kept in the manifest: "
                   "refengine/expert_cache.py). Off the cuda backend the sim device stands in for the GPU")
    p.add_argument("--expert-policy", default="lru", choices=("lru", "lfu", "decay"),
                   help="the expert cache's replacement policy (default lru)")
    p.add_argument("--expert-stats", metavar="F", default=None, help="write the routing trace (every layer's "
                   "expert ids of every token, refengine/expert_trace.py) to F (.npz)")
    p.add_argument("--expert-prefetch", action="store_true", help="with --gpu-expert-budget: each MoE layer's "
                   "router input also guesses the next MoE layer's experts, copied into the cache on a worker thread "
                   "while the layers in between run (refengine/expert_prefetch.py; the same logits)")


def _expert_kw(args, model) -> dict:
    """`run`'s expert cache (issue 24) and routing trace as Runtime arguments. A budget off the cuda backend runs the
    resident forward on the "sim" device (NumPy slots): the same cache and counters, no GPU."""
    kw = {}
    if args.gpu_expert_budget is not None:
        from .expert_cache import ExpertCache
        kw["expert_budget"] = ExpertCache.for_model(model, args.gpu_expert_budget, policy=args.expert_policy,
                                                    prefetch=args.expert_prefetch)
        kw["resident"] = True
    elif args.expert_prefetch:
        raise RefengineError("--expert-prefetch fills the expert cache: give a budget with --gpu-expert-budget")
    if args.expert_stats is not None:
        from .expert_trace import ExpertTrace
        kw["expert_stats"] = ExpertTrace()
    return kw


def _expert_report(args, cache, stats) -> None:
    """The expert cache's summary line and the routing trace saved (run's and golden's end); None: not asked for."""
    if cache is not None:
        if cache.prefetcher is not None:
            cache.prefetcher.close()              # the copies in flight counted, the worker thread ended
        print(f"[{cache.summary()}]", file=sys.stderr)
    if stats is not None:
        stats.save(args.expert_stats)
        print(f"[routing trace: {len(stats.calls)} expert calls, {stats.tokens()} tokens -> {args.expert_stats}]",
              file=sys.stderr)


def cmd_quantize(args) -> int:
    from quant.recipes import load_recipe

    from .quantize import quantize_gguf
    recipe = load_recipe(args.recipe)
    s = quantize_gguf(args.input, args.output, recipe, progress=not args.quiet, engine=args.engine)
    kinds = ", ".join(f"{n} {t}" for t, n in sorted(s.counts().items(), key=lambda kv: -kv[1]))
    falls: dict[str, list[str]] = {}
    for name, _, _, note in s.tensors:
        if "->" in note:
            falls.setdefault(note, []).append(name)
    print(f"{s.path}: {len(s.tensors)} tensors ({kinds}), {s.bytes_in / 2**20:.1f} MiB -> "
          f"{s.bytes_out / 2**20:.1f} MiB with recipe {recipe.name} ({s.engine} quantizers)")
    for note, names in falls.items():
        print(f"  fallback {note}: {len(names)} tensor(s), e.g. {names[0]}")
    return 0


def cmd_info(args) -> int:
    from collections import Counter

    from .gguf import open_gguf
    gf = open_gguf(args.file)
    print(f"file:         {gf.path}")
    print(f"shards:       {len(gf.shards)}" + ("" if len(gf.shards) == 1 else " (" + ", ".join(
        os.path.basename(s.path) for s in gf.shards) + ")"))
    print(f"size:         {gf.nbytes / 2**20:.1f} MiB")
    print(f"architecture: {gf.get('general.architecture')}")
    print(f"name:         {gf.get('general.name', '')}")
    cnt, size = Counter(), Counter()
    for ti in gf.tensors.values():
        cnt[ti.type.name] += 1
        size[ti.type.name] += ti.nbytes
    print(f"tensors:      {len(gf.tensors)}")
    for t, n in sorted(cnt.items(), key=lambda kv: -size[kv[0]]):
        print(f"  {t:<8} {n:>6} tensors  {size[t] / 2**20:>10.1f} MiB")
    if args.tensors:
        for name, ti in gf.tensors.items():
            print(f"  {name:<40} {ti.type.name:<8} {list(ti.shape)!s:<22} {os.path.basename(ti.path)}")
    try:
        from .model import Model
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            m = Model(gf)
            unused = m.unused_tensors()
        c = m.cfg
        print("hyperparameters:")
        for k in ("n_vocab", "n_embd", "n_layer", "n_ctx_train", "head_dim_k", "head_dim_v", "n_rot", "rms_eps",
                  "n_expert", "n_expert_groups", "n_group_used", "causal_attn", "rope_freq_base",
                  "rope_scaling_type", "rope_freq_scale", "n_ctx_orig_yarn"):
            print(f"  {k:<18} {getattr(c, k)}")
        kinds: dict = {}                                         # layers grouped by kind, in order
        for il, sp in enumerate(c.layers):
            ix = sp.attn_cfg.indexer if sp.attn == "dsa" else None   # DSA: a layer runs its own indexer or shares one
            attn = sp.attn if ix is None else f"{sp.attn} ({'own' if ix.full else 'shared'} indexer)"
            kinds.setdefault((attn, sp.ffn), []).append(il)
        for (attn, ffn), ils in kinds.items():
            l0 = c.layers[ils[0]]
            span = f"{ils[0]}" if len(ils) == 1 else f"{ils[0]}..{ils[-1]}" if ils == list(range(ils[0], ils[-1] + 1)) \
                else ",".join(map(str, ils))
            print(f"  {'layers ' + span:<18} {attn}: heads {l0.n_head}/{l0.n_head_kv} kv; ffn {ffn}: n_ff {l0.n_ff}, "
                  f"n_ff_exp {l0.n_ff_exp}, experts used {l0.n_expert_used}")
            dsa = l0.attn == "dsa"                               # a DSAConfig: its MLA, then its indexer
            for sub in ((l0.attn_cfg.mla, l0.attn_cfg.indexer) if dsa else (l0.attn_cfg,)) + (l0.moe,):
                if sub is not None:
                    print(f"  {'':<18} {sub}")
            if dsa and not l0.attn_cfg.indexer.full:
                print(f"  {'':<18} selection from: " + ", ".join(f"{il} <- {c.layers[il].attn_cfg.indexer.source}"
                                                                  for il in ils))
        for x in w:
            print(f"warning: {x.message}")
        if unused:
            print(f"unused tensors (llama.cpp would refuse the file): {', '.join(unused)}")
    except RefengineError as e:
        print(f"model: not loadable by refengine: {e}")
        raise                                   # and exit 2 with that one line on stderr
    return 0


def cmd_golden(args) -> int:
    from .golden import make_golden
    from .model import Model
    if args.text is not None:
        return _golden_corpus(args)
    if args.chunks is not None:
        raise RefengineError("golden: --chunks counts chunks of a text: give the text with --file")
    model = Model(args.file, n_ctx=args.ctx, **_ubatch_kw(args))
    if args.tokens is None and args.prompt is None:
        raise RefengineError("golden: give the input with --tokens or --prompt (or a text with --file)")
    tokens = _input_tokens(args, model)
    kw = _expert_kw(args, model)
    m = make_golden(args.file, tokens, args.output, mode=args.mode, backend=args.backend, tensors=args.tensors or "all",
                    progress=not args.quiet, model=model, path_model=args.path_model,
                    qsa_rule=args.qsa_rule or "authors", n_ubatch=args.ubatch, runtime_kw=kw)
    n = len(m["order"])
    print(f"{args.output}: {n - 1} intermediates + logits [{len(tokens)}, {m['model']['n_vocab']}] "
          f"({m['bytes']['tensors'] / 2**20:.2f} MiB safetensors), manifest.json, results.gguf"
          + (", logits.kld" if m["files"]["kld_base"] else "")
          + f"; forward {m['timing_s']['forward']:.2f} s; tolerance NMSE {m['tolerance']['nmse']:.0e} "
          f"({m['model']['weight_class']} weights, {args.mode} mode)")
    _expert_report(args, kw.get("expert_budget"), kw.get("expert_stats"))
    return 0


def _golden_corpus(args) -> int:
    """golden --file TEXT: a KL-divergence base over the text's chunks (refengine/golden/corpus.py)."""
    from .golden.corpus import make_golden_corpus, tokenize_text
    from .model import Model
    given = [f for f, v in (("--tokens", args.tokens), ("--prompt", args.prompt), ("--tensors", args.tensors),
                            ("--path-model", args.path_model)) if v is not None]
    if given:
        raise RefengineError(f"golden --file: the input is the text, the output logits.kld and manifest.json only; "
                             f"{', '.join(given)} belong to the single-prompt golden")
    n_ctx = args.ctx or CORPUS_CTX_DEFAULT
    model = Model(args.file, n_ctx=n_ctx, **_ubatch_kw(args))
    tokens, bos, text = tokenize_text(args.text, model)
    kw = _expert_kw(args, model)
    m = make_golden_corpus(args.file, tokens, args.output, n_ctx=n_ctx, n_chunks=args.chunks, bos=bos,
                           mode=args.mode, backend=args.backend, progress=not args.quiet, model=model,
                           qsa_rule=args.qsa_rule or "authors", n_ubatch=args.ubatch, text=text, runtime_kw=kw)
    p = m["perplexity"]
    print(f"{args.output}: logits.kld ({m['n_chunk']} chunks of {n_ctx} tokens, {m['n_tokens_scored']} scored, "
          f"of {text['n_tokens']} tokens in {text['file']}), manifest.json; forward {m['timing_s']['forward']:.2f} s "
          f"(ubatch {m['n_ubatch']}, backend {args.backend}, {args.mode} mode)")
    print(f"Final estimate: PPL = {p['ppl']:.4f} +/- {p['ppl_unc']:.5f}")
    kld = os.path.join(args.output, m["files"]["kld_base"])
    print(f"read it with: {m['kld_base']['check'].replace('MODEL', args.file).replace(m['files']['kld_base'], kld)}")
    _expert_report(args, kw.get("expert_budget"), kw.get("expert_stats"))
    return 0


def cmd_check(args) -> int:
    from .golden.check import check_golden, format_check
    res = check_golden(args.golden, args.theirs, source=args.source, tol=args.tol)
    if args.json:
        print(json.dumps(res.to_dict(), default=float))
    else:
        print(format_check(res, all_rows=not args.failures_only))
    return 0 if res.report.ok else 1


def cmd_lint(args) -> int:
    from .lint import format_lint, lint
    rep = lint(args.file, scan=args.scan, progress=args.scan and not args.json)
    if args.json:
        print(json.dumps(rep.to_dict(), default=float))
    else:
        print(format_lint(rep, all_rows=not args.problems_only))
    return 1 if rep.refused else 0


def cmd_conformance(args) -> int:
    from .golden.conformance import write_conformance
    archs = args.archs.split(",") if args.archs else None
    kit = write_conformance(args.output, archs=archs, types=args.types.split(",") if args.types else None,
                            progress=not args.quiet)
    print(f"{args.output}: {len(kit['models'])} models over {len(kit['archs'])} archs "
          f"({', '.join(kit['archs'])}), {kit['bytes'] / 2**20:.1f} MiB, {kit['seconds']:.1f} s; see README.md there")
    return 0


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="refengine", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("synth", help="write a seeded synthetic GGUF")
    from .synth import PRESETS
    s.add_argument("arch", help="architecture: " + ", ".join(PRESETS))
    s.add_argument("--preset", default="tiny", help="default tiny; per arch: " + "; ".join(
        f"{a}: {', '.join(ps)}" for a, ps in PRESETS.items()))
    s.add_argument("--type", default="F32", help="weight type: F32, F16, BF16, Q8_0, Q4_K, Q6_K, ... (default F32)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--all-optional", action="store_true", help="add every optional tensor and key llama.cpp accepts")
    s.add_argument("--fused-qkv", action="store_true", help="one attn_qkv matrix instead of attn_q/k/v")
    s.add_argument("--tied-output", action="store_true", help="no output.weight (reuse token_embd)")
    s.add_argument("--rope-scaling", default=None, choices=["none", "linear", "yarn", "longrope"],
                   help="context extension keys (factor 4); --all-optional implies yarn")
    s.add_argument("--layers", type=int, default=None, help="write only the first N blocks")
    s.add_argument("--shards", type=int, default=1, help="split into N files (NAME-0000i-of-0000N.gguf)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(fn=cmd_synth)

    def add_input(q):
        g = q.add_argument_group("input (default: 16 fixed pseudo-random token ids)")
        g.add_argument("--tokens", type=_tokens, default=None, help="comma-separated token ids")
        g.add_argument("--prompt", default=None, help="text, tokenized with the file's own vocabulary")

    def add_ctx(q, ubatch_default: str):
        q.add_argument("--ctx", type=_positive("--ctx"), default=None, metavar="N", help="context size n_ctx (default: "
                       "min(n_ctx_train, 4096)); above the trained context it warns and runs, as llama.cpp does")
        q.add_argument("--ubatch", type=_positive("--ubatch"), default=None, metavar="N", help="run the prompt as successive "
                       f"ubatches of N tokens, as llama.cpp's n_ubatch (default: {ubatch_default})")

    def add_exec(q):
        q.add_argument("--mode", default="exact", help="exact (f32 math on dequantized weights) or llamacpp "
                       "(activations rounded to the weight's partner type Q8_0/Q8_1/Q8_K/f16/bf16 first, as ggml-cpu)")
        q.add_argument("--backend", default="numpy", help="numpy (the reference), cpu (Numba kernels on the packed weights), cuda (numba-cuda kernels on an NVIDIA GPU)")
        q.add_argument("--qsa-rule", default=None, choices=QSA_RULES,
                       help="QSA's selection (qwen4exp): authors (whole top blocks plus the query's unfinished "
                       "block; the default of run and golden, and the only rule of compare --against transformers) "
                       "or llamacpp (the top budget + r - 1 tokens; the default of compare against llama.cpp)")

    c = sub.add_parser("compare", help="run refengine and llama.cpp, compare every named tensor")
    c.add_argument("file", nargs="?", default=None, help="GGUF (any shard of a split set); "
                   "default: a synthetic tiny qwen3moe generated on the spot")
    add_input(c)
    add_exec(c)
    c.add_argument("--against", choices=("llamacpp", "transformers"), default="llamacpp",
                   help="the oracle: llama.cpp (every named tensor, the default) or the model authors' PyTorch code "
                   "in transformers (deepseek4, qwen4exp, glm5-next: hidden states and logits; the hf extra: "
                   "pip install 'refengine[hf]')")
    add_ctx(c, "all the tokens in one batch; with N, both engines run ubatches of N, the tensors compared are the "
            "first ubatch's and the logits every position's")
    c.add_argument("--tol", type=float, default=None, help="NMSE tolerance per tensor (default: by weight types; "
                   "1e-8 against transformers)")
    c.add_argument("--local", action="store_true", help="feed every layer llama.cpp's own input to it: each "
                   "layer's figure is then its own error, not the sum of the earlier layers'")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--failures-only", action="store_true", help="print only the tensors over tolerance")
    c.set_defaults(fn=cmd_compare)

    r = sub.add_parser("run", help="greedy generation")
    r.add_argument("file")
    add_input(r)
    add_exec(r)
    add_ctx(r, "512")
    r.add_argument("-n", type=int, default=32, help="tokens to generate (default 32)")
    r.add_argument("--save-state", metavar="F", default=None, help="after the generation, save the sequence (the "
                   "prompt and every generated token, the last one fed too) to F: one safetensors file with the "
                   "per-layer state, the next-token logits, the token ids and a manifest naming the model file's "
                   "sha256 (refengine/state_file.py)")
    r.add_argument("--load-state", metavar="F", default=None, help="continue the sequence saved in F (refused for "
                   "another model file): --tokens / --prompt are then the continuation, appended to it; without "
                   "them generation goes on from the saved next-token logits. The run is the uninterrupted one, "
                   "bit for bit")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bars (the prefill's ubatches; the decoded "
                   "tokens, with the expert cache's hit rate, when stdout is not a terminal)")
    add_expert_flags(r)
    r.add_argument("--graph", action="store_true", help="decode through one captured CUDA graph replayed every "
                   "token (refengine/cuda/graph_step.py; with --backend cuda, else on the \"sim\" device as a "
                   "check): the device-resident forward with fixed shapes, the same ids; each replay feeds its argmax "
                   "to the next on the device, 16 launched back to back (with --save-state and an eos: one token at "
                   "a time, so that the saved state ends at the eos); its counters are printed")
    r.add_argument("--kernel-policy", action="append", default=[], metavar="KEY=VALUE", help="with --backend cuda: "
                   "a kernel choice (quant/cuda/policy.py KernelPolicy's fields, e.g. sgemm_min=0 to keep prefill "
                   "products off cuBLAS, fused_ops=False); repeatable")
    r.add_argument("--json", metavar="F", default=None, help="write the run's figures to F: ids, prefill time, "
                   "decode tokens/s, the device counters of a resident run (what crossed between host and device), "
                   "the expert cache's counters per layer")
    r.set_defaults(fn=cmd_run)

    qz = sub.add_parser("quantize", help="rewrite a GGUF with a per-tensor type recipe",
                        description="Recipes: a name (f32, f16, bf16, q8_0, q6_k, q4_k, q2_k, q4_k_m, moe-q2k, "
                        "moe-iq2) or a file of 'GLOB TYPE' lines, first match wins (quant/recipes.py). Norms, "
                        "routers and 1-D tensors stay as they are; rows that do not fit a type's block fall back "
                        "as in llama.cpp.")
    qz.add_argument("input", help="GGUF (any shard of a split set)")
    qz.add_argument("output", help="GGUF to write (one file)")
    qz.add_argument("--recipe", required=True, help="recipe name or file")
    qz.add_argument("--engine", default="auto", choices=("auto", "numpy", "ggml"),
                    help="quantizers: numpy (the reference), ggml (same bytes, much faster), "
                    "auto = ggml when llama-cpp-python is installed (default)")
    qz.add_argument("-q", "--quiet", action="store_true")
    qz.set_defaults(fn=cmd_quantize)

    i = sub.add_parser("info", help="architecture, hyperparameters, tensor types, size, shards")
    i.add_argument("file")
    i.add_argument("--tensors", action="store_true", help="list every tensor: name, type, shape (NumPy order), shard")
    i.set_defaults(fn=cmd_info)

    gd = sub.add_parser("golden", help="write golden per-layer outputs and logits other engines check against",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="One prompt (--tokens / --prompt): writes DIR/tensors.safetensors (every named "
                        "intermediate under llama.cpp's names,\nand logits), DIR/manifest.json (model sha256, tokens, "
                        "versions, per-tensor shape and tolerance),\nDIR/results.gguf (llama-results --check) and "
                        "DIR/logits.kld (llama-perplexity --kl-divergence-base).\n\n"
                        "A corpus (--file TEXT): the text tokenized as llama-perplexity does (BOS per chunk when the "
                        "vocabulary\nadds one), K chunks of --ctx tokens, each a fresh sequence; writes DIR/logits.kld "
                        "(positions ctx/2 .. ctx-2\nof every chunk) and DIR/manifest.json (ctx, ubatch, chunks, the "
                        "text's sha256, the perplexity), e.g.\n"
                        "  refengine golden model.gguf --file wiki.test.raw --ctx 512 --chunks 20 -o gold\n"
                        "  llama-perplexity -m model.gguf --kl-divergence-base gold/logits.kld --kl-divergence "
                        "-c 512 -b 512 \\\n      -ctk f32 -ctv f32 -fa off")
    gd.add_argument("file", help="GGUF (any shard of a split set)")
    add_input(gd)
    gd.add_argument("-f", "--file", dest="text", metavar="TEXT", default=None, help="a text file: write a "
                    "KL-divergence base over its chunks instead of one prompt's golden (as llama-perplexity -f; "
                    "--ctx then defaults to 512, llama-perplexity's -c)")
    gd.add_argument("--chunks", type=_positive("--chunks"), default=None, metavar="K", help="with --file: the first "
                    "K chunks of --ctx tokens (default: every whole chunk of the text, as llama-perplexity)")
    add_exec(gd)
    add_ctx(gd, "all the tokens in one batch; with N, the intermediates are the first ubatch's, the logits every "
            "position's. With --file: each chunk in ubatches of N, default 512")
    gd.add_argument("--tensors", default=None, help="all (default), logits (no intermediates), or comma-separated "
                    "glob patterns of names, e.g. 'l_out-*,ffn_moe_topk-*'")
    gd.add_argument("--path-model", default=None, help="the model path stored in results.gguf, which "
                    "`llama-results --check -m PATH` must repeat exactly (default: FILE as given)")
    gd.add_argument("-q", "--quiet", action="store_true")
    gd.add_argument("-o", "--output", required=True, help="directory to write")
    add_expert_flags(gd)
    gd.set_defaults(fn=cmd_golden)

    ck = sub.add_parser("check", help="compare another engine's dump with a golden directory",
                        description="THEIRS: a .safetensors or .npz file (or a directory with one) of named tensors. "
                        "--from refengine: llama.cpp's graph names, as in the golden; --from transformers: "
                        "hidden_states.N (output_hidden_states; hidden state N+1 is l_out-N, the last one "
                        "result_norm) and logits. Exit 0 match, 1 divergence, 2 bad input.")
    ck.add_argument("golden", help="directory written by `refengine golden`")
    ck.add_argument("theirs", help="the dump to check")
    ck.add_argument("--from", dest="source", default="refengine", choices=("refengine", "transformers"))
    ck.add_argument("--tol", type=float, default=None, help="NMSE tolerance (default: the manifest's)")
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--failures-only", action="store_true")
    ck.set_defaults(fn=cmd_check)

    ln = sub.add_parser("lint", help="loader report: per tensor the types llama.cpp accepts; keys; shards; NaN scan",
                        description="Exit 0: llama.cpp loads and runs the file (flags for strict loaders may remain); "
                        "1: llama.cpp would refuse it (the reason names the tensor or key); 2: unreadable input.")
    ln.add_argument("file", help="GGUF (any shard of a split set)")
    ln.add_argument("--scan", action="store_true", help="decode every tensor and count NaN/inf")
    ln.add_argument("--json", action="store_true")
    ln.add_argument("--problems-only", action="store_true", help="list only tensors with a flag")
    ln.set_defaults(fn=cmd_lint)

    cf = sub.add_parser("conformance", help="a test kit for another engine's CI: tiny GGUFs per arch and type, "
                        "each with its golden directory")
    cf.add_argument("output", help="directory to write")
    cf.add_argument("--archs", default=None, help="comma-separated (default: every registered arch)")
    cf.add_argument("--types", default=None, help="comma-separated weight types (default: F32,Q8_0,Q4_K,IQ4_XS)")
    cf.add_argument("-q", "--quiet", action="store_true")
    cf.set_defaults(fn=cmd_conformance)
    return p


def main(argv: list[str] | None = None) -> int:
    """Every line on stderr starts with `refengine: `: warnings (one line each), then at most one error line."""
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            return _run(args)
        finally:
            for w in caught:
                print(f"refengine: warning: {w.message}", file=sys.stderr)
            _print_error()


_ERROR: list[str] = []


def _print_error():
    if _ERROR:
        print(f"refengine: error: {_ERROR.pop()}", file=sys.stderr)


def _run(args) -> int:
    _ERROR.clear()
    try:
        return args.fn(args)
    except RefengineError as e:
        _ERROR.append(str(e))                   # printed after the warnings, as the last line
        return 2
    except (UnknownTypeError, QuantError, OSError) as e:
        # argument-level problems (unknown --type name, unwritable -o path)
        _ERROR.append(str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
