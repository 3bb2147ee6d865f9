"""Latent MoE (Kimi-K3): the routed experts run in a narrower space than the residual stream.

Legend: T tokens, D model dim, Dl latent width (`expert_latent_length`; 0 = D, no projection), E experts,
A active experts, I expert hidden dim, Is shared-expert hidden dim (I * expert_shared_count).

    logits = f @ ffn_gate_inp.T                         router on the FULL-width input   ffn_moe_logits  [T, E]
    xl     = f @ ffn_routed_down.T                      (when Dl > 0)                                    [T, Dl]
    y      = routed_experts(xl, logits)                 sigmoid + exp_probs_b, SiTU experts  ffn_moe_out [T, Dl]
    y      = rms_norm(y) * ffn_routed_norm              (optional)                                       [T, Dl]
    y      = y @ ffn_routed_up.T                        (when Dl > 0)                                    [T, D]
    y     += situ(f @ ffn_gate_shexp.T, f @ ffn_up_shexp.T) @ ffn_down_shexp.T   ffn_shexp   (optional)
                                                                                         ffn_out [T, D]

llama.cpp: `build_latent_moe` (src/models/kimi-k3.cpp:570-618) around `build_moe_ffn` given the logits
(src/llama-graph.cpp:2007-2373, LLM_FFN_SITU at :2266-2280). The shared experts read the un-projected f.
"""
from __future__ import annotations

from dataclasses import replace

from ..ffn.dense import situ_ffn
from ..ops import rms_norm
from ..weights import W
from .block import MoEConfig, MoETensors, moe_table, routed_experts


def latent_moe_table(gf, il: int, mc: MoEConfig, tensors: MoETensors) -> list[W]:
    """moe_table (experts at width Dl) plus ffn_routed_down / ffn_routed_up (required when Dl > 0), the
    optional ffn_routed_norm, and the optional shared experts of width Is = n_ff_shexp (kimi-k3.cpp:144-164)."""
    p = f"blk.{il}."
    t = moe_table(gf, il, replace(mc, n_shared=0), tensors)
    Fs = mc.n_ff_shexp
    t += [W("ffn_gate_shexp", p + "ffn_gate_shexp.weight", lambda c, s: (Fs, c.n_embd), required=False),   # ne {D, Is}
          W("ffn_down_shexp", p + "ffn_down_shexp.weight", lambda c, s: (c.n_embd, Fs), required=False),
          W("ffn_up_shexp", p + "ffn_up_shexp.weight", lambda c, s: (Fs, c.n_embd), required=False)]
    for x in ("gate", "down", "up"):                      # the generic pass's scales: loaded, never applied
        t += [W(f"ffn_{x}_shexp_{k}", p + f"ffn_{x}_shexp.{k}", lambda c, s: (1,), required=False, dense=True)
              for k in ("scale", "input_scale")]
    if mc.n_latent > 0:
        Dl = mc.n_latent
        t += [W("ffn_routed_down", p + "ffn_routed_down.weight", lambda c, s: (Dl, c.n_embd)),     # ne {D, Dl}
              W("ffn_routed_up", p + "ffn_routed_up.weight", lambda c, s: (c.n_embd, Dl)),         # ne {Dl, D}
              W("ffn_routed_norm", p + "ffn_routed_norm.weight", lambda c, s: (Dl,), required=False, dense=True)]
    return t


def latent_moe(f, w, *, mc: MoEConfig, tensors: MoETensors, spec, eps: float, il: int, rt):
    """f [T, D] (the ffn_norm output) -> [T, D]; the routed experts' `.scale` apply if `tensors.apply_scales`
    (the shared experts' never: situ_ffn takes none)."""
    logits = rt.matmul(f, w.ffn_gate_inp)                                      # [T, E]
    rt.record("ffn_moe_logits", il, logits)
    xl = rt.matmul(f, w.ffn_routed_down) if getattr(w, "ffn_routed_down", None) is not None else f   # [T, Dl]
    y = routed_experts(xl, logits, w, mc=mc, tensors=tensors, spec=spec, il=il, rt=rt)   # [T, Dl]
    if getattr(w, "ffn_routed_norm", None) is not None:
        y = rms_norm(y, w.ffn_routed_norm, eps)
    if getattr(w, "ffn_routed_up", None) is not None:
        y = rt.matmul(y, w.ffn_routed_up)                                      # [T, Dl] -> [T, D]
    if getattr(w, "ffn_gate_shexp", None) is not None:
        s = situ_ffn(f, w, beta=mc.situ_beta, linear_beta=mc.situ_linear_beta, rt=rt, suffix="_shexp")   # [T, D]
        rt.record("ffn_shexp", il, s)
        y = y + s
    return y                                                                   # ffn_out, recorded by the caller
