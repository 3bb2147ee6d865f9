"""The dense gated feed-forward block (`build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR)`, src/llama-graph.cpp).

Legend: T tokens, D model dim, F hidden dim.

    up   = (h @ W_up.T   + b_up)   * s_up                   ffn_up    [T, F]
    gate = (h @ W_gate.T + b_gate) * s_gate                 ffn_gate  [T, F]
    a    = act(gate) * up          (act = silu: SwiGLU)     ffn_swiglu
    y    = (a @ W_down.T + b_down) * s_down                 ffn_down  [T, D]

Biases come before the scale here, unlike `build_qkv`. The same block serves as a dense layer's FFN
(`ffn_gate` / `ffn_up` / `ffn_down`) and as DeepSeek's shared experts (`ffn_*_shexp`): `kind` picks the
tensor names, and `n_ff` the hidden size of the table.
"""
from __future__ import annotations

from ..ops import swiglu
from ..weights import W

ACTIVATIONS = {"silu": (swiglu, "ffn_swiglu")}  # act -> (act(gate) * up as one function, llama.cpp's name of it)


def dense_ffn_table(il: int, n_ff, *, suffix: str = "", extras: bool = True) -> list[W]:
    """ffn_{gate,up,down}{suffix}.weight with optional .bias / .scale / .input_scale (when `extras`).

    n_ff: (cfg, spec) -> hidden size F.   suffix "" for a dense layer, "_shexp" for shared experts."""
    p = f"blk.{il}."
    D = lambda c, s: c.n_embd                                        # noqa: E731
    shapes = {"gate": lambda c, s: (n_ff(c, s), c.n_embd), "up": lambda c, s: (n_ff(c, s), c.n_embd),
              "down": lambda c, s: (c.n_embd, n_ff(c, s))}
    out_dim = {"gate": lambda c, s: (n_ff(c, s),), "up": lambda c, s: (n_ff(c, s),), "down": lambda c, s: (D(c, s),)}
    t = []
    for x in ("gate", "down", "up"):
        name = f"ffn_{x}{suffix}"
        t.append(W(name, p + f"{name}.weight", shapes[x]))
        if extras:
            t += [W(f"{name}_bias", p + f"{name}.bias", out_dim[x], required=False, dense=True),
                  W(f"{name}_scale", p + f"{name}.scale", lambda c, s: (1,), required=False, dense=True),
                  W(f"{name}_input_scale", p + f"{name}.input_scale", lambda c, s: (1,), required=False, dense=True)]
    return t


def dense_ffn(h, w, *, il, rt, suffix: str = "", act: str = "silu", scales: bool = True, glu=None):
    """h [T, D] -> [T, D]. Weights `w.ffn_{gate,up,down}{suffix}` (+ optional _bias / _scale).

    scales=False: `.scale` tensors are loaded but not applied (deepseek2's graph passes none to build_ffn).
    glu: (fn(gate, up), trace name) in place of act(gate) * up (DeepSeek-V4's clamped SwiGLU, moe/hash_routing.py)."""
    glu_fn, act_name = ACTIVATIONS[act] if glu is None else glu

    def proj(x, part, y=None):
        name = f"ffn_{part}{suffix}"
        y = rt.matmul(x, getattr(w, name)) if y is None else y
        rt.record(f"ffn_{part}", il, y)
        b, s = getattr(w, name + "_bias", None), getattr(w, name + "_scale", None) if scales else None
        if b is not None:
            y = y + b
            rt.record(f"ffn_{part}_b", il, y)
        if s is not None:
            y = y * s
            rt.record(f"ffn_{part}_s", il, y)
        return y

    up_, gate_ = rt.matmul_many(h, [getattr(w, f"ffn_up{suffix}"), getattr(w, f"ffn_gate{suffix}")])  # one product
    up = proj(h, "up", up_)                                              # [T, F]   where a device takes both
    gate = proj(h, "gate", gate_)                                        # [T, F]
    a = glu_fn(gate, up)                                                 # [T, F]
    rt.record(act_name, il, a)
    return proj(a, "down")                                               # [T, D]


def situ_ffn(h, w, *, beta: float, linear_beta: float, rt, suffix: str = ""):
    """Kimi-K3's gated FFN with SiTU instead of SiLU (src/models/kimi-k3.cpp:315-320 for a dense layer,
    :607-613 for the shared experts; llama.cpp's build_ffn aborts on SITU, so the graph multiplies by hand
    and names no intermediate): situ(h @ W_gate.T, h @ W_up.T) @ W_down.T.   h [T, D] -> [T, D]."""
    from ..ops.activations import situ
    g, u = rt.matmul_many(h, [getattr(w, f"ffn_gate{suffix}"), getattr(w, f"ffn_up{suffix}")])   # [T, F] each
    return rt.matmul(situ(g, u, beta, linear_beta), getattr(w, f"ffn_down{suffix}"))   # [T, D]
