"""The Kimi family (`kimi-linear`, `kimi-k3`): KDA blocks and MLA blocks in one stack, then a dense or MoE FFN.

llama.cpp: `src/models/kimi-linear.cpp` and `src/models/kimi-k3.cpp` (its header :6-14 lists what K3 adds). Both
mark a KDA block by head_count_kv[il] == 0 (kimi-linear.cpp:17-19, kimi-k3.cpp:30-33), run MLA with rope type
NONE (q_pe, k_pe unrotated) and require an untied `output.weight`. One block's token mixer (Legend: T tokens,
D model dim):

    h = rms_norm(x) * attn_norm                                       attn_norm       [T, D]
    a = kda(h)        head_count_kv[il] == 0 (attention/kda.py)
      | mla(h)        otherwise (attention/mla.py, no rope), optionally * sigmoid(h @ attn_gate.T)   mla_out

What the family shares lives here: the keys both loaders read (`read_keys`), the per-layer structure
(`layer_specs`), the block's tensor table (`layer_table`), the state (`new_state`) and the token mixer
(`attention`). An arch file passes what differs as data: the names its llama.cpp graph gives KDA's traced
tensors (`kda.POINTS`), how its loader lays out KDA's tensors (`kda.kda_table` options), its MLA config,
table and what its graph does differently in MLA (`mla.mla`'s `k_parts`, `names`), its MoE config and table.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..attention import kda, mla
from ..config import COUNT, KeyReader, LayerSpec, check_experts, read_common, token_rows
from ..errors import ConfigError, MissingTensorError
from ..ffn import dense_ffn_table
from ..globals import load_globals as _load_globals
from ..moe.block import GATING
from ..ops import rms_norm
from ..ops.activations import sigmoid
from ..weights import W, load_tensors, norm_table

ROPE_TYPE = -1             # LLAMA_ROPE_TYPE_NONE (llama-model.cpp:3046-3049): nothing is rotated
ATTN_FORMS = mla.FORMS + ("chunked",)   # MLA blocks: absorbed / naive; KDA blocks: the chunked delta rule

# Matmul inputs of the absorbed MLA blocks, as both graphs name them (refengine.flips).
MLA_INPUTS = [
    (r"q_nope_perm-(\d+)", ["blk.{il}.attn_k_b.weight"]),
    (r"kqv-(\d+)", ["blk.{il}.attn_v_b.weight"]),
]

# Keys of other archs that change the math but that neither Kimi loader reads (an arch adds its own).
IGNORED_MATH_KEYS = ("attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "rope.scaling.yarn_log_multiplier", "attention.temperature_scale", "swiglu_clamp_exp",
                     "swiglu_clamp_shexp", "expert_shared_feed_forward_length")


# ---------------------------------------------------------------- config

@dataclass(frozen=True)
class HybridKeys:
    """The keys both Kimi loaders read, one entry per layer (tuples of n_layer) as llama.cpp uses them: a key its
    graph or tensor shapes read without a layer (n_ff(), n_ff_exp(), n_expert_used()) holds layer 0's entry in
    every layer (KeyReader.layer0); head_count_kv is read per layer (it marks the KDA blocks)."""
    r: KeyReader
    common: dict               # read_common's hyperparameters
    n_head: int                # attention.head_count of layer 0 (a scalar or per layer: the graphs read n_head())
    n_head_kv: tuple           # attention.head_count_kv per layer (0: a KDA block)
    kda: kda.KDAConfig         # kda.head_dim, ssm.conv_kernel; an arch adds its KDA options (dataclasses.replace)
    n_dense: int               # leading_dense_block_count
    n_ff: tuple                # feed_forward_length (dense blocks): layer 0's
    n_ff_exp: tuple            # expert_feed_forward_length (required): layer 0's
    n_used: tuple              # expert_used_count: layer 0's (the MoE blocks must agree: KeyReader.expert_used)
    n_shared: int              # expert_shared_count (required)
    gating: str                # expert_gating_func (required), a GATING name

    def moe_sizes(self, il: int) -> dict:
        """MoEConfig's fields both archs set alike for MoE block il: the shared experts are created with
        n_ff_exp * max(n_shared, 1) (kimi-linear.cpp:146-152, kimi-k3.cpp:161-164)."""
        n_ff_exp = int(self.n_ff_exp[il])
        return dict(n_expert=self.common["n_expert"], n_expert_used=int(self.n_used[il]), n_ff_exp=n_ff_exp,
                    gating=self.gating, n_ff_shexp=n_ff_exp * max(self.n_shared, 1))


def read_keys(gf, arch: str) -> HybridKeys:
    """kimi-linear.cpp:4-31, kimi-k3.cpp:16-51: what both read, with the checks both make."""
    r = KeyReader(gf, arch)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    # head_count may be a scalar or one per layer (llama.cpp's writers store [H, 0]: 0 in the KDA blocks); both
    # graphs read n_head(), layer 0's entry, for the KDA and the MLA blocks alike (kimi-linear.cpp:255,
    # kimi-k3.cpp:255, LLAMA_LOAD_LOCALS); read_common refuses layer 0's entry 0 as llama.cpp's tensors do
    kda_blocks = frozenset(il for il in range(L) if int(n_head_kv[il]) == 0)
    H = int(r.layer0("attention.head_count", n_head, unused=kda_blocks)[0])
    latent = r.get("attention.key_length_mla", 0) and r.get("attention.value_length_mla", 0)   # hparams.is_mla()
    wide = [il for il in range(L) if il not in kda_blocks and int(n_head_kv[il]) != 1]
    if latent and wide:       # the latent cache holds head_count_kv[il] rows of (kv_lora + rope) per token
        raise ConfigError(f"{gf.path}: {r._k('attention.head_count_kv')} = {list(n_head_kv)}: MLA block {wide[0]} "
                          f"has {n_head_kv[wide[0]]} KV heads, not the one latent row llama.cpp's MLA cache holds; "
                          f"llama.cpp aborts on the file (GGML_ASSERT(a->ne[0] == b->ne[0]), ggml.c:4014, measured)")
    kc = kda.KDAConfig(n_head=H, head_dim=int(r.get("kda.head_dim", required=True, kind=COUNT)),
                       d_conv=int(r.get("ssm.conv_kernel", required=True, kind=COUNT)), rms_eps=common["rms_eps"])
    # the tensors are sized by n_ff_exp() and n_ff() (layer 0's entries, kimi-linear.cpp:140, kimi-k3.cpp:144)
    n_ff_exp = r.layer0("expert_feed_forward_length", r.per_layer("expert_feed_forward_length", L_all,
                                                                  required=True)[:L])
    n_shared = int(r.get("expert_shared_count", required=True))
    n_dense = int(r.get("leading_dense_block_count", 0))
    func = int(r.get("expert_gating_func", required=True))
    if func not in GATING:
        raise ConfigError(f"{gf.path}: {arch}.expert_gating_func = {func} is not one of {sorted(GATING)}")
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    n_ff = r.layer0("feed_forward_length", r.per_layer("feed_forward_length", L_all, default=0)[:L])
    check_experts(gf, arch, common["n_expert"] if L > n_dense else 0, n_used[n_dense:])
    n_used = (r.expert_used(n_used, range(n_dense, L) if common["n_expert"] else ()),) * L
    return HybridKeys(r=r, common=common, n_head=H, n_head_kv=n_head_kv, kda=kc, n_dense=n_dense, n_ff=n_ff,
                      n_ff_exp=n_ff_exp, n_used=n_used, n_shared=n_shared, gating=GATING[func])


def layer_specs(k: HybridKeys, *, kda_cfg: kda.KDAConfig, mla_cfg, moe_cfg) -> tuple[LayerSpec, ...]:
    """Block il is KDA when head_count_kv[il] == 0, else MLA (`mla_cfg(il)`); dense for il < n_dense, else MoE
    (`moe_cfg(il)`, starting from `k.moe_sizes(il)`)."""
    layers = []
    for il in range(k.common["n_layer"]):
        dense = il < k.n_dense
        moe = None if dense else moe_cfg(il)
        recurrent = int(k.n_head_kv[il]) == 0
        layers.append(LayerSpec(attn="kda" if recurrent else "mla", ffn="dense" if dense else "moe", n_head=k.n_head,
                                n_head_kv=int(k.n_head_kv[il]), n_ff=int(k.n_ff[il] or 0),
                                n_ff_exp=0 if dense else int(k.n_ff_exp[il]),
                                n_expert_used=0 if dense else int(k.n_used[il]),
                                attn_cfg=kda_cfg if recurrent else mla_cfg(il), moe=moe))
    return tuple(layers)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg, arch: str):
    """Token embedding, output norm and the required `output.weight` (kimi-linear.cpp:41, kimi-k3.cpp:61)."""
    if "output.weight" not in gf:
        raise MissingTensorError(f"{gf.path}: required tensor 'output.weight' is missing ({arch} has no tied output)")
    return _load_globals(gf, cfg, rope_factor_tensors=False)


def layer_table(gf, cfg, il: int, *, norms: tuple[str, ...], kda_tensors: dict, mla_table, moe_table,
                moe_tensors) -> list[W]:
    """Block il's tensors: the [D] vectors `norms`, the KDA layer (`kda.kda_table` with the arch's layout
    options `kda_tensors`) or the arch's `mla_table(il, mc)`, then the dense FFN (its .scale loaded, not applied:
    build_ffn gets NULL) or the arch's `moe_table(gf, il, moe_cfg, moe_tensors)` (moe_tensors: its MoETensors)."""
    spec = cfg.layers[il]
    table = norm_table(il, *norms)
    if spec.attn == "kda":
        table += kda.kda_table(gf, il, spec.attn_cfg, **kda_tensors)
    else:
        table += mla_table(il, spec.attn_cfg)
    if spec.ffn == "dense":
        table += dense_ffn_table(il, lambda c, s: s.n_ff)
    else:
        table += moe_table(gf, il, spec.moe, moe_tensors)
    return table


def load_layer(gf, cfg, il: int, **table):
    """Block il's tensors loaded (shape-checked): `layer_table`'s arguments."""
    return load_tensors(gf, layer_table(gf, cfg, il, **table), cfg, cfg.layers[il], il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """Per layer: KDA's RecurrentState, or the MLA cache of the form asked (llama.cpp's by default). attn_form
    (ATTN_FORMS): an MLA form (absorbed / naive) for the MLA blocks, or "chunked" for the KDA blocks' delta rule."""
    kda_form = "chunked" if attn_form == "chunked" else "recurrent"
    mla_form = attn_form if attn_form in mla.FORMS else None
    return [kda.new_state(s.attn_cfg, kda_form) if s.attn == "kda" else mla.new_state(s.attn_cfg, mla_form)
            for s in cfg.layers]


# ---------------------------------------------------------------- forward

def attention(x, w, *, spec, il, state, rt, eps: float, kda_names: dict, mla_out_gate: bool = False,
              mla_graph: dict | None = None, pos=None, h=None):
    """attn_norm, then the block's token mixer: x [T, D] -> [T, D] (before the residual). `kda_names`: the
    trace names of kda.POINTS; `mla_out_gate`: an MLA block's output is gated by sigmoid(h @ attn_gate.T) when
    the block has attn_gate (kimi-k3.cpp:552-557, reads h); `mla_graph`: what the arch's MLA graph does
    differently from deepseek2's (`mla.mla`'s k_parts / names), or None; pos: the step's positions (`step.pos`); h:
    attn_norm's output where the caller made it (with the previous block's add: `residual.pending.add_norm`). An
    MLA block runs in its state's form."""
    h = rms_norm(x, w.attn_norm, eps) if h is None else h
    rt.record("attn_norm", il, h)
    if spec.attn == "kda":
        return kda.kda_layer(h, w, kc=spec.attn_cfg, il=il, state=state, rt=rt, names=kda_names)
    gate = None
    if mla_out_gate and w.attn_gate is not None:
        rt.prefetch(h, [w.attn_gate] + mla.input_weights(w, spec.attn_cfg))   # h's three products, one a type
        gate = sigmoid(rt.matmul(h, w.attn_gate))                        # [T, H*dv]
    a = mla.mla(h, w, mc=spec.attn_cfg, il=il, state=state, cos=None, sin=None, rt=rt, out_gate=gate, pos=pos,
                **(mla_graph or {}))
    rt.record("mla_out", il, a)
    return a
