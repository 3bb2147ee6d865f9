"""The model: `forward(tokens, state) -> logits`, with weights read lazily from the GGUF.

    x      = arch.embed(tokens)                                 the residual, e.g. [T, D]
    x      = arch.block(x, layer il, state.layers[il], step)    for il in 0..n_layer-1 (archs/*.py)
    logits = arch.head(x)                                       [T, V]

The arch owns the math of each piece (the contract is `refengine.archs.spec.ArchSpec`); this loop
only threads the residual, the per-layer state and the step (tokens, positions, rope) through it.

Opening a model reads only metadata and the tensor table; a layer's weights are mmapped views that
are decoded when (and only as far as) a matmul needs them.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
import weakref

import numpy as np

import quant

from .archs import get_arch
from .cache import ModelState
from .config import LlamaCppWouldRefuse, ModelConfig
from .errors import ConfigError, UnsupportedArchError
from .gguf import GGUFModel, open_gguf
from .runtime import Runtime
from .step import Step


N_CTX_DEFAULT = 4096     # n_ctx when none is asked for: min(n_ctx_train, this)
N_UBATCH_DEFAULT = 512   # llama.cpp's default n_ubatch (common/common.h, `n_ubatch = 512`)


def last_rows(x):
    """The residual a block hands the head, cut to its last position: an array [T, ...] -> [1, ...]; a dataclass
    of such arrays (e.g. Kimi K3's ResidualStream: the running sum and its bank; a PendingAdd and its SlotSum) field
    by field, an absent one (None) left so."""
    if x is None:
        return None
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: last_rows(getattr(x, f.name)) for f in dataclasses.fields(x)})
    if isinstance(x, (list, tuple)):
        return type(x)(last_rows(v) for v in x)
    return x[-1:]


class Model:
    def __init__(self, source: str | os.PathLike | GGUFModel, *, n_ctx: int | None = None,
                 n_ubatch: int = N_UBATCH_DEFAULT):
        self.gf = source if isinstance(source, GGUFModel) else open_gguf(source)
        self.arch = get_arch(self.gf.get("general.architecture"), self.gf.path)
        self.cfg: ModelConfig = self.arch.config_from_gguf(self.gf)
        for note in self.gf.llamacpp_refusals():          # read here; llama.cpp refuses: say so (refengine info)
            warnings.warn(f"{self.gf.path}: llama.cpp refuses this file: {note}", LlamaCppWouldRefuse, stacklevel=2)
        # context size: picks long/short rope factors like llama.cpp's n_ctx_seq. Above the trained context it is
        # allowed with a warning, as llama.cpp allows it (llama_context: "possible training context overflow")
        self.n_ctx = int(n_ctx or min(self.cfg.n_ctx_train, N_CTX_DEFAULT))
        if self.n_ctx > self.cfg.n_ctx_train > 0:
            warnings.warn(f"{self.gf.path}: n_ctx = {self.n_ctx} > n_ctx_train = {self.cfg.n_ctx_train}: possible "
                          f"training context overflow", stacklevel=2)
        # the physical batch: a longer forward call runs as successive ubatches of this many tokens (llama.cpp's
        # n_ubatch), so activations and attention scores are bounded by n_ubatch rows whatever the prompt's length
        if int(n_ubatch) < 1:
            raise ConfigError(f"n_ubatch = {n_ubatch}: at least 1 token per ubatch")
        self.n_ubatch = int(n_ubatch)
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

    def new_state(self, attn_form: str | None = None) -> ModelState:
        """A fresh sequence: one state container per layer, made by the arch's attention modules.

        attn_form: where an attention has two forms, which one this sequence runs (MLA: "absorbed", the one
        llama.cpp runs and the default, or "naive"); the form is carried by the state's containers."""
        return ModelState(layers=self.arch.new_state(self.cfg, attn_form))

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

    def _step(self, tokens: np.ndarray, n_past: int, device=None) -> Step:
        """The step of `tokens` at positions n_past..; on a device (a resident run) the token ids and positions are
        put there, the two uploads of a step: everything after reads them where they are."""
        pos = np.arange(n_past, n_past + tokens.size)
        if device is not None:
            tokens, pos = device.put(tokens), device.put(pos)
            device.step_positions = (pos, self.n_ctx, {})   # checked < n_ctx: tables by position may be gathered
                                                         # at them (once a step: the dict)
        return Step(tokens=tokens, pos=pos, n_ctx=self.n_ctx, g=self.g, device=device)

    def prepare_step(self, tokens, state: ModelState, rt: Runtime) -> Step:
        """The step of the next `tokens` of `state`'s sequence (checked; on rt's device in a resident run), for
        `run_step`."""
        return self._step(self._check_tokens(tokens, state.n_past), state.n_past, rt.device)

    def run_step(self, step: Step, state: ModelState, rt: Runtime, *, last_only: bool = False):
        """Embedding, every block and the head on one step -> logits [T, V] where the residual lives (a device
        array in a resident run: `rt.to_host` reads it and the deferred NaN checks), appended to `state`.
        last_only: the last block's FFN half and the head on the last position only -> [1, V] (what a prompt needs
        for the next token, and what llama.cpp computes for a batch whose logits are not asked for row by row: its
        graphs gather `inp_out_ids` before the last block's FFN); the state is the same.

        In a resident run, after a warm-up step has uploaded the weights, a decode step (T = 1) of an arch whose
        modules keep to the device (deepseek2: tests/test_capture.py) runs all of this under `rt.device.strict()`
        with the same op signature from one token to the next: the span a CUDA graph captures
        (docs/device_path.md)."""
        a, cfg = self.arch, self.cfg
        if rt.device is not None and (state.home is None or state.home() is not rt.device):   # a state another
            rt.device.adopt(state.layers)                 # Runtime ran: its arrays are this device's from now on
            state.home = weakref.ref(rt.device)           # (Device.adopt; a weak reference: no walk of the state
            #                                               reaches the Device through it, nor keeps it alive)
        step.last_out = bool(last_only)                         # the last block's FFN half on the last row only
        x = rt.to_device(a.embed(self.g, cfg, step, rt))        # the residual, e.g. [T, D] (on the device if resident)
        for il in range(cfg.n_layer):
            x = a.block(x, self.layer(il), cfg=cfg, il=il, state=state.layers[il], step=step, rt=rt)
        logits = a.head(last_rows(x) if last_only else x, self.g, cfg, rt)    # [T, V] (or [1, V])
        state.n_past += step.T
        return logits

    def forward(self, tokens, state: ModelState | None = None, rt: Runtime | None = None, *,
                n_ubatch: int | None = None, progress: bool = False, last_only: bool = False) -> np.ndarray:
        """tokens [T] -> logits [T, V]; appends the tokens to `state` (a fresh one when None).
        last_only: logits of the last token only, [1, V]: each ubatch's last block runs its FFN half and the head
        on its last row alone (`Step.out_rows`; a prompt's work as llama.cpp does it when only the next token is
        wanted: its `inp_out_ids`); the state is the same as without.

        The tokens run as successive ubatches of `n_ubatch` through the per-layer state, as llama.cpp splits a batch
        into ubatches: decode equals prefill, so the logits are one prefill's (up to float32 summation order).
        n_ubatch None: `self.n_ubatch`, except with a trace (`rt.trace`): then one batch, so every traced tensor is
        the whole batch's, as the oracle runs llama.cpp (n_batch = n_ubatch = T). With a trace and an n_ubatch given,
        the trace records the first ubatch only, as the oracle records the first of several decode calls
        (`run_llamacpp(chunks=...)`). Teacher forcing (`rt.force_inputs`, llama.cpp's whole-batch tensors) always
        runs one batch. progress: a tqdm bar over the ubatches (stderr, cleared when done) when there are several,
        with the expert cache's hit rate when the run has one."""
        rt = rt or Runtime()
        state = state if state is not None else self.new_state(rt.attn_form)
        tokens = self._check_tokens(tokens, state.n_past)
        if rt.force_inputs or (n_ubatch is None and rt.trace is not None):
            ub = tokens.size
        else:
            ub = int(n_ubatch or self.n_ubatch)
        if tokens.size <= ub:
            return self._forward_ubatch(tokens, state, rt, last_only=last_only)
        quiet = rt.untraced()                                      # the later ubatches: nothing recorded
        starts = range(0, tokens.size, ub)
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=tokens.size, unit="tok", desc="prefill", leave=False)
        out = []
        for i in starts:
            last = last_only and i + ub >= tokens.size             # (every ubatch of a last_only prompt computes its
            logits = self._forward_ubatch(tokens[i:i + ub], state, rt if i == 0 else quiet,      # last row only: its
                                          last_only=last_only)     # last block's FFN half and the head on one row)
            if not last_only or last:
                out.append(logits)
            if bar is not None:
                bar.update(min(ub, tokens.size - i))
                cache = getattr(rt, "expert_cache", None)
                if cache is not None and cache.hit_rate is not None:
                    bar.set_postfix(expert_hit=f"{cache.hit_rate:.3f}", moved=f"{cache.bytes_moved / 2**30:.2f}GiB")
        if bar is not None:
            bar.close()
        return np.concatenate(out)                                                   # [T, V]

    def _forward_ubatch(self, tokens: np.ndarray, state: ModelState, rt: Runtime, *,
                        last_only: bool = False) -> np.ndarray:
        """One ubatch: tokens [T] (checked) -> logits [T, V] (last_only: [1, V]), appended to `state`."""
        step = self._step(tokens, state.n_past, rt.device)
        return rt.to_host(self.run_step(step, state, rt, last_only=last_only))

    def forward_local(self, tokens, layer_inputs, head_input, rt: Runtime | None = None) -> np.ndarray:
        """Each block run on a given input instead of the previous block's output (one prefill from position 0).

        layer_inputs: n_layer arrays shaped like the residual (e.g. llama.cpp's `embd`, `l_out-0`, ...);
        head_input likewise. Measures every layer's own error, free of what earlier layers accumulated.
        """
        rt = rt or Runtime()
        a, cfg = self.arch, self.cfg
        if not a.LOCAL_INPUTS:
            raise UnsupportedArchError(
                f"{self.path}: {cfg.arch} blocks read more than llama.cpp's l_out of the previous block (Kimi-K3's "
                f"attention residuals mix a bank of earlier checkpoints; DeepSeek-V4 carries 4 hyper-connection "
                f"streams), so a block cannot be fed llama.cpp's l_out alone: compare without --local")
        tokens = self._check_tokens(tokens, 0)
        step = self._step(tokens, 0)
        x0 = a.embed(self.g, cfg, step, rt)
        fresh = self.new_state(rt.attn_form)
        for il in range(cfg.n_layer):
            x = np.asarray(layer_inputs[il], dtype=np.float32).reshape(x0.shape)
            a.block(x, self.layer(il), cfg=cfg, il=il, state=fresh.layers[il], step=step, rt=rt)
        return a.head(np.asarray(head_input, dtype=np.float32).reshape(x0.shape), self.g, cfg, rt)

    def generate(self, tokens, n: int, *, rt: Runtime | None = None, eos: int | None = None, on_token=None,
                 state: ModelState | None = None, logits: np.ndarray | None = None, step=None) -> list[int]:
        """Greedy continuation: prefill `tokens`, then decode one token at a time (KV cache). Returns the new ids.
        step: a callable token id -> its logits [V] that decodes in place of `forward` (a GraphDecoder's `step`,
        holding the same state).

        state, logits: continue that sequence (e.g. one loaded from a state file, `refengine.state_file`) instead
        of a fresh one; `tokens` may then be empty, the first new id coming from `logits` (the last position's,
        [V] or [T, V]). The last new id is not fed: `state` ends holding every token but that one."""
        state = state if state is not None else self.new_state()
        if len(tokens):
            logits = self.forward(tokens, state, rt, last_only=True)        # (only the last row is read)
        elif logits is None:
            raise ConfigError("generate: no tokens given and no logits to continue from")
        logits = np.asarray(logits).reshape(-1, self.cfg.n_vocab)
        out: list[int] = []
        for _ in range(n):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if nxt == eos or len(out) == n:
                break
            logits = self.forward([nxt], state, rt) if step is None else np.asarray(step(nxt)).reshape(1, -1)
        return out
