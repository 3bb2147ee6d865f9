"""The arch registry: one module per architecture, each wiring concept modules into blocks.

The contract an arch module fulfils (`Model.forward` only loops over it):

    ARCH                               general.architecture value
    config_from_gguf(gf) -> ModelConfig      typed, per-layer structure as data (cfg.layers[il])
    load_globals(gf, cfg) -> ns        token embedding, output, rope factors (refengine.globals)
    load_layer(gf, cfg, il) -> ns      block il's tensors, fields named after the GGUF tensors
    new_state(cfg) -> [container]      one per layer, made by the layer's attention module (refengine.cache)
    embed(g, cfg, step, rt) -> x       the residual carried between blocks ([T, D], or more streams)
    block(x, w, *, cfg, il, state, step, rt) -> x      state: this layer's container; step: refengine.step.Step
    head(x, g, cfg, rt) -> logits      [T, V]

and the per-arch data the tools read from here instead of naming archs:

    PRESETS, synth_plan(p, **opts), synth_metadata(p, **opts)       refengine.synth
    MATMUL_INPUTS                                                   refengine.flips
    DEVICE_PATH                        the whole-forward GPU path may run it (refengine.cuda checks layer kinds)
    LOCAL_INPUTS                       optional, default True: False when a block reads more than the previous
                                       block's output (kimi-k3's attention residuals); `compare --local` is refused

No arch imports another arch. Adding one: a module here and one line in ARCHS.
"""
from __future__ import annotations

from ..errors import UnsupportedArchError
from . import deepseek2, deepseek32, glm_dsa, kimi_k3, kimi_linear, llama, qwen3moe, qwen3next

ARCHS = {m.ARCH: m for m in (llama, qwen3moe, deepseek2, deepseek32, glm_dsa, qwen3next, kimi_linear, kimi_k3)}


def get_arch(name, path: str = "<gguf>"):
    if name is None:
        raise UnsupportedArchError(f"{path}: required metadata key 'general.architecture' is missing")
    if not isinstance(name, str):
        from ..config import describe_value
        raise UnsupportedArchError(f"{path}: metadata key 'general.architecture' must be a string, "
                                   f"but is {describe_value(name)}")
    if name not in ARCHS:
        raise UnsupportedArchError(
            f"{path}: general.architecture = {name[:60]!r} is not implemented (available: {', '.join(sorted(ARCHS))})")
    return ARCHS[name]
