"""ModelConfig: every hyperparameter the forward pass uses, each read from a named GGUF key.

Built only by `ModelConfig.from_gguf`. Keys are written without the `{arch}.` prefix in the comments
(`attention.head_count` means `llama.attention.head_count` for a `llama` file). Defaults are the ones
llama.cpp applies (`llama_model_base::load_hparams`, `src/llama-model.cpp:1298`, and the arch's
`load_arch_hparams`); a missing required key is a `MissingKeyError` naming the key and the file.

Per-layer structure (attention kind, dense or MoE feed-forward, head counts) is explicit data in
`layers`, never computed inside a block.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from .errors import ConfigError, MissingKeyError

ROPE_NORM = 0   # rotate pairs (x[2i], x[2i+1])          (LLAMA_ROPE_TYPE_NORM)
ROPE_NEOX = 2   # rotate pairs (x[i], x[i + n_rot/2])     (LLAMA_ROPE_TYPE_NEOX)


class ConfigWarning(UserWarning):
    """A metadata key that would change the math elsewhere but that llama.cpp ignores for this arch."""


@dataclass(frozen=True)
class LayerSpec:
    attn: str                 # "mha" (softmax attention over a KV cache) | "mla" (latent attention)
                              # | "dsa" (latent attention under a lightning-indexer top-k mask)
    ffn: str                  # "dense" | "moe"
    n_head: int               # attention.head_count (scalar or per-layer array)
    n_head_kv: int            # attention.head_count_kv (default: n_head)
    n_ff: int                 # feed_forward_length (dense layers)
    n_ff_exp: int             # expert_feed_forward_length (MoE layers)
    n_expert_used: int        # expert_used_count (scalar or per-layer array)
    attn_cfg: object = None   # the attention module's typed config (e.g. attention.mla.MLAConfig)
    moe: object = None        # moe.block.MoEConfig of a MoE layer
    indexer: object = None    # attention.dsa_indexer.IndexerConfig of a DSA layer (full or shared indexer)


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

    @staticmethod
    def from_gguf(gf) -> "ModelConfig":
        from .archs import get_arch
        arch = get_arch(gf.get("general.architecture"), gf.path)
        return arch.config_from_gguf(gf)


class KeyReader:
    """Reads `{arch}.KEY` with llama.cpp's rules, remembering which keys were consumed."""

    def __init__(self, gf, arch: str):
        self.gf, self.arch, self.used = gf, arch, set()

    def _k(self, key: str) -> str:
        return key if key.startswith(("general.", "tokenizer.", "split.")) else f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self._k(key) in self.gf.kv

    def get(self, key: str, default=None, required: bool = False):
        k = self._k(key)
        self.used.add(k)
        if k not in self.gf.kv:
            if required:
                raise MissingKeyError(f"{self.gf.path}: required metadata key {k!r} is missing")
            return default
        return self.gf.get(k)

    def per_layer(self, key: str, n_layer: int, default=None, required: bool = False) -> tuple:
        """A key that may be a scalar or an array of one value per layer (`get_key_or_arr`)."""
        v = self.get(key, default, required)
        if v is None:
            return (None,) * n_layer
        if hasattr(v, "__len__") and not isinstance(v, str):
            if len(v) != n_layer:
                raise ConfigError(f"{self.gf.path}: {self._k(key)} has {len(v)} entries, expected one per layer ({n_layer})")
            return tuple(int(x) if float(x).is_integer() else float(x) for x in v)
        return (v,) * n_layer

    def warn_ignored(self, keys: list[str]) -> tuple[str, ...]:
        """Keys present in the file that change the math of other archs but that llama.cpp does not read here."""
        found = tuple(self._k(k) for k in keys if self._k(k) in self.gf.kv)
        for k in found:
            warnings.warn(
                f"{self.gf.path}: key {k!r} = {self.gf.get(k)!r} is ignored, as llama.cpp ignores it for "
                f"arch {self.arch!r}", ConfigWarning, stacklevel=3)
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


def read_common(r: KeyReader, *, rope_type: int, n_vocab: int) -> dict:
    """The hyperparameters every transformer arch reads (`load_hparams`, src/llama-model.cpp:1298-1470)."""
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
    if n_head[0] <= 0:
        raise ConfigError(f"{gf.path}: {r._k('attention.head_count')} must be positive")
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
