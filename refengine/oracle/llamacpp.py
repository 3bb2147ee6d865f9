"""llama.cpp as the oracle, through llama-cpp-python's low-level API (CPU, f32 KV cache, no flash attention).

    res = run_llamacpp("model.gguf", [1, 2, 3], trace=True)
    res.logits                 # [T, V] float32, one row per position
    res.tensors["Qcur-0"]      # every named graph tensor, NumPy order (reversed ggml ne), last one computed
    res.order                  # names in the order llama.cpp computed them

Intermediates come from the `cb_eval` hook of the context: with `ask = True` the scheduler asks whether
we want a tensor (we say yes to every named F32/I32 node), then calls again with `ask = False` once it
is computed; its name and bytes are read with ggml's own functions (`quant.ggml`).
When llama.cpp gives several tensors the same name (`Qcur-0` before and after RoPE), the last one is
kept, which is what refengine's trace records under that name.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

import numpy as np

from quant import ggml as qggml

from ..errors import OracleError

GGML_TYPE_F32 = 0


@dataclass
class OracleResult:
    logits: np.ndarray                                     # [T, V]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def _import():
    try:
        import llama_cpp
    except ImportError:
        raise OracleError("llama-cpp-python is not installed: pip install 'llama-cpp-python==0.3.36'") from None
    return llama_cpp


_LOG_CB = None


def _quiet(L):
    """Silence llama.cpp's log output (it writes model details to stderr on every load)."""
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


def _skip(name: str) -> bool:
    # weights, views of the cache and leaves are not intermediates
    return (not name) or name.endswith((".weight", ".bias", ".scale")) or name.startswith(("cache_", "leaf_"))


def run_llamacpp(path: str | os.PathLike, tokens, *, chunks: list[int] | None = None, trace: bool = True,
                 n_ctx: int | None = None, n_threads: int | None = None, names: set[str] | None = None) -> OracleResult:
    """Decode `tokens` with llama.cpp; `chunks` splits them into successive decode calls (default: one).

    Returns logits for every position; with `trace`, the named intermediates of the *first* chunk.
    """
    L = _import()
    _quiet(L)
    tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
    T = len(tokens)
    if T == 0:
        raise OracleError("no tokens to decode")
    chunks = chunks or [T]
    if sum(chunks) != T:
        raise OracleError(f"chunks {chunks} do not add up to {T} tokens")
    path = os.fspath(path)
    L.llama_backend_init()

    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise OracleError(f"{path}: llama.cpp refused to load the model (run `llama-cli` on it to see why)")

    captured: dict[str, np.ndarray] = {}
    order: list[str] = []
    state = {"recording": trace}

    def cb(t, ask, user):
        name = qggml.tensor_view(t).name.decode("utf-8", errors="replace")
        if _skip(name) or (names is not None and name not in names):
            return not ask
        if ask:
            return state["recording"]
        got = qggml.read_tensor(t)
        if got is not None and state["recording"]:
            captured[name] = got[1]
            if name in order:
                order.remove(name)
            order.append(name)
        return True

    cb_c = L.ggml_backend_sched_eval_callback(cb)
    cp = L.llama_context_default_params()
    cp.n_ctx = int(n_ctx or max(256, -(-T // 256) * 256))
    cp.n_batch = cp.n_ubatch = max(chunks)
    cp.n_seq_max = 1
    cp.type_k = cp.type_v = GGML_TYPE_F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.n_threads = cp.n_threads_batch = int(n_threads or os.cpu_count() or 1)
    cp.no_perf = True
    if trace:
        cp.cb_eval = cb_c
        cp.cb_eval_user_data = None
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        L.llama_model_free(model)
        raise OracleError(f"{path}: llama.cpp could not create a context (n_ctx = {cp.n_ctx})")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    out = np.empty((T, n_vocab), dtype=np.float32)
    try:
        batch = L.llama_batch_init(max(chunks), 0, 1)
        try:
            pos = 0
            for ci, n in enumerate(chunks):
                state["recording"] = trace and ci == 0
                batch.n_tokens = n
                for i in range(n):
                    batch.token[i] = tokens[pos + i]
                    batch.pos[i] = pos + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                rc = L.llama_decode(ctx, batch)
                if rc != 0:
                    raise OracleError(f"{path}: llama_decode returned {rc} at positions {pos}..{pos + n - 1}")
                ptr = L.llama_get_logits(ctx)
                out[pos:pos + n] = np.ctypeslib.as_array(ptr, shape=(n * n_vocab,)).reshape(n, n_vocab)
                pos += n
        finally:
            L.llama_batch_free(batch)
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)
    del cb_c
    return OracleResult(logits=out, tensors=captured, order=order)
