"""The arch registry: one module per architecture, each wiring concept modules into blocks.

The contract an arch module fulfils is one declared structure, `spec.ArchSpec` (its docstring lists every
member): the forward (`Model.forward` only loops over it)

    ARCH, config_from_gguf, load_globals, load_layer, new_state, embed, block, head

and the per-arch data the tools read from the spec instead of naming archs

    PRESETS, synth_plan, synth_metadata, synth_resolve (optional)    refengine.synth
    MATMUL_INPUTS                                                    refengine.flips
    ATTN_FORMS (optional, default ())                                Model.new_state, the decode tests
    LOCAL_INPUTS (optional, default True)                            Model.forward_local, `compare --local`

`spec_of(module)` builds an arch's spec from the module's members of the same names (a missing required one
is an `ArchSpecError` naming the arch and the member); `ARCHS` maps general.architecture to the spec and
`get_arch` returns it. No arch imports another arch (siblings share a family module, e.g. deepseek_family).
Adding one: a module here and one line in ARCHS.
"""
from __future__ import annotations

from ..errors import UnsupportedArchError
from . import deepseek2, deepseek4, deepseek32, glm5_next, glm_dsa, kimi_k3, kimi_linear, llama, qwen3moe, qwen3next, qwen4exp
from .spec import ArchSpec, ArchSpecError, spec_of  # noqa: F401  (the contract)

ARCHS: dict[str, ArchSpec] = {s.ARCH: s for s in map(spec_of, (
    llama, qwen3moe, deepseek2, deepseek32, glm_dsa, qwen3next, kimi_linear, kimi_k3, deepseek4, qwen4exp, glm5_next))}


def get_arch(name, path: str = "<gguf>") -> ArchSpec:
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
