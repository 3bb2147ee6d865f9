"""MLA (refengine.attention.mla): naive vs absorbed, against a from-the-equations reference, decode vs prefill,
the trace names llama.cpp uses, and the YaRN scales from the metadata keys."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from numerics import assert_close

from quant import GGMLType, QTensor
from refengine.attention.mla import (MLAConfig, llama_form, mla, mla_config, mla_scales, mla_table, new_state)
from refengine.cache import KVCache, RecurrentState
from refengine.config import KeyReader
from refengine.errors import ConfigError, MissingKeyError
from refengine.ops import rope_cos_sin
from refengine.runtime import Runtime
from refengine.trace import Trace

D, H, DQ, C, DN, R, DV = 32, 4, 24, 16, 8, 4, 6
CASES = {"q_lora": dict(q_lora_rank=DQ, legacy=False), "plain_q": dict(q_lora_rank=0, legacy=False),
         "legacy": dict(q_lora_rank=DQ, legacy=True)}


def make_mc(q_lora_rank, legacy) -> MLAConfig:
    return MLAConfig(n_head=H, q_lora_rank=q_lora_rank, kv_lora_rank=C, qk_nope=DN, qk_rope=R, v_head=DV,
                     kq_scale=1.0 / math.sqrt(DN + R), rope_attn_factor=1.0, rms_eps=1e-6, legacy=legacy)


def qt(name, a) -> QTensor:
    return QTensor.from_raw(name, GGMLType.F32, a.shape, np.ascontiguousarray(a, dtype=np.float32))


def make_weights(mc: MLAConfig, seed=0):
    """Random F32 weights with every tensor of mla_table(0, mc), shapes taken from the table itself."""
    rng = np.random.default_rng(seed)
    cfg = SimpleNamespace(n_embd=D)
    w = {}
    for row in mla_table(0, mc):
        if not row.required:
            w[row.field] = None
            continue
        shape = row.shape(cfg, None)
        if row.dense:                                                     # norm weights
            w[row.field] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = shape[-1]
            w[row.field] = qt(row.name, rng.standard_normal(shape) * (1.5 / math.sqrt(fan_in)))
    return SimpleNamespace(**w)


def run(mc, w, h, form, *, dtype=np.float32, chunks=None, rt=None, trace=None):
    """Feed h [T, D] through mla() in chunks (default: one prefill); returns [T, D]."""
    rt = rt or Runtime(trace=trace)
    st = new_state(mc, form, dtype)
    out, n = [], 0
    for t in (chunks or [h.shape[0]]):
        cos, sin = rope_cos_sin(np.arange(n, n + t), n_rot=R, base=10000.0)
        out.append(mla(h[n:n + t].astype(dtype), w, mc=mc, il=0, state=st, cos=cos, sin=sin, rt=rt, dtype=dtype))
        n += t
    return np.concatenate(out)


def reference(mc, w, h):
    """The paper's MLA straight from the equations, float64, one head and one query at a time."""
    deq = {k: (v.raw.view(np.float32).reshape(v.shape).astype(np.float64) if isinstance(v, QTensor) else v)
           for k, v in vars(w).items()}

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + mc.rms_eps) * g

    def rope(x, p):                                # NORM: rotate (x[2i], x[2i+1]) by p * 10000^(-2i/R)
        y = x.copy()
        for i in range(R // 2):
            th = p * 10000.0 ** (-2 * i / R)
            a, b = x[..., 2 * i], x[..., 2 * i + 1]
            y[..., 2 * i], y[..., 2 * i + 1] = a * math.cos(th) - b * math.sin(th), a * math.sin(th) + b * math.cos(th)
        return y

    h = h.astype(np.float64)
    T = h.shape[0]
    q = rms(h @ deq["attn_q_a"].T, deq["attn_q_a_norm"]) @ deq["attn_q_b"].T if mc.q_lora_rank else h @ deq["attn_q"].T
    q = q.reshape(T, H, DN + R)
    ckv = h @ deq["attn_kv_a_mqa"].T
    c = rms(ckv[:, :C], deq["attn_kv_a_norm"])
    if mc.legacy:
        kv = (c @ deq["attn_kv_b"].T).reshape(T, H, DN + DV)
        k_nope, v = kv[..., :DN], kv[..., DN:]
    else:
        k_nope = np.stack([c @ deq["attn_k_b"][hh] for hh in range(H)], 1)        # [T, H, dn]
        v = np.stack([c @ deq["attn_v_b"][hh].T for hh in range(H)], 1)            # [T, H, dv]
    out = np.zeros((T, H, DV))
    for t in range(T):
        qpe = rope(q[t, :, DN:], t)
        for hh in range(H):
            logits = np.array([(q[t, hh, :DN] @ k_nope[s, hh] + qpe[hh] @ rope(ckv[s, C:], s)) * mc.kq_scale
                               for s in range(t + 1)])
            p = np.exp(logits - logits.max())
            out[t, hh] = (p / p.sum()) @ v[:t + 1, hh]
    return out.reshape(T, H * DV) @ deq["attn_output"].T


@pytest.mark.parametrize("case", list(CASES))
def test_naive_equals_absorbed_float64(case):
    mc = make_mc(**CASES[case])
    w = make_weights(mc)
    h = np.random.default_rng(1).standard_normal((7, D))
    naive = run(mc, w, h, "naive", dtype=np.float64)
    absorbed = run(mc, w, h, "absorbed", dtype=np.float64)
    assert naive.dtype == absorbed.dtype == np.float64
    assert_close(f"{case}: naive vs absorbed (float64)", absorbed, naive, 1e-12)
    # rope_cos_sin gives float32 cos/sin (as ggml): the reference rotates in float64
    assert_close(f"{case}: absorbed vs reference", absorbed, reference(mc, w, h), 1e-7)
    # float32, as llama.cpp computes: the forms differ only by float32 rounding
    assert_close(f"{case}: naive vs absorbed (float32)", run(mc, w, h, "absorbed"), run(mc, w, h, "naive"), 1e-5)


@pytest.mark.parametrize("form", ["absorbed", "naive"])
@pytest.mark.parametrize("case", ["q_lora", "legacy"])
def test_decode_equals_prefill(case, form):
    mc = make_mc(**CASES[case])
    w = make_weights(mc, seed=2)
    h = np.random.default_rng(3).standard_normal((6, D)).astype(np.float32)
    one = run(mc, w, h, form)
    assert_close(f"{case} {form}: prefill 3 + decode 1,1,1", run(mc, w, h, form, chunks=[3, 1, 1, 1]), one, 1e-6)
    assert_close(f"{case} {form}: token by token", run(mc, w, h, form, chunks=[1] * 6), one, 1e-6)


@pytest.mark.parametrize("form", ["absorbed", "naive"])
def test_one_token_is_its_own_value(form):
    """T = 1: softmax over one key is 1, so the output is Wo @ (per-head Wv_b @ c), whatever q and k are."""
    mc = make_mc(**CASES["q_lora"])
    w = make_weights(mc, seed=4)
    h = np.random.default_rng(5).standard_normal((1, D))
    deq = lambda t: t.raw.view(np.float32).reshape(t.shape).astype(np.float64)    # noqa: E731
    ckv = h @ deq(w.attn_kv_a_mqa).T
    c = ckv[:, :C] / np.sqrt(np.mean(ckv[:, :C] ** 2) + mc.rms_eps) * w.attn_kv_a_norm
    v = np.einsum("hvc,tc->thv", deq(w.attn_v_b), c).reshape(1, H * DV)
    assert_close(f"T=1 {form}", run(mc, w, h, form, dtype=np.float64), v @ deq(w.attn_output).T, 1e-12)


def test_trace_names_and_shapes():
    """Absorbed on an MLA file records llama.cpp's deepseek2 names with NumPy shape = reversed ggml ne."""
    mc = make_mc(**CASES["q_lora"])
    w = make_weights(mc)
    T = 3
    h = np.random.default_rng(6).standard_normal((T, D)).astype(np.float32)
    tr = Trace()
    run(mc, w, h, "absorbed", trace=tr)
    want = {"q-0": (T, H, DN + R), "kv_cmpr_pe-0": (T, C + R), "k_pe-0": (T, 1, R), "kv_cmpr-0": (T, C),
            "q_nope-0": (T, H, DN), "q_pe-0": (T, H, R), "q_nope_perm-0": (H, T, DN),
            "q_nope_absorbed-0": (H, T, C), "q_nope_absorbed_perm-0": (T, H, C), "Qcur-0": (T, H, C + R),
            "Kcur-0": (T, 1, C + R), "Vcur-0": (T, 1, C), "kq-0": (H, T, T), "kq_soft_max-0": (H, T, T),
            "kqv-0": (H, T, C), "kqv_mla-0": (H, T, DV), "kqv_out-0": (T, H * DV)}
    assert {k: tr[k].shape for k in want} == want
    # the naive form of the same file records no tensor whose llama.cpp shape belongs to the absorbed form
    tr2 = Trace()
    run(mc, w, h, "naive", trace=tr2)
    assert llama_form(mc) == "absorbed"
    assert not {"Qcur-0", "Kcur-0", "Vcur-0", "kqv-0"} & set(tr2)
    for k in ("q-0", "kv_cmpr-0", "k_pe-0", "q_pe-0", "kq_soft_max-0", "kqv_out-0"):
        assert_close(f"naive {k}", tr2[k], tr[k], 1e-5)
    # legacy file: the naive form is llama.cpp's, with its names
    mcl = make_mc(**CASES["legacy"])
    tr3 = Trace()
    run(mcl, make_weights(mcl), h, "naive", trace=tr3)
    legacy = {"kv-0": (T, H * (DN + DV)), "k_nope_view-0": (T, H, DN), "Vcur_cont-0": (T, H, DV),
              "Qcur-0": (T, H, DN + R), "Kcur-0": (T, H, DN + R), "kqv-0": (H, T, DV), "kqv_out-0": (T, H * DV)}
    assert {k: tr3[k].shape for k in legacy} == legacy


def test_state_carries_its_form():
    """The state made for a form carries it (None: llama.cpp's); mla runs that form and refuses a container of
    another attention (a plain softmax KVCache, a delta-rule RecurrentState)."""
    mc, legacy = make_mc(**CASES["q_lora"]), make_mc(**CASES["legacy"])
    assert [new_state(mc, f).form for f in ("absorbed", "naive")] == ["absorbed", "naive"]
    assert (new_state(mc).form, new_state(legacy).form) == ("absorbed", "naive")
    cos, sin = rope_cos_sin(np.arange(1), n_rot=R, base=10000.0)
    for other in (KVCache(), RecurrentState()):
        with pytest.raises(TypeError, match="form of its state"):
            mla(np.zeros((1, D), np.float32), make_weights(mc), mc=mc, il=0, state=other, cos=cos, sin=sin,
                rt=Runtime())


def test_k_parts_and_names_are_the_callers():
    """k_parts ("rope", "nope") builds the naive form's key crosswise (kimi-linear's legacy graph): another
    result, the same for both chunkings; the absorbed form has no per-head key and ignores it. `names` adds
    the arch's trace names."""
    mc = make_mc(**CASES["legacy"])
    w, h = make_weights(mc), np.random.default_rng(3).standard_normal((4, D)).astype(np.float32)
    cos, sin = rope_cos_sin(np.arange(4), n_rot=R, base=10000.0)

    def go(form, **kw):
        tr = Trace()
        out = mla(h, w, mc=mc, il=0, state=new_state(mc, form), cos=cos, sin=sin, rt=Runtime(trace=tr), **kw)
        return out, tr
    cross = dict(k_parts=("rope", "nope"), names={"K": ("Kcur", "mla_K")})
    (aligned, _), (crossed, tr) = go("naive"), go("naive", **cross)
    assert not np.allclose(aligned, crossed)
    K = tr["mla_K-0"]                                                    # [T, H, dk]: the rope part first
    assert np.array_equal(K, tr["Kcur-0"])
    assert np.array_equal(K[..., :R], np.broadcast_to(tr["k_pe-0"], K[..., :R].shape))
    assert np.array_equal(K[..., R:], tr["k_nope_view-0"])
    assert np.array_equal(go("absorbed")[0], go("absorbed", **cross)[0])
    with pytest.raises(ValueError, match="k_parts"):
        go("naive", k_parts=("nope", "nope"))


def test_output_scale_applied_or_loaded_only():
    """mla_table's apply_output_scale=False loads attn_output.scale under another field: the graph sees none."""
    mc = make_mc(**CASES["q_lora"])
    fields = lambda **kw: {r.name: r.field for r in mla_table(0, mc, **kw)}          # noqa: E731
    assert fields()["blk.0.attn_output.scale"] == "attn_output_scale"
    assert fields(apply_output_scale=False)["blk.0.attn_output.scale"] == "attn_output_scale_unapplied"
    w, h = make_weights(mc), np.random.default_rng(4).standard_normal((2, D)).astype(np.float32)
    cos, sin = rope_cos_sin(np.arange(2), n_rot=R, base=10000.0)
    run1 = lambda w: mla(h, w, mc=mc, il=0, state=new_state(mc), cos=cos, sin=sin, rt=Runtime())   # noqa: E731
    base = run1(w)
    w.attn_output_scale = np.float32([2.0])
    assert np.allclose(run1(w), 2 * base)
    del w.attn_output_scale
    w.attn_output_scale_unapplied = np.float32([2.0])
    assert np.array_equal(run1(w), base)


# ---------------------------------------------------------------- config and scales

def yarn_get_mscale(scale, mscale=1.0):
    """HF transformers DeepSeek-V2/V3 `yarn_get_mscale`."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@pytest.mark.parametrize("mscale_all_dim", [1.0, 0.707, 0.0])
def test_yarn_kq_scale_by_hand(mscale_all_dim):
    """spec 1.3: mscale = a (1 + 0.1 ln f)(1 + 0.1 L ln f), kq_scale = mscale^2 / sqrt(dk), a = rope attn_factor."""
    f, dk = 40.0, 192
    a, kq = mla_scales(head_k=dk, freq_scale=1 / f, ext_factor=1.0, rope_attn_factor=1.0, yarn_log_mul=mscale_all_dim)
    L = mscale_all_dim
    a_hand = (1.0 if L else 1 + 0.1 * math.log(f)) / (1 + 0.1 * math.log(f))
    kq_hand = (a_hand * (1 + 0.1 * math.log(f)) * (1 + 0.1 * L * math.log(f))) ** 2 / math.sqrt(dk)
    assert a == pytest.approx(a_hand, rel=1e-6)
    assert kq == pytest.approx(kq_hand, rel=1e-6)
    if L:   # HF: softmax_scale = dk^-0.5 * yarn_get_mscale(f, mscale_all_dim)^2, rope cos/sin unscaled
        assert kq == pytest.approx(dk ** -0.5 * yarn_get_mscale(f, L) ** 2, rel=1e-6)
        assert a * (1 + 0.1 * math.log(f)) == pytest.approx(1.0, rel=1e-6)   # ggml_rope's own mscale cancelled


def test_no_yarn_kq_scale():
    a, kq = mla_scales(head_k=192, freq_scale=1.0, ext_factor=0.0, rope_attn_factor=1.0, yarn_log_mul=0.0)
    assert a == 1.0 and kq == pytest.approx(192 ** -0.5, rel=1e-7)


class FakeGGUF:
    def __init__(self, kv):
        self.kv, self.path = kv, "fake.gguf"

    def get(self, k, default=None):
        return self.kv.get(k, default)


def common(**kw):
    base = dict(n_layer=61, n_head=128, n_rot=64, head_dim_k=576, head_dim_v=512, rms_eps=1e-6,
                rope_scaling_type="yarn", rope_freq_scale=1 / 40, rope_attn_factor=1.0, n_vocab=129280)
    base.update(kw)
    return base


def v3_keys(**kw):
    kv = {"deepseek2.attention.q_lora_rank": 1536, "deepseek2.attention.kv_lora_rank": 512,
          "deepseek2.attention.key_length_mla": 192, "deepseek2.attention.value_length_mla": 128,
          "deepseek2.rope.scaling.yarn_log_multiplier": np.float32(0.1 * 1.0), "deepseek2.vocab_size": 129280}
    kv.update(kw)
    return {k: v for k, v in kv.items() if v is not None}


def test_config_from_keys_v3():
    mc = mla_config(KeyReader(FakeGGUF(v3_keys()), "deepseek2"), **common())
    assert (mc.n_head, mc.q_lora_rank, mc.kv_lora_rank, mc.qk_nope, mc.qk_rope, mc.v_head, mc.legacy) == \
        (128, 1536, 512, 128, 64, 128, False)
    assert mc.yarn_log_mul == pytest.approx(1.0, rel=1e-7)
    assert mc.kq_scale == pytest.approx(192 ** -0.5 * yarn_get_mscale(40, 1.0) ** 2, rel=1e-6)


def test_config_rules():
    # V2-Lite: 27 layers, no q_lora_rank key read even if present; legacy without *_length_mla
    keys = v3_keys(**{"deepseek2.attention.key_length_mla": None, "deepseek2.attention.value_length_mla": None,
                      "deepseek2.rope.scaling.yarn_log_multiplier": np.float32(0.1 * 0.707)})
    mc = mla_config(KeyReader(FakeGGUF(keys), "deepseek2"), **common(n_layer=27, head_dim_k=192, head_dim_v=128))
    assert mc.q_lora_rank == 0 and mc.legacy and (mc.qk_nope, mc.v_head) == (128, 128)
    assert mc.yarn_log_mul == pytest.approx(0.707, rel=1e-6)
    # 48 layers is lite only with a 128256 vocab
    no_q = v3_keys(**{"deepseek2.attention.q_lora_rank": None, "deepseek2.vocab_size": 128256})
    assert mla_config(KeyReader(FakeGGUF(no_q), "deepseek2"), **common(n_layer=48)).q_lora_rank == 0
    with pytest.raises(MissingKeyError, match="q_lora_rank"):
        mla_config(KeyReader(FakeGGUF(v3_keys(**{"deepseek2.attention.q_lora_rank": None})), "deepseek2"), **common())
    with pytest.raises(ConfigError, match="key_length"):
        mla_config(KeyReader(FakeGGUF(v3_keys()), "deepseek2"), **common(head_dim_k=192))


# ---------------------------------------------------------------- against llama.cpp

def write_deepseek2(path, *, legacy: bool, yarn: bool) -> None:
    """A one-layer deepseek2 GGUF (dense FFN, F32) with the attention tensors of an MLA or a legacy file."""
    import gguf
    Dm, Hm, Dqm, Cm, Rm, DNm, DVm, Vm = 64, 4, 32, 32, 16, 16, 16, 64
    rng = np.random.default_rng(0)
    w, a = gguf.GGUFWriter(str(path), "deepseek2"), "deepseek2"
    u32 = {"context_length": 256, "embedding_length": Dm, "block_count": 1, "feed_forward_length": 64,
           "attention.head_count": Hm, "attention.head_count_kv": Hm if legacy else 1,
           "attention.key_length": DNm + Rm if legacy else Cm + Rm, "attention.value_length": DVm if legacy else Cm,
           "rope.dimension_count": Rm, "leading_dense_block_count": 1, "attention.q_lora_rank": Dqm,
           "attention.kv_lora_rank": Cm, "expert_feed_forward_length": 32, "expert_shared_count": 1, "vocab_size": Vm}
    if not legacy:
        u32.update({"attention.key_length_mla": DNm + Rm, "attention.value_length_mla": DVm})
    for k, v in u32.items():
        w.add_uint32(f"{a}.{k}", v)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", "none")
    if yarn:
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 40.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 64)
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * 0.707)
    shapes = {"token_embd": (Vm, Dm), "output_norm": (Dm,), "output": (Vm, Dm), "blk.0.attn_norm": (Dm,),
              "blk.0.attn_q_a": (Dqm, Dm), "blk.0.attn_q_a_norm": (Dqm,), "blk.0.attn_q_b": (Hm * (DNm + Rm), Dqm),
              "blk.0.attn_kv_a_mqa": (Cm + Rm, Dm), "blk.0.attn_kv_a_norm": (Cm,),
              "blk.0.attn_output": (Dm, Hm * DVm), "blk.0.ffn_norm": (Dm,), "blk.0.ffn_gate": (64, Dm),
              "blk.0.ffn_up": (64, Dm), "blk.0.ffn_down": (Dm, 64)}
    shapes.update({"blk.0.attn_kv_b": (Hm * (DNm + DVm), Cm)} if legacy else
                  {"blk.0.attn_k_b": (Hm, Cm, DNm), "blk.0.attn_v_b": (Hm, DVm, Cm)})
    for name, shape in shapes.items():
        x = 1 + 0.2 * rng.standard_normal(shape) if len(shape) == 1 else \
            rng.standard_normal(shape) * (1.0 if name == "token_embd" else 1.5 / math.sqrt(shape[-1]))
        w.add_tensor(name + ".weight", x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["mla", "legacy", "mla-yarn"])
def test_mla_vs_llamacpp(tmp_path, kind):
    """Both forms on llama.cpp's own attn_norm-0: every traced name both sides have, and the attention output
    (llama.cpp's ffn_inp-0 minus the embeddings), within the F32 tolerance (NMSE 1e-8)."""
    import quant
    from refengine.compare import KV_PADDED, metrics
    from refengine.config import read_common
    from refengine.gguf import open_gguf
    from refengine.oracle.llamacpp import run_llamacpp
    from refengine.weights import load_tensors
    path = tmp_path / f"{kind}.gguf"
    write_deepseek2(path, legacy=kind == "legacy", yarn=kind.endswith("yarn"))
    tokens = [3, 17, 42, 5, 9, 60, 1]
    ref = run_llamacpp(path, tokens, trace=True)
    gf = open_gguf(path)
    r = KeyReader(gf, "deepseek2")
    cm, n_head, _ = read_common(r, rope_type=0, n_vocab=64)
    mc = mla_config(r, n_head=n_head[0], **cm)
    w = load_tensors(gf, mla_table(0, mc), SimpleNamespace(n_embd=64), None, 0)
    h = ref.tensors["attn_norm-0"].reshape(len(tokens), 64)
    cos, sin = rope_cos_sin(np.arange(len(tokens)), n_rot=mc.qk_rope, base=cm["rope_freq_base"],
                            freq_scale=cm["rope_freq_scale"], ext_factor=1.0 if cm["rope_scaling_type"] == "yarn" else 0.0,
                            attn_factor=mc.rope_attn_factor, n_ctx_orig=cm["n_ctx_orig_yarn"])
    attn = ref.tensors["ffn_inp-0"].reshape(len(tokens), 64) - quant.dequantize(gf.tensor("token_embd.weight"))[tokens]
    for form in ("absorbed", "naive"):
        tr = Trace()
        out = mla(h, w, mc=mc, il=0, state=new_state(mc, form), cos=cos, sin=sin, rt=Runtime(trace=tr))
        assert metrics(attn, out)[0] <= 1e-8, f"{kind} {form}: attention output"
        shared = [n for n in ref.order if n in tr]
        assert {"q-0", "kv_cmpr-0", "k_pe-0", "kq_soft_max-0", "kqv_out-0"} <= set(shared)
        if form == llama_form(mc):
            assert {"Qcur-0", "Kcur-0", "kqv-0"} <= set(shared)
        for n in shared:
            want = ref.tensors[n]
            if n.split("-")[0] in KV_PADDED and want.shape[-1] > tr[n].shape[-1]:   # llama.cpp's padded KV view
                want = want[..., :tr[n].shape[-1]]
            assert want.size == tr[n].size, f"{kind} {form} {n}: llama.cpp {want.shape}, ours {tr[n].shape}"
            assert metrics(want, tr[n])[0] <= 1e-8, f"{kind} {form} {n}"


@pytest.mark.parametrize("form", ["absorbed", "naive"])
@pytest.mark.parametrize("case", list(CASES))
def test_blocked_equals_one_shot_float64(case, form):
    """600 positions (two key blocks, three query blocks of mha.attention_blocked): the blocked attention
    (no trace keeps the scores) == the one-shot one (a trace keeps them), in float64."""
    mc = make_mc(**CASES[case])
    w = make_weights(mc)
    h = np.random.default_rng(3).standard_normal((600, D))
    blocked = run(mc, w, h, form, dtype=np.float64)
    one_shot = run(mc, w, h, form, dtype=np.float64, trace=Trace())
    assert blocked.dtype == one_shot.dtype == np.float64
    assert np.max(np.abs(blocked - one_shot)) <= 1e-12 * np.max(np.abs(one_shot))
