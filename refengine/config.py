"""ModelConfig: every hyperparameter the forward pass uses, each read from a named GGUF key.

Built only by an arch's `config_from_gguf` (`refengine.archs`; config imports no arch). Keys are written
without the `{arch}.` prefix in the comments (`attention.head_count` means `llama.attention.head_count` for
a `llama` file). Defaults are the ones llama.cpp applies (`llama_model_base::load_hparams`,
`src/llama-model.cpp:1298`, and the arch's `load_arch_hparams`); a missing required key is a
`MissingKeyError` naming the key and the file.

Per-layer structure (attention kind, dense or MoE feed-forward, head counts) is explicit data in
`layers`, never computed inside a block.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from .errors import ConfigError, InvalidKeyError, MissingKeyError

ROPE_NORM = 0   # rotate pairs (x[2i], x[2i+1])          (LLAMA_ROPE_TYPE_NORM)
ROPE_NEOX = 2   # rotate pairs (x[i], x[i + n_rot/2])     (LLAMA_ROPE_TYPE_NEOX)


class ConfigWarning(UserWarning):
    """A metadata key that would change the math elsewhere but that llama.cpp ignores for this arch."""


@dataclass(frozen=True)
class LayerSpec:
    attn: str                 # "mha" (softmax attention over a KV cache) | "mla" (latent attention)
                              # | "dsa" (latent attention under a lightning-indexer top-k mask)
                              # | "gdn" (gated delta net) | "kda" (Kimi delta attention): linear attention
                              # over a recurrent state | "qsa" (softmax attention under a QSA block indexer's
                              # selection, attention/qsa.py)
    ffn: str                  # "dense" | "moe"
    n_head: int               # attention.head_count (scalar or per-layer array)
    n_head_kv: int            # attention.head_count_kv (default: n_head)
    n_ff: int                 # feed_forward_length (dense layers)
    n_ff_exp: int             # expert_feed_forward_length (MoE layers)
    n_expert_used: int        # expert_used_count (scalar or per-layer array)
    attn_cfg: object = None   # the attention module's typed config (e.g. attention.mla.MLAConfig; a DSA layer's
                              # attention.dsa.DSAConfig carries its MLA and its indexer, full or shared)
    moe: object = None        # moe.block.MoEConfig of a MoE layer


# Keys that change the math of other archs but that llama.cpp's llama / qwen3moe loaders never read.
LLAMA_IGNORED_MATH_KEYS = (
    "attention.scale", "attention.clamp_kqv", "expert_weights_scale", "expert_weights_norm",
    "expert_gating_func", "expert_shared_count", "expert_shared_feed_forward_length",
    "leading_dense_block_count", "logit_scale", "embedding_scale", "residual_scale",
    "attention.sliding_window", "rope.scaling.yarn_log_multiplier", "final_logit_softcapping",
    "attn_logit_softcapping", "swiglu_clamp_exp", "swiglu_clamp_shexp",
)


@dataclass(frozen=True)
class ModelConfig:
    arch: str                 # general.architecture
    name: str                 # general.name (informational)
    n_vocab: int              # rows of token_embd.weight (checked against vocab_size / tokenizer.ggml.tokens)
    n_embd: int               # embedding_length
    n_layer: int              # block_count
    n_ctx_train: int          # context_length
    head_dim_k: int           # attention.key_length (default n_embd / head_count)
    head_dim_v: int           # attention.value_length (default n_embd / head_count)
    n_rot: int                # rope.dimension_count (default key_length)
    rms_eps: float            # attention.layer_norm_rms_epsilon (required)
    n_expert: int             # expert_count (default 0)
    rope_type: int            # fixed per arch by llama.cpp (llama_model_rope_type): NORM or NEOX
    rope_freq_base: float     # rope.freq_base (default 10000)
    rope_scaling_type: str    # rope.scaling.type: none | linear | yarn | longrope (default linear)
    rope_freq_scale: float    # 1 / rope.scaling.factor (or 1 / rope.scale_linear); 1 when absent or type none
    rope_attn_factor: float   # rope.scaling.attn_factor (default 1)
    n_ctx_orig_yarn: int      # rope.scaling.original_context_length (default context_length)
    causal_attn: bool = True       # attention.causal (default true; false = every cached position visible)
    n_expert_groups: int = 0       # expert_group_count (default 0: no group-limited routing)
    n_group_used: int = 0          # expert_group_used_count
    n_layer_nextn: int = 0         # nextn_predict_layers: MTP blocks after the trunk (not run here)
    yarn_beta_fast: float = 32.0   # llama.cpp default (not read from GGUF)
    yarn_beta_slow: float = 1.0    # llama.cpp default (not read from GGUF)
    layers: tuple[LayerSpec, ...] = field(default=())
    ignored_keys: tuple[str, ...] = field(default=())   # math keys llama.cpp does not read for this arch

    # ---- derived rope parameters, as llama_context's cparams computes them (src/llama-context.cpp:163-214)
    @property
    def yarn_ext_factor(self) -> float:
        return 1.0 if self.rope_scaling_type == "yarn" else 0.0

    @property
    def yarn_attn_factor(self) -> float:
        """`cparams.yarn_attn_factor`: the rope magnitude factor passed to ggml_rope_ext."""
        af = 1.0
        if self.yarn_ext_factor != 0.0:
            factor = 1.0 / self.rope_freq_scale
            af = 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0
            af *= 1.0 / (1.0 + 0.1 * math.log(factor))
        return af * self.rope_attn_factor


# ---------------------------------------------------------------- typed metadata keys

_INTS = frozenset(("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"))
_FLOATS = frozenset(("FLOAT32", "FLOAT64"))


@dataclass(frozen=True)
class Key:
    """What one metadata value must be.

    kind: "int" | "float" | "bool" | "str" | "strs" (array of strings) | "number" (any finite scalar number;
    the rule for keys no table lists). lo / hi: inclusive bounds, `lo_open` makes lo exclusive (factors > 0).
    per_layer: a scalar or an array of one value per layer is allowed (llama.cpp's `get_key_or_arr`).
    upto_tensors: the value may not exceed the number of tensors in the file (a block_count no tensor table
    supports is refused before anything is sized by it). llama_type: the exact GGUF type llama.cpp's
    `GKV<T>::get_kv` demands; another width of the same kind is read here, with a `LlamaCppWouldRefuse` warning.
    """
    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    per_layer: bool = False
    upto_tensors: bool = False
    llama_type: str | None = None

    def describe(self) -> str:
        what = {"int": "an integer", "float": "a finite float", "bool": "a bool", "str": "a string",
                "strs": "an array of strings", "number": "a finite number"}[self.kind]
        if self.per_layer:
            what += " (or an array of one per layer)"
        if self.lo is not None:
            what += f" {'>' if self.lo_open else '>='} {self.lo}"
        if self.hi is not None:
            what += f" and <= {self.hi}"
        if self.upto_tensors:
            what += " and at most the number of tensors in the file"
        return what


U32 = 2**32 - 1
COUNT = Key("int", lo=1, hi=U32, llama_type="UINT32")          # a positive count or size
COUNT0 = Key("int", lo=0, hi=U32, llama_type="UINT32")         # a count that may be 0 (absent feature)
PER_LAYER0 = Key("int", lo=0, hi=U32, per_layer=True, llama_type="UINT32")
EPS = Key("float", lo=0, llama_type="FLOAT32")
POSITIVE = Key("float", lo=0, lo_open=True, llama_type="FLOAT32")
FACTOR0 = Key("float", lo=0, llama_type="FLOAT32")             # a factor where 0 means "not set"
FLOAT = Key("float", llama_type="FLOAT32")
BOOL = Key("bool", llama_type="BOOL")
STR = Key("str", llama_type="STRING")

# Every key an arch of this engine reads, without the `{arch}.` prefix (general.*, tokenizer.*, split.* as is).
# An arch reading a key not listed here passes `kind=` to `KeyReader.get`, or gets the rule of its default.
KEYS: dict[str, Key] = {
    "general.architecture": STR, "general.name": STR, "general.alignment": Key("int", lo=1, llama_type="UINT32"),
    "tokenizer.ggml.tokens": Key("strs"), "tokenizer.ggml.model": STR,
    "block_count": Key("int", lo=1, hi=U32, upto_tensors=True, llama_type="UINT32"),
    "nextn_predict_layers": COUNT0, "embedding_length": COUNT, "context_length": COUNT, "vocab_size": COUNT,
    "feed_forward_length": PER_LAYER0, "expert_feed_forward_length": PER_LAYER0, "expert_used_count": PER_LAYER0,
    "attention.head_count": PER_LAYER0,           # 0 in the layers of hybrid archs that have no attention
    "attention.head_count_kv": PER_LAYER0,
    "attention.key_length": COUNT, "attention.value_length": COUNT, "rope.dimension_count": COUNT0,
    "attention.layer_norm_rms_epsilon": EPS, "attention.causal": BOOL,
    "rope.freq_base": POSITIVE, "rope.scaling.type": STR, "rope.scaling.factor": FACTOR0,
    "rope.scale_linear": FACTOR0, "rope.scaling.attn_factor": POSITIVE,
    "rope.scaling.original_context_length": COUNT0, "rope.scaling.yarn_log_multiplier": FACTOR0,
    "expert_count": COUNT0, "expert_group_count": COUNT0, "expert_group_used_count": COUNT0,
    "leading_dense_block_count": COUNT0, "expert_shared_count": COUNT0, "expert_gating_func": COUNT0,
    "expert_weights_scale": FACTOR0, "expert_weights_norm": BOOL,
    "attention.q_lora_rank": COUNT0, "attention.kv_lora_rank": COUNT, "attention.key_length_mla": COUNT0,
    "attention.value_length_mla": COUNT0, "attention.temperature_scale": FLOAT, "attention.temperature_length": COUNT0,
    "attention.indexer.head_count": COUNT, "attention.indexer.key_length": COUNT, "attention.indexer.top_k": COUNT,
    "attention.indexer.types": Key("number", lo=0, hi=1, per_layer=True),        # 1 full, 0 shared, per layer
}


class LlamaCppWouldRefuse(ConfigWarning):
    """The file is read here, but llama.cpp's loader refuses it (the message gives llama.cpp's reason)."""


def describe_value(v, gtype: str | None = None) -> str:
    """A metadata value as an error message shows it: its GGUF type and (a prefix of) its value."""
    from .gguf import LazyArray
    if isinstance(v, LazyArray):
        return f"an array of {v.count} {v.elem_type.name}"
    if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0) > 0:
        return f"an array of {len(v)}" + (f" {v.dtype}" if hasattr(v, "dtype") else "")
    if isinstance(v, str):
        return f"the string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    return f"{gtype} {v!r}" if gtype else repr(v)


class KeyReader:
    """Reads `{arch}.KEY` with llama.cpp's rules, remembering which keys were consumed.

    Every read is typed: the value's GGUF type must be of the key's kind (`KEYS`) and in its range, else an
    `InvalidKeyError` names the file, the key, what it must be and what it is."""

    def __init__(self, gf, arch: str):
        self.gf, self.arch, self.used = gf, arch, set()

    def _k(self, key: str) -> str:
        return key if key.startswith(("general.", "tokenizer.", "split.")) else f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self._k(key) in self.gf.kv

    def spec(self, key: str, default=None) -> Key:
        if key in KEYS:
            return KEYS[key]
        if isinstance(default, bool):
            return Key("bool")
        if isinstance(default, int):
            return Key("int")
        if isinstance(default, float):
            return Key("float")
        if isinstance(default, str):
            return Key("str")
        return Key("number")

    def get(self, key: str, default=None, required: bool = False, *, kind: Key | None = None):
        k = self._k(key)
        self.used.add(k)
        if k not in self.gf.kv:
            if required:
                raise MissingKeyError(f"{self.gf.path}: required metadata key {k!r} is missing")
            return default
        spec = kind or self.spec(key, default)
        v = self.gf.get(k)
        gtype = self._gtype(k)
        if spec.per_layer and not isinstance(v, (str, bool, int, float)) and hasattr(v, "__len__"):
            return v                                       # checked element by element in per_layer
        return self._check(k, spec, v, gtype)

    def _gtype(self, k: str) -> str | None:
        t = getattr(self.gf, "kv_types", {}).get(k)
        return None if t is None else t.name

    def _bad(self, k: str, spec: Key, v, gtype) -> InvalidKeyError:
        v = self.gf.kv.get(k, v) if k in self.gf.kv else v           # an array as stored: its element type
        return InvalidKeyError(f"{self.gf.path}: metadata key {k!r} must be {spec.describe()}, "
                               f"but is {describe_value(v, gtype)}")

    def _check(self, k: str, spec: Key, v, gtype: str | None):
        """The value of key k checked against spec; returns it as a Python scalar (or list of strings)."""
        import numpy as np
        if isinstance(v, np.generic):                      # NumPy scalars (array elements, test fakes)
            v = v.item()
        if spec.kind == "str":
            if not isinstance(v, str):
                raise self._bad(k, spec, v, gtype)
        elif spec.kind == "strs":
            if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                raise self._bad(k, spec, v, gtype)
        elif spec.kind == "bool":
            if not isinstance(v, (bool, int)) or isinstance(v, float):
                raise self._bad(k, spec, v, gtype)
            v = bool(v)
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            if spec.kind == "int":
                ok = ok and (isinstance(v, int) or gtype is None and float(v).is_integer())
            if spec.kind == "number" and isinstance(v, bool):
                ok = True
            if not ok or (isinstance(v, float) and not math.isfinite(v)):
                raise self._bad(k, spec, v, gtype)
            if spec.kind == "int":
                v = int(v)
            lo_fail = spec.lo is not None and (v <= spec.lo if spec.lo_open else v < spec.lo)
            if lo_fail or (spec.hi is not None and v > spec.hi):
                raise self._bad(k, spec, v, gtype)
            n_tensors = len(getattr(self.gf, "tensors", ()) or ())
            if spec.upto_tensors and hasattr(self.gf, "tensors") and v > n_tensors:
                raise InvalidKeyError(f"{self.gf.path}: metadata key {k!r} = {v} is more than the file's "
                                      f"{n_tensors} tensors could hold (each block has at least one tensor)")
        if spec.llama_type and gtype and gtype != spec.llama_type:
            warnings.warn(f"{self.gf.path}: key {k!r} is {gtype}; read here, but llama.cpp refuses the file: "
                          f"\"key {k} has wrong type {gtype.lower()} but expected type {spec.llama_type.lower()}\"",
                          LlamaCppWouldRefuse, stacklevel=4)
        return v

    def per_layer(self, key: str, n_layer: int, default=None, required: bool = False, *,
                  kind: Key | None = None) -> tuple:
        """A key that may be a scalar or an array of one value per layer (`get_key_or_arr`)."""
        spec = kind or self.spec(key, default)
        if not spec.per_layer:
            spec = Key(**{**spec.__dict__, "per_layer": True})
        v = self.get(key, default, required, kind=spec)
        if v is None:
            return (None,) * n_layer
        if isinstance(v, (str, bool, int, float)) or not hasattr(v, "__len__"):
            return (v,) * n_layer
        k = self._k(key)
        et = getattr(self.gf.kv.get(k), "elem_type", None)
        gtype = None if et is None else et.name
        if gtype is not None and gtype not in _INTS | _FLOATS | {"BOOL"}:
            raise self._bad(k, spec, v, None)
        if len(v) != n_layer:
            raise ConfigError(f"{self.gf.path}: {k} has {len(v)} entries, expected one per layer ({n_layer})")
        takes = {"UINT32": ("BOOL", "UINT32", "INT32"), "FLOAT32": ("FLOAT32",)}.get(spec.llama_type)
        if takes and gtype not in takes:            # llama_model_loader::get_arr's element types
            why = (f"{k} has wrong array element type {gtype.lower()}" if gtype in ("UINT64", "FLOAT32") else
                   f"{k} is not a string/float32/uint32/int32/uint64 array")
            warnings.warn(f"{self.gf.path}: key {k!r} is an array of {gtype}; read here, but llama.cpp refuses the "
                          f"file: \"{why}\"", LlamaCppWouldRefuse, stacklevel=3)
        elem = Key(**{**spec.__dict__, "per_layer": False, "llama_type": None})
        vals = [self._check(f"{k}[{i}]", elem, x, gtype) for i, x in enumerate(v)]
        return tuple(int(x) if float(x).is_integer() else float(x) for x in vals)

    def layer0(self, key: str, values: tuple, *, unused=frozenset()) -> tuple:
        """Every layer's value as llama.cpp's graph takes it where it calls the accessor without a layer: the
        entry of layer 0 (`hparams.n_head()` is `n_head(0)`, llama-hparams.cpp:50-55; LLAMA_LOAD_LOCALS,
        llama-model.h:860-878, and llm_graph_context's members, llama-graph.cpp:1470-1477, size the tensors
        and the graph with it). `values`: what `per_layer` read (a scalar is already one per layer).

        An array whose other entries differ from layer 0's is read as llama.cpp reads it, with a ConfigWarning
        (the file is ambiguous: the entry a writer meant is not the one llama.cpp uses). `unused`: layers whose
        entry 0 is the writer's "not this kind of layer" (the KDA blocks of a Kimi file: `[H, 0]`), not a value.
        """
        first = values[0]
        odd = [il for il, v in enumerate(values) if v != first and not (il in unused and v == 0)]
        if odd:
            warnings.warn(f"{self.gf.path}: {self._k(key)} = {list(values)} differs between layers (layer {odd[0]}: "
                          f"{values[odd[0]]}); read as llama.cpp's graph reads it, layer 0's {first} for every "
                          f"layer", ConfigWarning, stacklevel=3)
        return (first,) * len(values)

    def expert_used(self, values: tuple, moe_layers) -> int:
        """expert_used_count as llama.cpp's MoE graph uses it: it selects `n_expert_used()` (layer 0's entry,
        llama-graph.cpp:1477) experts in every MoE block and sums the first `n_expert_used(il)` of them
        (:2349). Where a MoE block's entry differs from layer 0's the two disagree (llama.cpp weights top-n_0 and
        adds n_il of them): refused as ambiguous. Layer 0's entry 0 with MoE blocks is refused as llama.cpp's
        loaders refuse it ("n_expert_used must be > 0", deepseek2.cpp:137, qwen3moe.cpp:45)."""
        moe_layers = list(moe_layers)
        first = int(values[0] or 0)
        if not moe_layers:
            return first
        if first == 0:
            raise ConfigError(f"{self.gf.path}: {self._k('expert_used_count')} = {list(values)}: llama.cpp selects "
                              f"layer 0's 0 experts in every MoE block (its MoE loaders refuse the file: "
                              f"\"n_expert_used must be > 0\")")
        odd = [il for il in moe_layers if int(values[il] or 0) != first]
        if odd:
            raise ConfigError(f"{self.gf.path}: {self._k('expert_used_count')} = {list(values)} is ambiguous: "
                              f"llama.cpp's graph selects layer 0's {first} experts in every MoE block but sums "
                              f"{values[odd[0]]} of them in block {odd[0]} (llama-graph.cpp:1477, :2349)")
        return first

    def warn_ignored(self, keys: list[str]) -> tuple[str, ...]:
        """Keys present in the file that change the math of other archs but that llama.cpp does not read here."""
        found = tuple(self._k(k) for k in keys if self._k(k) in self.gf.kv)
        for k in found:
            warnings.warn(
                f"{self.gf.path}: key {k!r} = {describe_value(self.gf.get(k))} is ignored, as llama.cpp ignores "
                f"it for arch {self.arch!r}", ConfigWarning, stacklevel=3)
        return found


def token_rows(gf) -> int:
    """Rows of token_embd.weight: the vocabulary size every arch checks its keys against."""
    if "token_embd.weight" not in gf:
        from .errors import MissingTensorError
        raise MissingTensorError(f"{gf.path}: required tensor 'token_embd.weight' is missing")
    return gf.tensors["token_embd.weight"].shape[0]


def check_experts(gf, arch: str, n_expert: int, n_used, *, required: bool = False) -> None:
    """expert_count / expert_used_count agree (llama.cpp asserts the same in load_hparams)."""
    if required and n_expert == 0:
        raise ConfigError(f"{gf.path}: {arch} needs {arch}.expert_count > 0")
    used = [u for u in n_used if u is not None]
    if n_expert > 0 and max(used, default=0) == 0:
        raise ConfigError(f"{gf.path}: {arch}.expert_count = {n_expert} but {arch}.expert_used_count is missing or 0")
    if max(used, default=0) > n_expert:
        raise ConfigError(f"{gf.path}: {arch}.expert_used_count = {max(used)} exceeds expert_count = {n_expert}")


def check_head_dims(gf, arch: str, common: dict) -> None:
    """Softmax-attention archs whose heads are rotated whole: key_length == value_length == rope dims."""
    if common["head_dim_k"] != common["head_dim_v"] or common["head_dim_k"] != common["n_rot"]:
        raise ConfigError(
            f"{gf.path}: {arch} needs key_length == value_length == rope.dimension_count, got "
            f"{common['head_dim_k']}, {common['head_dim_v']}, {common['n_rot']}")


def check_gqa(gf, il: int, n_head: int, n_head_kv: int) -> None:
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise ConfigError(f"{gf.path}: layer {il}: {n_head} heads do not group over {n_head_kv} KV heads")


def read_common(r: KeyReader, *, rope_type: int, n_vocab: int) -> tuple[dict, tuple[int, ...], tuple[int, ...]]:
    """The hyperparameters every transformer arch reads (`load_hparams`, src/llama-model.cpp:1298-1470).

    Returns (common, n_head, n_head_kv): `common` the ModelConfig fields of every arch (keyword arguments),
    n_head / n_head_kv the head counts of the trunk's layers, one per layer."""
    gf = r.gf
    n_layer_all = int(r.get("block_count", required=True))
    n_nextn = int(r.get("nextn_predict_layers", 0))
    if not 0 <= n_nextn < n_layer_all:
        raise ConfigError(f"{gf.path}: {r._k('nextn_predict_layers')} = {n_nextn} leaves no trunk layer "
                          f"of block_count = {n_layer_all}")
    n_layer = n_layer_all - n_nextn              # the trunk llama.cpp runs (hparams.n_layer())
    n_embd = int(r.get("embedding_length", required=True))
    if n_layer <= 0 or n_embd <= 0:
        raise ConfigError(f"{gf.path}: block_count = {n_layer}, embedding_length = {n_embd} must be positive")
    n_head = r.per_layer("attention.head_count", n_layer_all, required=True)[:n_layer]
    n_head_kv = r.per_layer("attention.head_count_kv", n_layer_all)[:n_layer]
    n_head_kv = tuple(h if kv is None else kv for h, kv in zip(n_head, n_head_kv))
    if n_head[0] <= 0:                    # every graph reads n_head(), layer 0's entry (llama-hparams.cpp:50)
        raise ConfigError(f"{gf.path}: {r._k('attention.head_count')} must be positive in layer 0, but is "
                          f"{list(n_head) if len(set(n_head)) > 1 else n_head[0]}: llama.cpp sizes every block "
                          f"by layer 0's entry (n_head()) and refuses the file (\"tensor ... has wrong shape\")")
    head_k = int(r.get("attention.key_length", n_embd // n_head[0]))
    head_v = int(r.get("attention.value_length", n_embd // n_head[0]))
    n_rot = int(r.get("rope.dimension_count", head_k))
    n_ctx_train = int(r.get("context_length", required=True))

    scaling = str(r.get("rope.scaling.type", "linear"))
    if scaling not in ("none", "linear", "yarn", "longrope"):
        raise ConfigError(f"{gf.path}: {r._k('rope.scaling.type')} = {scaling!r} is not one of none, linear, yarn, longrope")
    factor = r.get("rope.scaling.factor")
    if factor is None:
        factor = r.get("rope.scale_linear", 0.0)
    freq_scale = 1.0 if (factor == 0.0 or scaling == "none") else 1.0 / float(factor)

    n_expert = int(r.get("expert_count", 0))
    n_groups = int(r.get("expert_group_count", 0))
    n_group_used = int(r.get("expert_group_used_count", 0))
    if n_groups > 1 and (n_expert % n_groups or not 0 < n_group_used < n_groups):
        raise ConfigError(f"{gf.path}: expert_group_count = {n_groups}, expert_group_used_count = {n_group_used} "
                          f"do not fit expert_count = {n_expert} (llama.cpp asserts E % groups == 0, 0 < used < groups)")
    vocab_key = r.get("vocab_size")
    if vocab_key is not None and int(vocab_key) != n_vocab:
        raise ConfigError(f"{gf.path}: {r._k('vocab_size')} = {vocab_key} but token_embd.weight has {n_vocab} rows")
    return dict(
        arch=r.arch, name=str(gf.get("general.name", "")), n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer,
        n_ctx_train=n_ctx_train, head_dim_k=head_k, head_dim_v=head_v, n_rot=n_rot,
        rms_eps=float(r.get("attention.layer_norm_rms_epsilon", required=True)),
        n_expert=n_expert, rope_type=rope_type, causal_attn=bool(r.get("attention.causal", True)),
        n_expert_groups=n_groups, n_group_used=n_group_used, n_layer_nextn=n_nextn,
        rope_freq_base=float(r.get("rope.freq_base", 10000.0)), rope_scaling_type=scaling,
        rope_freq_scale=freq_scale, rope_attn_factor=float(r.get("rope.scaling.attn_factor", 1.0)),
        n_ctx_orig_yarn=int(r.get("rope.scaling.original_context_length", n_ctx_train)),
    ), n_head, n_head_kv
