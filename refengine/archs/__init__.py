"""One module per architecture: tensor-name table, config reading and block wiring.

Each module provides `config_from_gguf(gf)`, `load_globals(gf, cfg)`, `load_layer(gf, cfg, il)`,
`block(x, w, *, cfg, il, cache, pos, rope, rt)` and `rope_for(cfg, g, pos, n_ctx)`.
"""
from __future__ import annotations

from ..errors import UnsupportedArchError
from . import llama, qwen3moe

ARCHS = {m.ARCH: m for m in (llama, qwen3moe)}


def get_arch(name, path: str = "<gguf>"):
    if name is None:
        raise UnsupportedArchError(f"{path}: required metadata key 'general.architecture' is missing")
    if name not in ARCHS:
        raise UnsupportedArchError(
            f"{path}: general.architecture = {name!r} is not implemented (available: {', '.join(sorted(ARCHS))})")
    return ARCHS[name]
