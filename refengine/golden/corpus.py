"""`refengine golden --file TEXT --ctx N --chunks K`: a KL-divergence base over a corpus, as llama-perplexity's.

`llama-perplexity -f TEXT -c N --chunks K --kl-divergence-base FILE` (`perplexity()` in
tools/perplexity/perplexity.cpp) writes the log-probabilities of the model it runs; `llama-perplexity -m MODEL
--kl-divergence-base FILE --kl-divergence -c N` (`kl_divergence()`) reads them back and reports how far MODEL's
own are from them (KL divergence, PPL ratio, same top token). This module writes that file from the reference,
following perplexity() step by step:

    text     = the file's bytes, one trailing newline dropped                  (common/arg.cpp, `-f`)
    tokens   = tokenize(text, add_special=True)   BOS in front when the vocabulary adds one (common_tokenize)
    n_chunk  = min(K, len(tokens) // N)           K: every whole chunk when not given (`--chunks -1`)
    chunk c  = tokens[c*N : (c+1)*N], a fresh sequence (llama_memory_clear); while it runs, its first token is
               replaced by BOS when the vocabulary adds one; the file keeps the text's own token
    scored   = positions first = N/2 .. N-2, each predicting the next token (half a window of context at least)
    nll      = max(l) + log(sum_j exp(l_j - max(l))) - l[next]     in log_softmax's float32 (perplexity.cpp:60-70)
    PPL      = exp(mean nll);  +/- PPL * sqrt((mean nll^2 - (mean nll)^2) / (count - 1))   ("Final estimate")

Every chunk runs as `Model.forward` in ubatches of n_ubatch (llama.cpp's physical batch), with no trace: attention
runs blocked and memory is bounded by the ubatch, whatever N. The file is streamed chunk by chunk
(`formats.KldBaseWriter`); the directory holds it and manifest.json (model, text sha256, n_ctx, n_ubatch, n_chunk,
the perplexity and the llama-perplexity command that reads the file).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import warnings

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError, RefengineError
from .formats import KldBaseWriter, kld_scored
from .write import expert_record, KLD_FILE, MANIFEST_FILE, model_record, versions

CORPUS_FORMAT = "refengine-golden-corpus 1"
LLAMACPP_FLAGS = "-ctk f32 -ctv f32 -fa off"      # the KV cache and attention the reference computes


class CorpusError(RefengineError):
    """A text corpus that cannot be read, or too short for one chunk of the context asked for."""


def read_text(path: str | os.PathLike) -> tuple[str, dict]:
    """(text, record): the file as `llama-perplexity -f` reads it (whole, one trailing '\\n' dropped) and its
    manifest record (file name, bytes, sha256 of the file as on disk)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CorpusError(f"{path}: cannot read the text file: {e.strerror or e}") from None
    record = {"file": os.path.basename(path), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if data.endswith(b"\n"):
        data = data[:-1]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from None
    if not text:
        raise CorpusError(f"{path}: the text file is empty")
    return text, record


def tokenize_text(path: str | os.PathLike, model, tokenizer=None) -> tuple[list[int], int | None, dict]:
    """(tokens, bos, record): the text file tokenized with the model's own vocabulary, BOS in front when the
    vocabulary adds one, as llama-perplexity tokenizes it; bos = the id each chunk starts with (None: the
    vocabulary adds none). tokenizer: one with `encode(text, add_special)`, `add_bos()`, `add_eos()`, `bos()`
    (default: the model file's own, through llama.cpp: `refengine.tokenizer.Tokenizer`)."""
    text, record = read_text(path)
    if tokenizer is None:
        from ..tokenizer import Tokenizer
        tokenizer = Tokenizer(model.path, model.gf)
    tok = tokenizer
    if tok.add_eos():                              # perplexity.cpp: GGML_ASSERT(!llama_vocab_get_add_eos(vocab))
        raise CorpusError(f"{model.path}: the vocabulary adds EOS after a text; llama-perplexity refuses such a "
                          f"vocabulary (it would score the EOS the text does not hold)")
    tokens = tok.encode(text, add_special=True)
    bos = tok.bos() if tok.add_bos() else None
    record.update(n_tokens=len(tokens), add_bos=bos is not None, bos=bos)
    return tokens, bos, record


def split_chunks(tokens, n_ctx: int, n_chunks: int | None = None, *, source: str = "the text") -> np.ndarray:
    """tokens [n] -> [n_chunk, n_ctx]: n_chunk = min(n_chunks, n // n_ctx) whole chunks from the start, every
    whole chunk when n_chunks is None; the tail that does not fill a chunk is not scored (perplexity.cpp)."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if n_ctx < 3:
        raise ConfigError(f"n_ctx = {n_ctx}: a chunk scores positions n_ctx/2 .. n_ctx-2, none below 3")
    if n_chunks is not None and n_chunks < 1:
        raise ConfigError(f"chunks = {n_chunks}: at least 1")
    n_max = tokens.size // n_ctx
    if n_max < 1:
        raise CorpusError(f"{source} tokenizes to {tokens.size} tokens, fewer than one chunk of n_ctx = {n_ctx}")
    n_chunk = n_max if n_chunks is None else min(n_chunks, n_max)
    return tokens[:n_chunk * n_ctx].reshape(n_chunk, n_ctx)                  # [n_chunk, n_ctx]


def chunk_nll(logits: np.ndarray, targets) -> np.ndarray:
    """logits [N, V], targets [N] -> float64 [N]: -log softmax(l)[target] as perplexity.cpp's `log_softmax`
    computes it (:60-70): expf summed in double, log_sum_exp and the result in float32."""
    x = np.asarray(logits, dtype=np.float32)                                  # [N, V]
    targets = np.asarray(targets, dtype=np.int64)                             # [N]
    mx = x.max(axis=-1)                                                       # [N] float32
    sum_exp = np.exp(x - mx[:, None]).astype(np.float64).sum(axis=-1)         # [N] expf, summed in double
    log_sum_exp = np.log(sum_exp).astype(np.float32)                          # [N] `const float log_sum_exp`
    return ((mx + log_sum_exp) - x[np.arange(x.shape[0]), targets]).astype(np.float64)   # float32 sum, then double


def perplexity(sum_nll: float, sum_nll2: float, count: int) -> tuple[float, float]:
    """(PPL, its +/-) from the sums of nll and nll^2 over `count` scored tokens, as perplexity() ends
    ("Final estimate: PPL = ... +/- ..."); +/- is NaN below two tokens or without spread."""
    nll, nll2 = sum_nll / count, sum_nll2 / count
    ppl = float(np.exp(nll))
    var = nll2 - nll * nll
    return ppl, (float(np.sqrt(var / (count - 1)) * ppl) if var > 0 and count > 1 else float("nan"))


def make_golden_corpus(path, tokens, out_dir, *, n_ctx: int, n_chunks: int | None = None, bos: int | None = None,
                       mode: str = "exact", backend: str = "numpy", progress: bool = False, model=None,
                       qsa_rule: str = "authors", n_ubatch: int | None = None, text: dict | None = None,
                       runtime_kw: dict | None = None) -> dict:
    """Run the reference over `tokens` (a tokenized corpus: `tokenize_text`) in chunks of n_ctx and write
    out_dir/logits.kld (every chunk's scored log-probabilities, llama-perplexity's KL-divergence base) and
    out_dir/manifest.json; returns the manifest, whose `perplexity` is the estimate llama-perplexity prints.

    bos: the id a chunk's first token is replaced with while it runs (None: no replacement, the vocabulary adds
    no BOS). n_ubatch: tokens per ubatch of each chunk's prefill (default: the model's, 512). text: the text
    file's record (`tokenize_text`) for the manifest. model: a loaded Model, whose n_ctx must hold a chunk."""
    from ..model import Model
    from ..runtime import Runtime
    t0 = time.perf_counter()
    model = model or Model(path, n_ctx=n_ctx)
    if n_ctx > model.n_ctx:
        raise ConfigError(f"{model.path}: chunks of n_ctx = {n_ctx} do not fit the model's context n_ctx = "
                          f"{model.n_ctx}: load it with n_ctx >= {n_ctx} (--ctx)")
    chunks = split_chunks(tokens, n_ctx, n_chunks, source=(text or {}).get("file", "the text"))   # [C, n_ctx]
    n_chunk = chunks.shape[0]
    if len(tokens) < 2 * n_ctx:
        warnings.warn(f"{(text or {}).get('file', 'the text')}: {len(tokens)} tokens < 2 * n_ctx = {2 * n_ctx}: "
                      f"`llama-perplexity -f` refuses such a text (its --kl-divergence still reads this file)",
                      stacklevel=2)
    ub = min(int(n_ubatch or model.n_ubatch), n_ctx)
    V = model.cfg.n_vocab
    os.makedirs(out_dir, exist_ok=True)
    rt = Runtime(mode=mode, backend=backend, qsa_rule=qsa_rule, **(runtime_kw or {}))   # no trace: blocked attention
    first, n_rows = kld_scored(n_ctx)
    sum_nll = sum_nll2 = 0.0
    per_chunk = []                                                            # the running PPL after each chunk
    bar = tqdm(total=n_chunk, unit="chunk", desc=f"golden {os.path.basename(model.path)} n_ctx={n_ctx}",
               disable=not progress)
    with KldBaseWriter(os.path.join(out_dir, KLD_FILE), chunks, V) as w:
        for c in range(n_chunk):
            run = chunks[c].copy()                                            # [n_ctx]
            if bos is not None:
                run[0] = bos                                                  # perplexity.cpp: BOS for the first batch
            logits = model.forward(run, None, rt, n_ubatch=ub)                # [n_ctx, V], a fresh sequence
            if not np.all(np.isfinite(logits[first:first + n_rows])):
                raise ConfigError(f"{model.path}: chunk {c}: the logits hold NaN/inf; no golden written")
            w.add_chunk(logits)
            nll = chunk_nll(logits[first:first + n_rows], chunks[c, first + 1:first + 1 + n_rows])   # [n_rows]
            sum_nll += float(nll.sum())
            sum_nll2 += float((nll * nll).sum())
            per_chunk.append(round(float(np.exp(sum_nll / ((c + 1) * n_rows))), 6))
            bar.set_postfix(ppl=f"{per_chunk[-1]:.4f}")
            bar.update(1)
    bar.close()
    t_run = time.perf_counter() - t0
    count = n_chunk * n_rows
    ppl, unc = perplexity(sum_nll, sum_nll2, count)
    check = (f"llama-perplexity -m MODEL --kl-divergence-base {KLD_FILE} --kl-divergence -c {n_ctx} -b {n_ctx} "
             f"{LLAMACPP_FLAGS}")
    manifest = {
        "format": CORPUS_FORMAT,
        "model": model_record(model, progress),
        "text": text,
        "n_ctx": n_ctx, "n_ubatch": ub, "n_chunk": n_chunk, "chunks_asked": n_chunks,
        "n_tokens_scored": count, "bos": bos,
        "mode": mode, "backend": backend, "qsa_rule": qsa_rule,
        "versions": versions(),
        "perplexity": {"ppl": ppl, "ppl_unc": unc, "mean_nll": sum_nll / count, "per_chunk": per_chunk,
                       "rule": "perplexity.cpp perplexity(): exp of the mean nll over positions n_ctx/2 .. n_ctx-2 "
                               "of every chunk; +/- = PPL * sqrt(var(nll) / (count - 1))"},
        "files": {"tensors": None, "kld_base": KLD_FILE},
        "kld_base": {"n_ctx": n_ctx, "n_chunk": n_chunk, "scored_positions": [first, first + n_rows - 1],
                     "check": check,
                     "same_as": (f"llama-perplexity -m MODEL -f {(text or {}).get('file', 'TEXT')} -c {n_ctx} -b {n_ctx} "
                                 f"--chunks {n_chunk} --kl-divergence-base FILE {LLAMACPP_FLAGS}")},
        "timing_s": {"forward": round(t_run, 3)},
    }
    if expert_record(rt):
        manifest["experts"] = expert_record(rt)
    with open(os.path.join(out_dir, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest
