"""The tensors outside the blocks: token embedding, rope factor tensors, output norm and matrix.

    x      = token_embd[tokens]                         embd           [T, D]    (ggml_get_rows)
    logits = rms_norm(x) * output_norm @ output.T       result_norm, result_output   [T, V]

`output.weight` is optional: absent, the embedding is used (tied, TENSOR_DUPLICATED). An NVFP4 output
may carry `output.scale` (src/llama-model.cpp:1775-1785). Rope factor tensors: `rope_freqs` (Llama 3),
or the long/short factors of LongRoPE chosen by the context size (`llama_model::get_rope_factors`).
"""
from __future__ import annotations


import numpy as np


from .residual.pending import add_norm
from .weights import W, load_tensors

ONE = lambda c, s: (1,)                                              # noqa: E731


def global_table(cfg, *, rope_factor_tensors: bool = True) -> list[W]:
    half = lambda c, s: (c.n_rot // 2,)                              # noqa: E731
    t = [W("token_embd", "token_embd.weight", lambda c, s: (c.n_vocab, c.n_embd)),
         W("output_norm", "output_norm.weight", lambda c, s: (c.n_embd,), dense=True),
         W("output", "output.weight", lambda c, s: (c.n_vocab, c.n_embd), required=False)]
    if rope_factor_tensors:
        if cfg.rope_scaling_type != "longrope":
            t.append(W("rope_freqs", "rope_freqs.weight", half, required=False, dense=True))
        else:
            t += [W("rope_long", "rope_factors_long.weight", half, required=False, dense=True),
                  W("rope_short", "rope_factors_short.weight", half, required=False, dense=True)]
    return t


def load_globals(gf, cfg, *, rope_factor_tensors: bool = True):
    g = load_tensors(gf, global_table(cfg, rope_factor_tensors=rope_factor_tensors), cfg)
    for f in ("rope_freqs", "rope_long", "rope_short"):
        setattr(g, f, getattr(g, f, None))
    if g.output is None:                      # tied embeddings (TENSOR_DUPLICATED)
        g.output = g.token_embd
    g.output_scale = None
    if g.output.type.name == "NVFP4":
        extra = load_tensors(gf, [W("output_scale", "output.scale", ONE, required=False, dense=True),
                                  W("output_input_scale", "output.input_scale", ONE, required=False, dense=True)], cfg)
        g.output_scale = extra.output_scale
        g.tensor_names += extra.tensor_names
        g.tensor_rows.update(extra.tensor_rows)
    return g


def rope_factors(g, cfg, n_ctx: int):
    """`llama_model::get_rope_factors`: rope_freqs, else long/short factors chosen by the context size."""
    if getattr(g, "rope_freqs", None) is not None:
        return g.rope_freqs
    if cfg.rope_scaling_type == "longrope":
        return g.rope_long if n_ctx > cfg.n_ctx_orig_yarn else g.rope_short
    return None


def embed_tokens(g, tokens: np.ndarray, rt) -> np.ndarray:
    """tokens [T] -> [T, D] float32 (`ggml_get_rows(tok_embd, tokens)`)."""
    x = rt.embed_rows(g.token_embd, tokens)                             # (on the device when the ids are)
    rt.record("embd", -1, x)
    return x


def rms_head(x: np.ndarray, g, cfg, rt, *, where: str = "") -> np.ndarray:
    """Final norm and output projection: x [T, D] (or a PendingAdd: the last block's output added by the norm) ->
    logits [T, V]."""
    _, x = add_norm(x, g.output_norm, cfg.rms_eps)
    rt.record("result_norm", -1, x)
    logits = rt.matmul(x, g.output)                                      # [T, V]
    if g.output_scale is not None:
        logits = logits * g.output_scale
    rt.record("result_output", -1, logits)
    rt.warn_nonfinite(logits, f"{where}: logits contain NaN/inf")      # (a device's: read after the step)
    return logits
