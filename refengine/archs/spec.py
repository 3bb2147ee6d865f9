"""The arch contract as one declared structure: `ArchSpec`, built from an arch module by `spec_of`.

Each field is the arch module's attribute of the same name (functions lower case, data upper case, as the
modules write them). The registry (`refengine.archs.ARCHS`) holds one spec per arch, and every tool reads
the spec's fields: nothing outside `spec_of` asks a module whether it has a member.

    required, the forward (`refengine.model.Model` calls them in this order)
    ARCH                                     general.architecture value
    config_from_gguf(gf) -> ModelConfig      typed, per-layer structure as data (cfg.layers[il])
    load_globals(gf, cfg) -> ns              token embedding, output, rope factors (refengine.globals)
    load_layer(gf, cfg, il) -> ns            block il's tensors, fields named after the GGUF tensors
    new_state(cfg, attn_form) -> [container] one per layer, made by the layer's attention module; attn_form:
                                             one of ATTN_FORMS, or None for each attention's default
    embed(g, cfg, step, rt) -> x             the residual carried between blocks ([T, D], or more streams)
    block(x, w, *, cfg, il, state, step, rt) -> x    state: this layer's container; step: refengine.step.Step
    head(x, g, cfg, rt) -> logits            [T, V]

    required, the tools
    PRESETS                                  {preset name: {entry: value}}, "tiny" among them (refengine.synth)
    synth_plan(p, *, all_optional, fused_qkv, tied_output, rope_scaling) -> [TensorPlan]     (refengine.synth)
    synth_metadata(p, *, all_optional, rope_scaling, name) -> [(key, value, gguf type)]      (refengine.synth)
    MATMUL_INPUTS                            [(graph-name regex, [weight names with {il}]) or (.., .., k)]:
                                             the k-th tensor of that llama.cpp name (refengine.flips)

    optional (default)
    synth_resolve(p, layers) -> p            cut a preset to `layers` blocks (`cut_layers`: the first N)
    ATTN_FORMS        (())                   the attention forms a sequence may run, the default first
                                             (`Model.new_state(attn_form)`; tests run every one)
    LOCAL_INPUTS      (True)                 False when a block reads more than the previous block's output
                                             (kimi-k3's attention residuals): `compare --local` is refused
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Callable


class ArchSpecError(TypeError):
    """An arch module that does not fulfil the contract (a missing member, or one of the wrong kind)."""


def cut_layers(p: dict, layers: int | None) -> dict:
    """The default `synth_resolve`: `layers=N` keeps the first N blocks of the preset `p`."""
    return p if layers is None else dict(p, n_layer=layers)


@dataclass(frozen=True, eq=False, repr=False)
class ArchSpec:
    ARCH: str
    config_from_gguf: Callable
    load_globals: Callable
    load_layer: Callable
    new_state: Callable
    embed: Callable
    block: Callable
    head: Callable
    PRESETS: dict
    synth_plan: Callable
    synth_metadata: Callable
    MATMUL_INPUTS: list
    synth_resolve: Callable = cut_layers
    ATTN_FORMS: tuple = ()
    LOCAL_INPUTS: bool = True

    def __post_init__(self):
        def bad(member, why):
            return ArchSpecError(f"arch {self.ARCH!r}: {member} {why} (the contract: refengine/archs/spec.py)")
        if not isinstance(self.ARCH, str) or not self.ARCH:
            raise ArchSpecError(f"arch module: ARCH must be a non-empty string, is {self.ARCH!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if str(f.type).startswith("Callable") and not callable(v):
                raise bad(f.name, f"must be a function, is {type(v).__name__}")
        if not isinstance(self.PRESETS, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                          for k, v in self.PRESETS.items()):
            raise bad("PRESETS", "must map preset names to dicts of entries")
        for row in self.MATMUL_INPUTS if isinstance(self.MATMUL_INPUTS, (list, tuple)) else [None]:
            if not (isinstance(row, tuple) and len(row) in (2, 3) and isinstance(row[0], str)
                    and isinstance(row[1], (list, tuple)) and all(isinstance(n, str) for n in row[1])
                    and (len(row) == 2 or isinstance(row[2], int))):
                raise bad("MATMUL_INPUTS", f"must be a list of (regex, [weight names]) or (regex, [names], k) rows, "
                                           f"has {row!r}")
        if not isinstance(self.ATTN_FORMS, tuple) or not all(isinstance(s, str) for s in self.ATTN_FORMS):
            raise bad("ATTN_FORMS", f"must be a tuple of form names, is {self.ATTN_FORMS!r}")
        if not isinstance(self.LOCAL_INPUTS, bool):
            raise bad("LOCAL_INPUTS", f"must be a bool, is {self.LOCAL_INPUTS!r}")

    def __repr__(self) -> str:
        return f"ArchSpec({self.ARCH!r})"


REQUIRED = tuple(f.name for f in fields(ArchSpec) if f.default is MISSING)
OPTIONAL = {f.name: f.default for f in fields(ArchSpec) if f.default is not MISSING}


def spec_of(module) -> ArchSpec:
    """The spec of an arch module: its members by name, the optional ones defaulted; a clear error naming the
    arch and every missing required member."""
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        arch = getattr(module, "ARCH", None)
        raise ArchSpecError(f"arch module {module.__name__}" + (f" ({arch!r})" if arch else "")
                            + f" lacks required member(s) {', '.join(missing)} (the contract: refengine/archs/spec.py)")
    return ArchSpec(**{f.name: getattr(module, f.name) for f in fields(ArchSpec) if hasattr(module, f.name)})
