"""Metadata and weights: every key read with llama.cpp's defaults; bad input named precisely."""
import warnings

import numpy as np
import pytest

from gguf_edit import GGUFValueType, rewrite
from refengine import Model
from refengine.config import ConfigWarning
from refengine.errors import (MissingKeyError, MissingTensorError, NonFiniteError, ShapeError,
                              UnsupportedArchError)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from refengine.synth import write_synth
    return write_synth("llama", tmp_path_factory.mktemp("c") / "base.gguf", seed=1)


def test_missing_required_key(base, tmp_path):
    f = rewrite(base, tmp_path / "k.gguf", drop_keys={"llama.attention.layer_norm_rms_epsilon"})
    with pytest.raises(MissingKeyError, match=r"k\.gguf.*'llama\.attention\.layer_norm_rms_epsilon'"):
        Model(f)


def test_extra_keys_from_other_tools_still_load(base, tmp_path):
    f = rewrite(base, tmp_path / "x.gguf", set_keys={
        "llama.some_new_hparam": (3, GGUFValueType.UINT32),
        "othertool.note": ("written elsewhere", GGUFValueType.STRING),
        "general.quantized_by": ("someone", GGUFValueType.STRING)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no warning either: these keys change nothing
        m = Model(f)
    assert np.array_equal(m.forward([1, 2, 3]), Model(base).forward([1, 2, 3]))


def test_math_key_llamacpp_ignores_is_never_silent(base, tmp_path):
    f = rewrite(base, tmp_path / "s.gguf", set_keys={"llama.attention.scale": (0.5, GGUFValueType.FLOAT32)})
    with pytest.warns(ConfigWarning, match="llama.attention.scale"):
        m = Model(f)
    assert m.cfg.ignored_keys == ("llama.attention.scale",)


def test_wrong_shape(base, tmp_path):
    f = rewrite(base, tmp_path / "w.gguf", drop_tensors={"blk.1.ffn_norm.weight"},
                add_tensors={"blk.1.ffn_norm.weight": np.ones(128, dtype=np.float32)})
    with pytest.raises(ShapeError, match=r"'blk\.1\.ffn_norm\.weight' has shape \[128\].*expected \[256\]"):
        Model(f).forward([1])


def test_missing_tensor(base, tmp_path):
    f = rewrite(base, tmp_path / "m.gguf", drop_tensors={"blk.0.attn_k.weight"})
    with pytest.raises(MissingTensorError, match=r"m\.gguf: required tensor 'blk\.0\.attn_k\.weight'"):
        Model(f).forward([1])


@pytest.mark.parametrize("tensor,index,value", [
    ("blk.0.attn_norm.weight", 5, np.nan),     # a small tensor: refused when the layer loads
    ("blk.1.ffn_down.weight", 1000, np.inf),   # a matrix: caught at the matmul it poisons
])
def test_non_finite_weight_is_named(base, tmp_path, tensor, index, value):
    def fn(name, raw):
        if name == tensor:
            a = raw.reshape(-1).view(np.float32).copy()
            a[index] = value
            return a.view(np.uint8)
    f = rewrite(base, tmp_path / "n.gguf", tensor_fn=fn)
    with pytest.raises(NonFiniteError, match=tensor.replace(".", r"\.")):
        Model(f).forward([1, 2])


def test_non_finite_weight_is_named_resident(base, tmp_path):
    """The device-resident forward checks products on the device and reads the flags back once per forward: the
    poisoned matrix is named all the same."""
    from refengine.runtime import Runtime

    def fn(name, raw):
        if name == "blk.1.ffn_down.weight":
            a = raw.reshape(-1).view(np.float32).copy()
            a[1000] = np.inf
            return a.view(np.uint8)
    f = rewrite(base, tmp_path / "n.gguf", tensor_fn=fn)
    with pytest.raises(NonFiniteError, match=r"blk\.1\.ffn_down\.weight"):
        Model(f).forward([1, 2], rt=Runtime(resident=True))


def test_unsupported_arch(base, tmp_path):
    f = rewrite(base, tmp_path / "a.gguf", set_keys={"general.architecture": ("gpt2", GGUFValueType.STRING)})
    with pytest.raises(UnsupportedArchError, match="gpt2"):
        Model(f)


def test_unused_tensor_is_reported(base, tmp_path):
    f = rewrite(base, tmp_path / "u.gguf", add_tensors={"blk.0.mystery.weight": np.ones(4)})
    assert Model(f).unused_tensors() == ["blk.0.mystery.weight"]


def test_per_layer_head_counts(tmp_path):
    """attention.head_count_kv may be an array with one entry per layer (get_key_or_arr)."""
    from refengine.synth import write_synth
    base = write_synth("llama", tmp_path / "b.gguf", seed=2)
    f = rewrite(base, tmp_path / "p.gguf", drop_keys={"llama.attention.head_count_kv"},
                set_keys={"llama.attention.head_count_kv": ([2, 2], GGUFValueType.ARRAY)})
    m = Model(f)
    assert [l.n_head_kv for l in m.cfg.layers] == [2, 2]
    assert np.array_equal(m.forward([4, 5]), Model(base).forward([4, 5]))


def test_nextn_layers_are_not_trunk(base, tmp_path):
    """block_count counts MTP blocks (nextn_predict_layers) that the trunk does not run."""
    f = rewrite(base, tmp_path / "n.gguf", drop_keys={"llama.block_count"}, set_keys={
        "llama.block_count": (3, GGUFValueType.UINT32), "llama.nextn_predict_layers": (1, GGUFValueType.UINT32)})
    m = Model(f)
    assert m.cfg.n_layer == 2 and m.cfg.n_layer_nextn == 1
    assert np.array_equal(m.forward([4, 5]), Model(base).forward([4, 5]))


@pytest.mark.oracle
def test_non_causal_attention_matches_llamacpp(base, tmp_path):
    """attention.causal = false: every position sees the whole batch (llama.cpp's kq mask follows the key)."""
    from refengine.compare import run_compare
    f = rewrite(base, tmp_path / "nc.gguf", set_keys={"llama.attention.causal": (False, GGUFValueType.BOOL)})
    rep = run_compare(f, [3, 1, 4, 1, 5, 9, 2, 6])
    assert Model(f).cfg.causal_attn is False
    assert rep.ok and rep.logits.nmse <= 1e-8, rep.first_divergence
    causal = Model(base).forward([3, 1, 4, 1, 5, 9, 2, 6])
    assert not np.allclose(causal[:-1], Model(f).forward([3, 1, 4, 1, 5, 9, 2, 6])[:-1])


# ---------------------------------------------------------------- per arch: what llama.cpp's loader requires
# (arch, the edit to its tiny file, the error, a regex its message must match). Refused when missing or out of
# range, naming the key or tensor: qwen3next (qwen3next.cpp's loader), kimi-linear (kimi-linear.cpp:4-31, :41,
# :57-71), kimi-k3 (kimi-k3.cpp:16-51, :53-167). A new arch adds its rows here.
UINT32, FLOAT32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
REQUIRED = [
    ("qwen3next", "no-state-size", dict(drop_keys=["qwen3next.ssm.state_size"]), "MissingKeyError", "ssm.state_size"),
    ("qwen3next", "inner-size", dict(set_keys={"qwen3next.ssm.inner_size": (100, UINT32)}), "ConfigError",
     "inner_size 100"),
    ("qwen3next", "no-qkv", dict(drop_tensors=["blk.0.attn_qkv.weight"]), "MissingTensorError",
     r"blk\.0\.attn_qkv\.weight.*ssm_in"),
    ("qwen3next", "no-ssm_a", dict(drop_tensors=["blk.1.ssm_a"]), "MissingTensorError", r"blk\.1\.ssm_a"),
    ("kimi-linear", "kda.head_dim", dict(drop_keys=("kimi-linear.kda.head_dim",)), "MissingKeyError",
     r"kimi-linear\.kda\.head_dim"),
    ("kimi-linear", "gating-func", dict(drop_keys=("kimi-linear.expert_gating_func",)), "MissingKeyError",
     r"kimi-linear\.expert_gating_func"),
    ("kimi-linear", "output", dict(drop_tensors=("output.weight",)), "MissingTensorError", r"output\.weight"),
    ("kimi-linear", "conv-k", dict(drop_tensors=("blk.1.ssm_conv1d_k.weight",)), "MissingTensorError",
     r"blk\.1\.ssm_conv1d_k\.weight"),
    ("kimi-linear", "exp-probs-b", dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "MissingTensorError",
     r"blk\.1\.exp_probs_b\.bias"),                # created with flags 0 (kimi-linear.cpp:164)
    ("kimi-k3", "res-block-size", dict(drop_keys=("kimi-k3.attn_res.block_size",)), "MissingKeyError",
     r"kimi-k3\.attn_res\.block_size"),
    ("kimi-k3", "situ-beta", dict(drop_keys=("kimi-k3.activation.situ_beta",)), "MissingKeyError",
     r"kimi-k3\.activation\.situ_beta"),
    ("kimi-k3", "situ-linear-beta", dict(drop_keys=("kimi-k3.activation.situ_linear_beta",)), "MissingKeyError",
     r"kimi-k3\.activation\.situ_linear_beta"),
    ("kimi-k3", "situ-beta-0", dict(drop_keys=("kimi-k3.activation.situ_beta",),
                                    set_keys={"kimi-k3.activation.situ_beta": (0.0, FLOAT32)}),
     "InvalidKeyError", r"kimi-k3\.activation\.situ_beta"),
    ("kimi-k3", "output-res-score", dict(drop_tensors=("output_res_score.weight",)), "MissingTensorError",
     r"output_res_score\.weight"),
    ("kimi-k3", "ffn-res-score", dict(drop_tensors=("blk.3.ffn_res_score.weight",)), "MissingTensorError",
     r"blk\.3\.ffn_res_score\.weight"),
    ("kimi-k3", "exp-probs-b", dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "MissingTensorError",
     r"blk\.1\.exp_probs_b\.bias"),
    ("kimi-k3", "routed-up", dict(drop_tensors=("blk.2.ffn_routed_up.weight",)), "MissingTensorError",
     r"blk\.2\.ffn_routed_up\.weight"),
    ("kimi-k3", "ssm_g", dict(drop_tensors=("blk.0.ssm_g.weight",)), "MissingTensorError", r"blk\.0\.ssm_g\.weight"),
    ("deepseek4", "compress-ratios", dict(drop_keys=("deepseek4.attention.compress_ratios",)), "MissingKeyError",
     r"deepseek4\.attention\.compress_ratios"),
    ("deepseek4", "hc-count", dict(drop_keys=("deepseek4.hyper_connection.count",)), "MissingKeyError",
     r"deepseek4\.hyper_connection\.count"),
    ("deepseek4", "hc-count-2", dict(set_keys={"deepseek4.hyper_connection.count": (2, UINT32)}), "ConfigError",
     r"hyper_connection\.count = 2"),
    ("deepseek4", "hash-layers", dict(drop_keys=("deepseek4.hash_layer_count",)), "MissingKeyError",
     r"deepseek4\.hash_layer_count"),
    ("deepseek4", "swiglu-clamp", dict(drop_keys=("deepseek4.swiglu_clamp_exp",)), "MissingKeyError",
     r"deepseek4\.swiglu_clamp_exp"),
    ("deepseek4", "weights-scale", dict(drop_keys=("deepseek4.expert_weights_scale",)), "MissingKeyError",
     r"deepseek4\.expert_weights_scale"),
    ("deepseek4", "gating-sigmoid", dict(set_keys={"deepseek4.expert_gating_func": (2, UINT32)}), "ConfigError",
     r"sqrtsoftplus"),                              # deepseek4.cpp:63-66 throws
    ("deepseek4", "tid2eid", dict(drop_tensors=("blk.0.ffn_gate_tid2eid.weight",)), "MissingTensorError",
     r"blk\.0\.ffn_gate_tid2eid\.weight"),
    ("deepseek4", "exp-probs-b", dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "MissingTensorError",
     r"blk\.1\.exp_probs_b\.bias"),
    ("deepseek4", "indexer-proj", dict(drop_tensors=("blk.1.indexer.proj.weight",)), "MissingTensorError",
     r"blk\.1\.indexer\.proj\.weight"),
    ("deepseek4", "compressor-ape", dict(drop_tensors=("blk.2.attn_compressor_ape.weight",)), "MissingTensorError",
     r"blk\.2\.attn_compressor_ape\.weight"),
    ("deepseek4", "output-hc-fn", dict(drop_tensors=("output_hc_fn.weight",)), "MissingTensorError",
     r"output_hc_fn\.weight"),
    ("deepseek4", "output", dict(drop_tensors=("output.weight",)), "MissingTensorError", r"output\.weight"),
    ("qwen4exp", "hc-count", dict(drop_keys=("qwen4exp.hyper_connection.count",)), "MissingKeyError",
     r"qwen4exp\.hyper_connection\.count"),
    ("qwen4exp", "hc-count-1", dict(drop_keys=("qwen4exp.hyper_connection.count",),
                                     set_keys={"qwen4exp.hyper_connection.count": (1, UINT32)}), "ConfigError",
     r"hyper_connection\.count must be greater than one"),
    ("qwen4exp", "indexer-top-k", dict(drop_keys=("qwen4exp.attention.indexer.top_k",)), "MissingKeyError",
     r"qwen4exp\.attention\.indexer\.top_k"),
    ("qwen4exp", "sections", dict(drop_keys=("qwen4exp.rope.dimension_sections",)), "MissingKeyError",
     r"qwen4exp\.rope\.dimension_sections"),
    ("qwen4exp", "ngram-size", dict(drop_keys=("qwen4exp.ple.ngram_size",)), "MissingKeyError",
     r"qwen4exp\.ple\.ngram_size"),
    ("qwen4exp", "output-hc-up", dict(drop_tensors=("output_hc_up.weight",)), "MissingTensorError",
     r"output_hc_up\.weight"),
    ("qwen4exp", "ple-table", dict(drop_tensors=("per_layer_token_embd.weight",)), "MissingTensorError",
     r"per_layer_token_embd\.weight"),
    ("qwen4exp", "ssm-alpha", dict(drop_tensors=("blk.0.ssm_alpha.weight",)), "MissingTensorError",
     r"blk\.0\.ssm_alpha\.weight"),
    ("qwen4exp", "indexer-k-norm", dict(drop_tensors=("blk.1.indexer.k_norm.weight",)), "MissingTensorError",
     r"blk\.1\.indexer\.k_norm\.weight"),
    ("glm5-next", "kpool", dict(drop_keys=("glm5-next.attention.indexer.kpool",)), "MissingKeyError",
     r"glm5-next\.attention\.indexer\.kpool"),
    ("glm5-next", "kpool-1", dict(set_keys={"glm5-next.attention.indexer.kpool": (1, UINT32)}), "ConfigError",
     r"kpool = 1 must be > 1"),                     # glm5-next.cpp:45 asserts kpool > 1 && top_k % kpool == 0
    ("glm5-next", "kpool-3", dict(set_keys={"glm5-next.attention.indexer.kpool": (3, UINT32)}), "ConfigError",
     r"kpool = 3 must be > 1 and divide attention\.indexer\.top_k = 8"),
    ("glm5-next", "rope-dims", dict(set_keys={"glm5-next.rope.dimension_count": (16, UINT32)}), "ConfigError",
     r"rope\.dimension_count must be 0.*nope-only"),  # :935 asserts n_rot() == 0
    ("glm5-next", "rope-dims-absent", dict(drop_keys=("glm5-next.rope.dimension_count",)), "ConfigError",
     r"rope\.dimension_count must be 0.*absent"),    # absent: n_rot = key_length
    ("glm5-next", "hc-count-2", dict(set_keys={"glm5-next.hyper_connection.count": (2, UINT32)}), "ConfigError",
     r"hyper_connection\.count = 2"),
    ("glm5-next", "hc-epsilon", dict(drop_keys=("glm5-next.hyper_connection.epsilon",)), "MissingKeyError",
     r"glm5-next\.hyper_connection\.epsilon"),
    ("glm5-next", "kda-head-dim", dict(drop_keys=("glm5-next.kda.head_dim",)), "MissingKeyError",
     r"glm5-next\.kda\.head_dim"),
    ("glm5-next", "key-length-mla", dict(drop_keys=("glm5-next.attention.key_length_mla",)), "MissingKeyError",
     r"glm5-next\.attention\.key_length_mla"),
    ("glm5-next", "shared-first", dict(set_keys={"glm5-next.attention.indexer.types": (
        [True, False, True, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL)}), "ConfigError",
     r"MLA block 1 shares the indexer but no earlier MLA block runs one"),
    ("glm5-next", "kpool-ape", dict(drop_tensors=("blk.1.indexer_compressor_ape.weight",)), "MissingTensorError",
     r"blk\.1\.indexer_compressor_ape\.weight"),
    ("glm5-next", "kpool-gate", dict(drop_tensors=("blk.4.indexer_compressor_gate.weight",)), "MissingTensorError",
     r"blk\.4\.indexer_compressor_gate\.weight"),
    ("glm5-next", "exp-probs-b", dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "MissingTensorError",
     r"blk\.1\.exp_probs_b\.bias"),
    ("glm5-next", "ssm-g-a", dict(drop_tensors=("blk.0.ssm_g_a.weight",)), "MissingTensorError",
     r"blk\.0\.ssm_g_a\.weight"),
    ("glm5-next", "hc-attn-fn", dict(drop_tensors=("blk.2.hc_attn_fn.weight",)), "MissingTensorError",
     r"blk\.2\.hc_attn_fn\.weight"),
    ("glm5-next", "output", dict(drop_tensors=("output.weight",)), "MissingTensorError", r"output\.weight"),
]


@pytest.mark.parametrize("arch,edit,err,match", [r[:1] + r[2:] for r in REQUIRED],
                         ids=[f"{r[0]}-{r[1]}" for r in REQUIRED])
def test_required_keys_and_tensors(synth_model, tmp_path, arch, edit, err, match):
    """The edited file is refused with the named error when it is opened, its layers loaded or run."""
    from refengine import errors
    path = rewrite(synth_model(arch), tmp_path / "bad.gguf", **edit)
    with pytest.raises(getattr(errors, err), match=match):
        m = Model(path)
        m.load_all()
        m.forward([1, 2])
