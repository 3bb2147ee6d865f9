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
    earlier: dict[str, list] = field(default_factory=dict)  # name -> earlier tensors of the same name, in order
    sequence: list[str] = field(default_factory=list)      # every recording's name in evaluation order, repeats kept


def _import():
    try:
        import llama_cpp
    except ImportError:
        raise OracleError("llama-cpp-python is not installed: pip install 'llama-cpp-python==0.3.36'") from None
    return llama_cpp


_LOG_CB = None
_ERRORS: list[str] = []          # llama.cpp's error log lines since the last load (its reason for a refusal)


def quiet_logs(L):
    """Silence llama.cpp's log output (it writes model details to stderr on every load); keep its errors."""
    global _LOG_CB
    if _LOG_CB is None:
        def log(level, text, user):
            if level == 4 and text:                        # GGML_LOG_LEVEL_ERROR
                _ERRORS.append(text.decode("utf-8", errors="replace").strip())
                del _ERRORS[:-8]
        _LOG_CB = L.llama_log_callback(log)
    # set on every call: another module of the same process (refengine.fuzz's loader) may have put its own
    # callback in place since, and a refusal's reason would then go there
    L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


def llamacpp_reason() -> str:
    """llama.cpp's own words for the last refusal ('error loading model: ...'), or '' when it logged none."""
    errs = [e for e in _ERRORS if "error loading model" in e] or _ERRORS
    return errs[-1] if errs else ""


def precheck(path: str) -> None:
    """Refuse, with llama.cpp's reason, a file llama.cpp would abort on (an assert kills the whole process)."""
    from ..gguf import open_gguf
    notes = open_gguf(path).llamacpp_refusals()
    if notes:
        raise OracleError(f"{path}: llama.cpp refuses this file: {notes[0]}")


def _skip(name: str) -> bool:
    # weights, views of the cache and leaves are not intermediates
    return (not name) or name.endswith((".weight", ".bias", ".scale")) or name.startswith(("cache_", "leaf_"))


class LlamaCpp:
    """One llama.cpp model + context (CPU, f32 KV cache, flash attention off). Use as a context manager.

    `decode(tokens)` appends tokens to the sequence and returns their logits [n, V]; while `recording`
    is set, named intermediates are captured into `tensors` / `order`.
    """

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 512, n_batch: int = 512, trace: bool = False,
                 n_threads: int | None = None, names: set[str] | None = None):
        L = self.L = _import()
        quiet_logs(L)
        self.path = os.fspath(path)
        self.tensors: dict[str, np.ndarray] = {}
        self.order: list[str] = []
        self.earlier: dict[str, list] = {}       # a name given again (deepseek2's four `q`): the ones before
        self.sequence: list[str] = []            # every recording's name, repeats kept (flips.graph_order)
        self.recording = trace
        self.n_past = 0
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        # No extra buffer types (weight repacking, AMX). On hosts with AMX (amx_int8) llama.cpp 0.3.36 puts
        # quantized weights in its AMX buffer, then crashes: llama_decode segfaulted on Q8_0 llama models
        # (2026-12-02), and a 3-D quantized attn_k_b / attn_v_b meets a permuted q_nope (deepseek2.cpp:560)
        # that AMX's supports_op refuses (amx.cpp:152-154): GGML_ASSERT(*cur_backend_id != -1) or a segfault.
        # The plain ggml-cpu mul_mat rounds activations the same way (docs/quant.md), so the oracle's
        # numbers keep their meaning.
        mp.use_extra_bufts = False
        precheck(self.path)
        _ERRORS.clear()
        self.model = L.llama_model_load_from_file(self.path.encode(), mp)
        if not self.model:
            raise OracleError(f"{self.path}: llama.cpp refused to load the model: {llamacpp_reason() or '(no reason logged)'}")

        def cb(t, ask, user):
            name = qggml.tensor_view(t).name.decode("utf-8", errors="replace")
            if _skip(name) or (names is not None and name not in names):
                return not ask
            if ask:
                return self.recording
            got = qggml.read_tensor(t)
            if got is not None and self.recording:
                if name in self.tensors:
                    self.earlier.setdefault(name, []).append(self.tensors[name])
                self.tensors[name] = got[1]
                if name in self.order:
                    self.order.remove(name)
                self.order.append(name)
                self.sequence.append(name)
            return True

        self._cb = L.ggml_backend_sched_eval_callback(cb)      # kept alive as long as the context
        cp = L.llama_context_default_params()
        cp.n_ctx = int(n_ctx)
        cp.n_batch = cp.n_ubatch = int(n_batch)
        cp.n_seq_max = 1
        cp.type_k = cp.type_v = GGML_TYPE_F32
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.n_threads = cp.n_threads_batch = int(n_threads or os.cpu_count() or 1)
        cp.no_perf = True
        if trace:
            cp.cb_eval = self._cb
            cp.cb_eval_user_data = None
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise OracleError(f"{self.path}: llama.cpp could not create a context (n_ctx = {n_ctx})")
        self.n_batch = int(n_batch)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)

    def decode(self, tokens) -> np.ndarray:
        L = self.L
        tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise OracleError(f"decode: {n} tokens, the batch holds 1..{self.n_batch}")
        b = self.batch
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = self.n_past + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise OracleError(f"{self.path}: llama_decode returned {rc} at positions {self.n_past}..{self.n_past + n - 1}")
        self.n_past += n
        ptr = L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n * self.n_vocab,)).reshape(n, self.n_vocab).copy()

    def close(self):
        if getattr(self, "ctx", None):
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.L.llama_model_free(self.model)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def run_llamacpp(path: str | os.PathLike, tokens, *, chunks: list[int] | None = None, trace: bool = True,
                 n_ctx: int | None = None, n_threads: int | None = None, names: set[str] | None = None) -> OracleResult:
    """Decode `tokens` with llama.cpp; `chunks` splits them into successive decode calls (default: one).

    Returns logits for every position; with `trace`, the named intermediates of the *first* chunk.
    """
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    T = len(tokens)
    if T == 0:
        raise OracleError("no tokens to decode")
    chunks = chunks or [T]
    if sum(chunks) != T:
        raise OracleError(f"chunks {chunks} do not add up to {T} tokens")
    n_ctx = int(n_ctx or max(256, -(-T // 256) * 256))
    with LlamaCpp(path, n_ctx=n_ctx, n_batch=max(chunks), trace=trace, n_threads=n_threads, names=names) as lc:
        out, pos = [], 0
        for ci, n in enumerate(chunks):
            lc.recording = trace and ci == 0
            out.append(lc.decode(tokens[pos:pos + n]))
            pos += n
        return OracleResult(logits=np.concatenate(out), tensors=lc.tensors, order=lc.order, earlier=lc.earlier,
                            sequence=lc.sequence)


def generate_llamacpp(path: str | os.PathLike, tokens, n: int, *, n_ctx: int | None = None) -> tuple[list[int], np.ndarray]:
    """Greedy continuation by llama.cpp: returns the n new ids and the logits that chose each, [n, V]."""
    tokens = list(np.asarray(tokens, dtype=np.int64).reshape(-1))
    n_ctx = int(n_ctx or max(256, -(-(len(tokens) + n) // 256) * 256))
    with LlamaCpp(path, n_ctx=n_ctx, n_batch=max(len(tokens), 1)) as lc:
        logits = lc.decode(tokens)[-1:]
        ids, rows = [], []
        for _ in range(n):
            rows.append(logits[-1])
            ids.append(int(np.argmax(logits[-1])))
            if len(ids) < n:
                logits = lc.decode([ids[-1]])
        return ids, np.stack(rows)
