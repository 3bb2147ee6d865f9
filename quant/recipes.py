"""Mixed-precision recipes: which ggml type every tensor of a GGUF is rewritten to.

A recipe is an ordered list of rules, one per line, `#` starting a comment:

    PATTERN   TYPE          # fnmatch glob on the GGUF tensor name; the first matching rule wins
    blk.*.ffn_*_exps.weight   Q2_K
    blk.*.attn_*.weight       Q8_0
    *                         Q4_K

TYPE is a ggml type name (Q4_K, q8_0, IQ2_XXS, F16, ...) or `keep`; a tensor no rule matches is kept.
Then, as llama.cpp's quantizer does (`src/llama-quant.cpp`):

1. tensors llama.cpp never quantizes are kept as they are (`tensor_allows_quantization`): 1-D tensors
   (norms, biases, scales), names not ending in `weight`, `*_norm.weight`, MoE routers
   (`ffn_gate_inp.weight`), positional embeddings, token types, conv1d / shortconv kernels, and a few
   tiny tables (listed in NEVER_QUANTIZED); integer tensors as well.
2. a row width that is not a multiple of the chosen type's block falls back (`tensor_type_fallback`):
   Q2_K, Q3_K, Q2_0, TQ1_0, TQ2_0 -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0; the 256-block
   IQ types -> IQ4_NL; and F16 when even the fallback does not fit. Other 256- or 128-block types have
   no fallback in llama.cpp; here they are an error naming the tensor.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from .formats import GGMLType, UnknownTypeError, type_info
from .ref import QuantError

T = GGMLType


class RecipeError(QuantError):
    """A recipe that cannot be used (unknown name, unknown type, malformed line), or a tensor it cannot place."""


# substrings of tensor names llama.cpp keeps as they are (tensor_allows_quantization)
NEVER_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                   "per_layer_model_proj", "position_embd.weight", "token_types.weight", "ssm_conv1d",
                   "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
                   "time_mix_first.weight", "attn_rel_b.weight")

# tensor_type_fallback: a type whose block does not divide the row width -> the 32-block type llama.cpp uses
FALLBACK = {T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL,
            T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
            T.Q2_0: T.Q4_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
            T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}

INTEGER_TYPES = (T.I8, T.I16, T.I32, T.I64)
NOT_WEIGHT_TYPES = (T.Q8_K, T.Q8_1)        # activation-only types: ggml-cpu cannot multiply by them

NAMED = {
    "f32": "* F32",
    "f16": "* F16",
    "bf16": "* BF16",
    "q8_0": "* Q8_0",
    "q6_k": "* Q6_K",
    "q4_k": "* Q4_K",
    "q2_k": "* Q2_K",
    # like llama.cpp's Q4_K_M, without its per-layer choice: attn_v and ffn_down get Q6_K in every layer
    "q4_k_m": """
        output.weight               Q6_K
        blk.*.attn_v.weight         Q6_K
        blk.*.ffn_down.weight       Q6_K
        blk.*.ffn_down_exps.weight  Q6_K
        *                           Q4_K
    """,
    # a big MoE on a budget: routed experts (most of the parameters) in 2 bits, attention in 8 bits,
    # shared experts, dense layers, embeddings and output in 6 bits
    "moe-q2k": """
        blk.*.ffn_*_exps.weight     Q2_K
        blk.*.attn_*.weight         Q8_0
        *                           Q6_K
    """,
    # experts in IQ2_XXS (ggml's quantizer, importance matrix of ones), shared weights Q8_0
    "moe-iq2": """
        blk.*.ffn_*_exps.weight     IQ2_XXS
        *                           Q8_0
    """,
}


@dataclass(frozen=True)
class Rule:
    pattern: str
    type: GGMLType | None           # None: keep the source type


@dataclass(frozen=True)
class Recipe:
    name: str
    rules: tuple[Rule, ...]

    def rule_type(self, name: str) -> GGMLType | None:
        for r in self.rules:
            if fnmatch.fnmatchcase(name, r.pattern):
                return r.type
        return None


def parse_recipe(text: str, name: str = "recipe") -> Recipe:
    """Parse the rule text; errors name the recipe and the line."""
    rules = []
    for no, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace("=", " ").split()
        if len(parts) != 2:
            raise RecipeError(f"{name}:{no}: expected 'PATTERN TYPE', got {line!r}")
        pattern, tname = parts
        if tname.lower() == "keep":
            rules.append(Rule(pattern, None))
            continue
        try:
            t = type_info(tname).type
        except UnknownTypeError:
            raise RecipeError(f"{name}:{no}: unknown ggml type {tname!r}; known: "
                              f"{', '.join(m.name for m in GGMLType)} or keep") from None
        if t in INTEGER_TYPES + NOT_WEIGHT_TYPES or t == T.F64:
            raise RecipeError(f"{name}:{no}: {t.name} is not a weight type llama.cpp can multiply by")
        rules.append(Rule(pattern, t))
    if not rules:
        raise RecipeError(f"{name}: the recipe has no rules")
    return Recipe(name, tuple(rules))


def load_recipe(spec: str) -> Recipe:
    """A named recipe (see NAMED) or a path to a recipe file."""
    if spec.lower() in NAMED:
        return parse_recipe(NAMED[spec.lower()], spec.lower())
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            return parse_recipe(f.read(), spec)
    raise RecipeError(f"recipe {spec!r} is neither a file nor a named recipe ({', '.join(NAMED)})")


def allows_quantization(name: str, shape: tuple[int, ...], src: GGMLType) -> bool:
    """llama.cpp's `tensor_allows_quantization`: 2-D and 3-D weights, minus the NEVER_QUANTIZED ones."""
    return (len(shape) >= 2 and name.endswith("weight") and src not in INTEGER_TYPES
            and not any(s in name for s in NEVER_QUANTIZED))


def choose_type(recipe: Recipe, name: str, shape: tuple[int, ...], src) -> tuple[GGMLType, str]:
    """(type to write, note) for tensor `name` of NumPy `shape` stored as `src` today."""
    src = type_info(src).type
    if not allows_quantization(name, shape, src):
        return src, "kept (never quantized)"
    want = recipe.rule_type(name)
    if want is None:
        return src, "kept"
    ncols = shape[-1]
    if ncols % type_info(want).block_size == 0:
        return want, ""
    fb = FALLBACK.get(want)
    if fb is None and type_info(want).block_size > 32:
        raise RecipeError(f"tensor {name!r}: rows of {ncols} do not fit {want.name} blocks of "
                          f"{type_info(want).block_size} and llama.cpp defines no fallback for {want.name}")
    if fb is None or ncols % type_info(fb).block_size:
        return T.F16, f"{want.name} -> F16 (rows of {ncols})"
    return fb, f"{want.name} -> {fb.name} (rows of {ncols})"
