"""The model: `forward(tokens, state) -> logits`, with weights read lazily from the GGUF.

    x      = token_embd[tokens]                                [T, D]
    x      = block_il(x) for il in 0..n_layer-1                (per-arch wiring, archs/*.py)
    logits = rms_norm(x) * output_norm @ output.T              result_norm, result_output   [T, V]

Opening a model reads only metadata and the tensor table; a layer's weights are mmapped views that
are decoded when (and only as far as) a matmul needs them.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

import quant

from .archs import get_arch
from .cache import KVCache, ModelState
from .config import ModelConfig
from .errors import ConfigError
from .gguf import GGUFModel, open_gguf
from .ops import rms_norm
from .runtime import Runtime


class Model:
    def __init__(self, source: str | os.PathLike | GGUFModel, *, n_ctx: int | None = None):
        self.gf = source if isinstance(source, GGUFModel) else open_gguf(source)
        self.arch = get_arch(self.gf.get("general.architecture"), self.gf.path)
        self.cfg: ModelConfig = self.arch.config_from_gguf(self.gf)
        # context size: picks long/short rope factors like llama.cpp's n_ctx_seq
        self.n_ctx = int(n_ctx or min(self.cfg.n_ctx_train, 4096))
        self.g = self.arch.load_globals(self.gf, self.cfg)
        self._layers: dict[int, object] = {}

    @property
    def path(self) -> str:
        return self.gf.path

    def layer(self, il: int):
        if il not in self._layers:
            self._layers[il] = self.arch.load_layer(self.gf, self.cfg, il)
        return self._layers[il]

    def load_all(self) -> None:
        """Resolve every layer's tensor table now (shape and NaN checks of the small tensors); decodes no matrix."""
        for il in range(self.cfg.n_layer):
            self.layer(il)

    def unused_tensors(self) -> list[str]:
        """Tensors in the file that this arch's tables do not consume (llama.cpp refuses such files)."""
        self.load_all()
        used = set()
        for ns in [self.g, *self._layers.values()]:
            used.update(ns.tensor_names)
        return sorted(n for n in self.gf.tensors if n not in used)

    def new_state(self) -> ModelState:
        return ModelState(layers=[KVCache() for _ in range(self.cfg.n_layer)])

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """tokens [T] int -> [T, D] float32 (`ggml_get_rows(tok_embd, tokens)`)."""
        return quant.dequantize_rows(self.g.token_embd, tokens)

    def _check_tokens(self, tokens, n_past: int) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ConfigError("forward: no tokens given")
        if tokens.min() < 0 or tokens.max() >= self.cfg.n_vocab:
            bad = tokens[(tokens < 0) | (tokens >= self.cfg.n_vocab)][0]
            raise ConfigError(f"{self.path}: token id {bad} is outside the vocabulary [0, {self.cfg.n_vocab})")
        if n_past + tokens.size > self.n_ctx:
            raise ConfigError(f"{self.path}: {n_past + tokens.size} positions exceed the context size n_ctx = {self.n_ctx}")
        return tokens

    def head(self, x: np.ndarray, rt: Runtime) -> np.ndarray:
        """Final norm and output projection: x [T, D] -> logits [T, V]."""
        x = rms_norm(x, self.g.output_norm, self.cfg.rms_eps)
        rt.record("result_norm", -1, x)
        logits = rt.matmul(x, self.g.output)                                   # [T, V]
        if self.g.output_scale is not None:
            logits = logits * self.g.output_scale
        rt.record("result_output", -1, logits)
        if rt.check_finite and not np.all(np.isfinite(logits)):
            warnings.warn(f"{self.path}: logits contain NaN/inf", RuntimeWarning, stacklevel=3)
        return logits

    def forward(self, tokens, state: ModelState | None = None, rt: Runtime | None = None) -> np.ndarray:
        """tokens [T] -> logits [T, V]; appends the tokens to `state` (a fresh one when None)."""
        rt = rt or Runtime()
        state = state if state is not None else self.new_state()
        tokens = self._check_tokens(tokens, state.n_past)
        device_forward = rt.device_forward(self)                   # cuda backend: whole forward on the GPU
        if device_forward is not None:
            return device_forward(tokens, state)
        T = tokens.size
        pos = np.arange(state.n_past, state.n_past + T)                        # [T]
        rope = self.arch.rope_for(self.cfg, self.g, pos, self.n_ctx)           # cos, sin [T, R/2]
        x = self.embed(tokens)                                                 # [T, D]
        rt.record("embd", -1, x)
        for il in range(self.cfg.n_layer):
            x = self.arch.block(x, self.layer(il), cfg=self.cfg, il=il, cache=state, pos=pos, rope=rope, rt=rt)
        logits = self.head(x, rt)
        state.n_past += T
        return logits

    def forward_local(self, tokens, layer_inputs, head_input, rt: Runtime | None = None) -> np.ndarray:
        """Each block run on a given input instead of the previous block's output (one prefill from position 0).

        layer_inputs: n_layer arrays [T, D] (e.g. llama.cpp's `embd`, `l_out-0`, ...); head_input [T, D].
        Measures every layer's own error, free of what earlier layers accumulated.
        """
        rt = rt or Runtime()
        tokens = self._check_tokens(tokens, 0)
        T, D = tokens.size, self.cfg.n_embd
        pos = np.arange(T)
        rope = self.arch.rope_for(self.cfg, self.g, pos, self.n_ctx)
        rt.record("embd", -1, self.embed(tokens))
        for il in range(self.cfg.n_layer):
            x = np.asarray(layer_inputs[il], dtype=np.float32).reshape(T, D)
            self.arch.block(x, self.layer(il), cfg=self.cfg, il=il, cache=self.new_state(), pos=pos, rope=rope, rt=rt)
        return self.head(np.asarray(head_input, dtype=np.float32).reshape(T, D), rt)

    def generate(self, tokens, n: int, *, rt: Runtime | None = None, eos: int | None = None, on_token=None) -> list[int]:
        """Greedy continuation: prefill `tokens`, then decode one token at a time (KV cache). Returns the new ids."""
        state = self.new_state()
        logits = self.forward(tokens, state, rt)
        out: list[int] = []
        for _ in range(n):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if nxt == eos or len(out) == n:
                break
            logits = self.forward([nxt], state, rt)
        return out
