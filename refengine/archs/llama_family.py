"""The Llama-shaped family: pre-norm blocks of RMS norm, attention, RMS norm, feed-forward, one [T, D] stream.

`llama`, `qwen3moe` and `qwen3next` are members: each arch file holds one `Variant` (what differs, as data)
and exposes the family's functions bound to it as the arch contract (refengine.archs). One block (Legend:
T tokens, D model dim; the trace names are the member's, the defaults are llama's):

    h = rms_norm(x) * attn_norm                                        attn_norm        [T, D]
    a = gqa_attention(h)     softmax blocks (attention/gqa.py): optional q/k norms, output gate  attn_out
      | gated_deltanet(h)    linear blocks, where the member has them (attention/gated_deltanet.py)
    x = x + a                                                          ffn_inp
    h = rms_norm(x) * ffn_norm       (or post_attention_norm)          ffn_norm
    x = x + dense_ffn(h)     (ffn/dense.py)                            ffn_out          (dense)
      | x + moe_block(h)     (moe/block.py: softmax top-k, weights renormalized, optional gated shared expert)
                                                                       l_out            [T, D]
The last sum is handed on unmade (residual/pending.py: PendingAdd(x, f)): the next block's attn_norm, or the head's
output norm, adds it and norms the sum in one op (`ops.add_rms_norm`: one launch on a GPU, the same numbers).

llama.cpp: `src/models/llama.cpp`, `qwen3moe.cpp`, `qwen3next.cpp`; `build_attn`, `build_ffn`,
`build_moe_ffn` in `src/llama-graph.cpp`. RoPE: `rope_freqs` / LongRoPE factor tensors where the member
loads them, NORM or NEOX pairs by the member's rope type, YaRN from the context parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import synthplan as sp
from ..attention import gated_deltanet as gdn
from ..attention import gqa
from ..config import (KeyReader, LayerSpec, ModelConfig, check_experts, check_gqa, check_head_dims, read_common,
                      token_rows)
from ..errors import ConfigError
from ..ffn import dense_ffn, dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head, rope_factors
from ..moe.block import MoEConfig, MoETensors, moe_block, moe_matmul_inputs, moe_table
from ..ops import add_rms_norm
from ..ops.rope import context_rope
from ..residual.pending import PendingAdd, add_norm
from ..weights import load_tensors, norm_table


# ---------------------------------------------------------------- the sizes of the feed-forward

def gqa_matmul_inputs(*, dense: bool) -> list:
    """`MATMUL_INPUTS` (refengine.flips) of a softmax-attention block with a SwiGLU MoE FFN (dense: some layers
    run a dense FFN instead): llama.cpp graph tensor that is a quantized matmul's input -> the weights it feeds."""
    return [(r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_qkv.weight"]),
            (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
            *moe_matmul_inputs(dense=dense, shared=False),
            (r"result_norm", ["output.weight", "token_embd.weight"])]


def llama_moe_sizes(r, n_layer: int, n_layer_all: int) -> tuple[list[int], list[int], list[int]]:
    """Per trunk block (n_ff, n_expert_used, n_ff_exp) as llama's loader reads them: the experts are sized by
    `feed_forward_length` (Mixtral; `expert_feed_forward_length` is not read)."""
    n_ff = [int(v or 0) for v in r.per_layer("feed_forward_length", n_layer_all, default=0)[:n_layer]]
    n_used = [int(v or 0) for v in r.per_layer("expert_used_count", n_layer_all, default=0)[:n_layer]]
    return n_ff, n_used, list(r.layer0("feed_forward_length", n_ff))     # the experts: n_ff() (LLAMA_LOAD_LOCALS)


def qwen_moe_sizes(r, n_layer: int, n_layer_all: int) -> tuple[list[int], list[int], list[int]]:
    """Per trunk block (n_ff, n_expert_used, n_ff_exp) as the Qwen MoE loaders read them: `expert_feed_forward_length`,
    else `feed_forward_length / expert_used_count` (src/models/qwen3moe.cpp:51, qwen3next.cpp:53)."""
    n_ff, n_used, ff0 = llama_moe_sizes(r, n_layer, n_layer_all)
    n_ff_exp = r.layer0("expert_feed_forward_length",       # n_ff_exp(), n_ff(), n_expert_used(): layer 0's
                        r.per_layer("expert_feed_forward_length", n_layer_all, default=0)[:n_layer])
    ff_exp = [int(e or (f // u if u else 0) or 0) for e, f, u in zip(n_ff_exp, ff0, [n_used[0]] * n_layer)]
    return n_ff, n_used, ff_exp


def graph_heads(r, n_head: tuple, n_head_kv: tuple, linear: list) -> tuple[tuple, tuple]:
    """head_count / head_count_kv per block as the member's graph reads them: n_head and n_head_kv of layer 0
    for every softmax block (llm_graph_context's members, llama-graph.cpp:1470-1471; the tensors by
    LLAMA_LOAD_LOCALS). The KV cache is sized by each layer's n_head_kv(il) (llama-kv-cache.cpp:1289): an array
    whose softmax blocks differ from layer 0's is refused, llama.cpp's K/V and cache would disagree."""
    L = len(n_head)
    unused = frozenset(il for il in range(L) if linear[il])
    kv = {int(n_head_kv[il]) for il in range(L) if il not in unused}
    if kv and kv != {int(n_head_kv[0])}:
        raise ConfigError(f"{r.gf.path}: {r._k('attention.head_count_kv')} = {list(n_head_kv)} is ambiguous: "
                          f"llama.cpp builds every block's K and V with layer 0's {n_head_kv[0]} heads "
                          f"(n_head_kv()) but sizes block il's cache by its own entry")
    return r.layer0("attention.head_count", n_head, unused=unused), (n_head_kv[0],) * L


def check_kv_dims(gf, arch: str, common: dict) -> None:
    """Partial rope (the first n_rot dims of a head): only key_length == value_length is needed
    (qwen3next.cpp:242 builds the attention with one head dim)."""
    if common["head_dim_k"] != common["head_dim_v"]:
        raise ConfigError(f"{gf.path}: {arch} needs attention.key_length == attention.value_length "
                          f"(qwen3next.cpp:242), got {common['head_dim_k']} and {common['head_dim_v']}")


def mtp_tensor_names(gf, cfg) -> list[str]:
    """The MTP blocks' tensors (blk.N.* for N >= n_layer). llama.cpp creates them with TENSOR_SKIP unless asked
    to load MTP (qwen3next.cpp:38-40, :108-128): they count as the file's and are never read. Here the same:
    named as consumed (refengine lint), not loaded."""
    def block(name):
        parts = name.split(".")
        return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1
    return [n for n in gf.tensors if cfg.n_layer <= block(n) < cfg.n_layer + cfg.n_layer_nextn]


# ---------------------------------------------------------------- what a member states

@dataclass(frozen=True)
class Variant:
    """One member of the family: its keys, tensors and trace names. The defaults are llama's."""
    arch: str                           # general.architecture
    rope_type: int                      # ROPE_NORM | ROPE_NEOX (llama_model_rope_type)
    ignored_keys: tuple[str, ...]       # math keys of other archs this loader never reads (warned, not used)
    # -- keys
    expert_ff_length: bool = False      # experts sized by expert_feed_forward_length, else feed_forward_length /
                                        # expert_used_count (qwen_moe_sizes); False: by feed_forward_length (llama)
    experts_required: bool = False      # expert_count > 0 is required (else dense blocks when it is 0)
    check_dims: Callable = check_head_dims  # key/value/rope dims (whole-head rope: all three equal)
    linear_layers: Callable | None = None   # (reader, L, L_all) -> per block True = gated DeltaNet
    shared_expert: bool = False         # one shared expert sized by expert_shared_feed_forward_length (else
                                        # feed_forward_length), its output gated by sigmoid(h @ ffn_gate_inp_shexp)
    moe_tensors: MoETensors = MoETensors()   # which MoE tensors the loader accepts / requires (moe/block.py)
    # -- tensors
    rope_factor_tensors: bool = True    # rope_freqs / rope_factors_long|short loaded (get_rope_factors)
    qk_norm: bool = False               # attn_q_norm / attn_k_norm [K]: per-head RMS norms before RoPE
    out_bias: bool = True               # attn_output.bias may be present
    q_gate: bool = False                # attn_q gives [q | gate] per head; o * sigmoid(gate) before attn_output
    ffn_norm: str = "ffn_norm"          # the second norm's GGUF name (qwen3next: post_attention_norm)
    mtp_skipped: bool = False           # nextn_predict_layers MTP blocks: named as the file's, never loaded
    # -- trace names (llama.cpp's cb names in the member's graph)
    trace_embd: str | None = None       # the embedding traced again under this name
    trace_attn_out: str | None = "attn_out"     # the softmax attention's output (None: not traced)
    trace_ffn_inp: str = "ffn_inp"      # the residual after attention
    trace_ffn_norm: str = "ffn_norm"    # the second norm's output
    trace_l_out: tuple[str, ...] = ("l_out",)    # the residual after the feed-forward
    trace_head_nextn: str | None = None  # the normed last state traced before result_norm (the MTP head's input)
    # -- synthetic files
    synth_rope_dims: bool = True        # synth_metadata writes rope.dimension_count (else left to key_length)

    # ------------------------------------------------------------ config

    def config_from_gguf(self, gf) -> ModelConfig:
        r = KeyReader(gf, self.arch)
        common, n_head, n_head_kv = read_common(r, rope_type=self.rope_type, n_vocab=token_rows(gf))
        L = common["n_layer"]
        L_all = L + common["n_layer_nextn"]
        sizes = qwen_moe_sizes if self.expert_ff_length else llama_moe_sizes
        n_ff, n_used, n_ff_exp = sizes(r, L, L_all)
        n_ff_shexp = int(r.get("expert_shared_feed_forward_length", 0)) if self.shared_expert else 0
        E = common["n_expert"]
        check_experts(gf, self.arch, E, n_used, required=self.experts_required)
        n_used = [r.expert_used(n_used, range(L) if E > 0 else ())] * L    # the graph's n_expert_used
        self.check_dims(gf, self.arch, common)
        gc = gdn.gdn_config(r, gf.path) if self.linear_layers else None
        linear = self.linear_layers(r, L, L_all) if self.linear_layers else [False] * L
        n_head, n_head_kv = graph_heads(r, n_head, n_head_kv, linear)
        if not self.shared_expert:           # the dense FFN: n_ff() (qwen3next's shared expert reads n_ff(il))
            n_ff = list(r.layer0("feed_forward_length", n_ff))
        layers = []
        for il in range(L):
            if not linear[il]:
                check_gqa(gf, il, n_head[il], n_head_kv[il])
            shexp = dict(n_shared=1, n_ff_shexp=n_ff_shexp or n_ff[il], shexp_gate=True) if self.shared_expert else {}
            moe = None
            if E > 0:
                moe = MoEConfig(n_expert=E, n_expert_used=n_used[il], n_ff_exp=n_ff_exp[il],
                                n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"],
                                **shexp)
            layers.append(LayerSpec(attn="gdn" if linear[il] else "mha", ffn="moe" if moe else "dense",
                                    n_head=int(n_head[il]), n_head_kv=int(n_head_kv[il]), n_ff=n_ff[il],
                                    n_ff_exp=n_ff_exp[il] if moe else 0, n_expert_used=n_used[il],
                                    attn_cfg=gc if linear[il] else None, moe=moe))
        ignored = r.warn_ignored(list(self.ignored_keys))
        return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored)

    # ------------------------------------------------------------ tensors

    def load_globals(self, gf, cfg):
        g = _load_globals(gf, cfg, rope_factor_tensors=self.rope_factor_tensors)
        if self.mtp_skipped:
            g.tensor_names = list(g.tensor_names) + mtp_tensor_names(gf, cfg)
        return g

    def load_layer(self, gf, cfg, il: int):
        spec = cfg.layers[il]
        table = norm_table(il, "attn_norm", self.ffn_norm)
        if spec.attn == "gdn":
            table += gdn.gdn_table(gf, il, spec.attn_cfg)
        else:
            table += gqa.gqa_table(gf, il, out_bias=self.out_bias, qk_norm=self.qk_norm, q_gate=self.q_gate)
        if spec.ffn == "dense":
            table += dense_ffn_table(il, lambda c, s: s.n_ff)
        else:
            table += moe_table(gf, il, spec.moe, self.moe_tensors)
        return load_tensors(gf, table, cfg, spec, il)

    def new_state(self, cfg, attn_form: str | None = None) -> list:
        """Per block: a KVCache (softmax attention, one form) or a GDNState (attn_form: its delta-rule form,
        gated_deltanet.FORMS)."""
        return [gdn.new_state(attn_form or "recurrent") if spec.attn == "gdn" else gqa.new_state()
                for spec in cfg.layers]

    # ------------------------------------------------------------ forward

    def rope_for(self, cfg, g, pos, n_ctx):
        """cos, sin [T, n_rot/2] for positions pos [T] with llama.cpp's context-level rope parameters and the
        factor tensors where the member loads them (none loaded: none applied)."""
        return context_rope(cfg, pos, freq_factors=rope_factors(g, cfg, n_ctx))

    def embed(self, g, cfg, step, rt):
        x = embed_tokens(g, step.tokens, rt)                             # [T, D]
        if self.trace_embd:
            rt.record(self.trace_embd, -1, x)
        return x

    def block(self, x, w, *, cfg, il, state, step, rt):
        """One block: x [T, D] -> [T, D]; state: this layer's KVCache or GDNState."""
        spec = cfg.layers[il]
        x, h = add_norm(x, w.attn_norm, cfg.rms_eps)      # (the previous block's output added first: PendingAdd)
        rt.record("attn_norm", il, h)
        if spec.attn == "gdn":
            a = gdn.gated_deltanet(h, w, gc=spec.attn_cfg, eps=cfg.rms_eps, il=il, state=state, rt=rt)
        else:
            cos, sin = step.memo("rope", lambda: self.rope_for(cfg, step.g, step.pos, step.n_ctx))   # [T, R/2]
            a = gqa.self_attention(h, w, cfg=cfg, spec=spec, il=il, state=state, step=step, cos=cos, sin=sin,
                                   rt=rt, out_gate=self.q_gate)
            if self.trace_attn_out:
                rt.record(self.trace_attn_out, il, a)
        x, a = step.out_rows(il, cfg.n_layer, (x, a))                    # the output rows (llama.cpp inp_out_ids)
        x, h = add_rms_norm(x, a, getattr(w, self.ffn_norm), cfg.rms_eps)     # x + a and its norm
        rt.record(self.trace_ffn_inp, il, x)
        rt.record(self.trace_ffn_norm, il, h)
        if spec.ffn == "dense":
            f = dense_ffn(h, w, il=il, rt=rt)
            rt.record("ffn_out", il, f)       # llama.cpp then renames the residual sum to l_out
        else:
            f = moe_block(h, w, mc=spec.moe, tensors=self.moe_tensors, spec=spec, il=il, rt=rt, pending=True)
        x = PendingAdd(x, f)          # x + f, made by the next block's attn_norm or the head's norm (one launch)
        for name in self.trace_l_out:
            rt.record(name, il, x.total)
        return x

    def head(self, x, g, cfg, rt):
        if self.trace_head_nextn:
            rt.record(self.trace_head_nextn, -1, lambda: add_norm(x, g.output_norm, cfg.rms_eps)[1])
        return rms_head(x, g, cfg, rt, where=cfg.name or self.arch)

    # ------------------------------------------------------------ synthetic models (refengine.synth)
    # Softmax-attention members; qwen3next's plans (linear blocks, shared expert, MTP) are its own.

    def synth_plan(self, p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
        D, E = p["n_embd"], p.get("n_expert", 0)
        F = p["n_ff_exp"] if self.expert_ff_length else p["n_ff"]           # the experts' hidden size
        t = [sp.TensorPlan("token_embd.weight", (p["n_vocab"], D), "embed")]
        if self.rope_factor_tensors:
            t += sp.rope_factor_plans(p, rope_scaling, all_optional, p["head_dim"])
        elif rope_scaling == "longrope":
            raise ConfigError(f"{self.arch} has no long/short rope factor tensors; longrope is a llama option")
        for il in range(p["n_layer"]):
            t.append(sp.TensorPlan(f"blk.{il}.attn_norm.weight", (D,), "norm"))
            t += sp.gqa_plans(il, p, all_optional=all_optional, fused_qkv=fused_qkv, qk_norm=self.qk_norm,
                              out_bias=self.out_bias)
            t.append(sp.TensorPlan(f"blk.{il}.{self.ffn_norm}.weight", (D,), "norm"))
            if E:
                t += sp.moe_plans(il, D, E, F, all_optional=all_optional)
            else:
                t += sp.dense_ffn_plans(il, D, p["n_ff"], all_optional=all_optional)
        return t + sp.output_plans(p, tied_output=tied_output)

    def synth_metadata(self, p: dict, *, all_optional=False, rope_scaling=None, name=""):
        a = self.arch
        kv = sp.common_metadata(a, p, name=name)
        if self.synth_rope_dims:
            kv.append((f"{a}.rope.dimension_count", p["head_dim"], "u32"))
        if p["head_dim"] != p["n_embd"] // p["n_head"]:
            kv += [(f"{a}.attention.key_length", p["head_dim"], "u32"),
                   (f"{a}.attention.value_length", p["head_dim"], "u32")]
        if p.get("n_expert"):
            kv += [(f"{a}.expert_count", p["n_expert"], "u32"), (f"{a}.expert_used_count", p["n_expert_used"], "u32")]
            if self.expert_ff_length:
                kv.append((f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32"))
            if all_optional and p["n_expert"] >= 4:
                # group-limited routing, read by llama.cpp for every MoE arch (hparams.n_expert_groups)
                kv += [(f"{a}.expert_group_count", p["n_expert"] // 2, "u32"),
                       (f"{a}.expert_group_used_count", p["n_expert"] // 4, "u32")]
        return kv + sp.rope_scaling_metadata(a, p, rope_scaling)
