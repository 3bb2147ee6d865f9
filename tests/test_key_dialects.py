"""Per-layer keys in llama.cpp's writers' dialect: every key llama.cpp reads with `get_key_or_arr` may be a
scalar or an array of one entry per layer, and refengine reads both as llama.cpp does.

llama.cpp 0.3.36 reads `expert_used_count`, `feed_forward_length`, `attention.head_count`,
`attention.head_count_kv` per layer for every arch (llama-model.cpp:1333, :1395-1404) and
`expert_feed_forward_length` in each MoE arch's loader (deepseek2.cpp:18, kimi-linear.cpp:22, kimi-k3.cpp:35,
qwen3moe.cpp:4, qwen3next.cpp:5, deepseek32.cpp:7/23, glm-dsa.cpp:30/45). The graphs and the tensor shapes
take layer 0's entry wherever they call the accessor without a layer (`n_head()` is `n_head(0)`:
LLAMA_LOAD_LOCALS, llm_graph_context's members); `refengine.config.KeyReader.layer0` does the same.
llama.cpp's random-model writer (tests/test-llama-archs.cpp:204-220) stores a Kimi file's head counts as
`[H, 0]` (0 in the KDA blocks); its converters store head_count_kv per layer (conversion/kimi_linear.py:88-98).

Each case: a `synth` file whose keys are rewritten as arrays (UINT32, as llama_model_saver writes them), then
either it loads, `refengine lint` exits 0 and every tensor and the logits match llama.cpp (F32: NMSE <= 1e-8),
or llama.cpp refuses it and refengine refuses it with llama.cpp's reason (`oracle`: None where llama.cpp aborts
the process instead, measured once: the case is then not run through it).
"""
import re
import warnings

import pytest

from gguf_edit import GGUFValueType, rewrite
from reportcheck import check_report

TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2]
U32 = GGUFValueType.UINT32

# id: (arch, synth overrides, {key: per-layer entries})
MATCH = {
    # the random-model writer's form: head_count and head_count_kv [H, 0, 0, H] (MLA in blocks 0 and 3)
    "kimi-linear-writer": ("kimi-linear", {"mla_layers": (0, 3)},
                           {"attention.head_count": [4, 0, 0, 4]}),
    "kimi-linear-uniform": ("kimi-linear", {},
                            {"attention.head_count": [4] * 4, "feed_forward_length": [256] * 4,
                             "expert_feed_forward_length": [64] * 4, "expert_used_count": [2] * 4}),
    "kimi-k3-writer": ("kimi-k3", {"full_attn": (0, 2, 4)},
                       {"attention.head_count": [4, 0, 4, 0, 4]}),
    "kimi-k3-uniform": ("kimi-k3", {},
                        {"attention.head_count": [4] * 5, "expert_feed_forward_length": [64] * 5,
                         "expert_used_count": [2] * 5, "feed_forward_length": [384] * 5}),
    "deepseek2": ("deepseek2", {},
                  {"attention.head_count": [4] * 3, "attention.head_count_kv": [1] * 3,
                   "expert_feed_forward_length": [128] * 3, "expert_used_count": [2] * 3,
                   "feed_forward_length": [512] * 3}),
    "deepseek32": ("deepseek32", {}, {"attention.head_count": [4] * 3, "attention.head_count_kv": [1] * 3,
                                      "expert_feed_forward_length": [128] * 3, "expert_used_count": [2] * 3}),
    "glm-dsa": ("glm-dsa", {}, {"attention.head_count": [4] * 3, "attention.head_count_kv": [1] * 3,
                                "expert_feed_forward_length": [128] * 3, "feed_forward_length": [512] * 3}),
    "qwen3moe": ("qwen3moe", {},
                 {"attention.head_count": [4, 4], "attention.head_count_kv": [2, 2],
                  "expert_feed_forward_length": [256, 256], "expert_used_count": [2, 2]}),
    "llama": ("llama", {}, {"attention.head_count": [4, 4], "attention.head_count_kv": [2, 2],
                            "feed_forward_length": [512, 512]}),
    # deepseek4: get_key_or_arr keys as arrays (the converter already writes swiglu_clamp_exp as one)
    "deepseek4": ("deepseek4", {}, {"attention.head_count": [4] * 3, "attention.head_count_kv": [1] * 3,
                                    "expert_feed_forward_length": [32] * 3, "expert_used_count": [2] * 3}),
    # glm5-next: head_count uniform (the writer's form, test-llama-archs.cpp:213-216), the rest as arrays
    "glm5-next": ("glm5-next", {}, {"attention.head_count": [4] * 5, "expert_feed_forward_length": [32] * 5,
                                    "expert_used_count": [2] * 5, "feed_forward_length": [96] * 5}),
    "qwen3next": ("qwen3next", {}, {"attention.head_count": [4] * 4, "attention.head_count_kv": [2] * 4,
                                    "expert_feed_forward_length": [256] * 4, "expert_used_count": [2] * 4}),
    "qwen4exp": ("qwen4exp", {}, {"attention.head_count": [4] * 4, "attention.head_count_kv": [2] * 4,
                                  "expert_feed_forward_length": [128] * 4, "expert_used_count": [2] * 4}),
}

# id: (arch, overrides, keys, refengine's refusal (regex), llama.cpp's refusal (regex) or None: it aborts)
REFUSED = {
    # the writer's [H, 0] on a file whose block 0 is KDA: every block gets n_head() = 0 heads
    "kimi-linear-kda-first": ("kimi-linear", {}, {"attention.head_count": [0, 0, 0, 4]},
                              r"head_count must be positive in layer 0.*wrong shape", r"has wrong shape"),
    # head_count_kv = H in an MLA block: llama.cpp's latent cache holds one row (GGML_ASSERT, ggml.c:4014)
    "kimi-linear-mla-kv-heads": ("kimi-linear", {"mla_layers": (0, 3)},
                                 {"attention.head_count": [4, 0, 0, 4], "attention.head_count_kv": [4, 0, 0, 4]},
                                 r"MLA block 0 has 4 KV heads.*aborts", None),
    # 0 routed experts in the dense block 0: the MoE blocks would select n_expert_used() = 0 experts
    "deepseek2-used-0-in-dense": ("deepseek2", {}, {"expert_used_count": [0, 2, 2]},
                                  r"n_expert_used must be > 0", r"n_expert_used must be > 0"),
}


def _dialect(synth_model, tmp_path, arch, overrides, keys):
    src = synth_model(arch, overrides=overrides) if overrides else synth_model(arch)
    return str(rewrite(src, tmp_path / f"{arch}.gguf",
                       set_keys={f"{arch}.{k}": (list(v), GGUFValueType.ARRAY, U32) for k, v in keys.items()}))


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(MATCH))
def test_per_layer_keys_load_lint_and_match_llamacpp(case, synth_model, tmp_path, capsys):
    from refengine.cli import main
    from refengine.compare import run_compare
    path = _dialect(synth_model, tmp_path, *MATCH[case])
    assert main(["lint", path]) == 0
    assert "would refuse" not in capsys.readouterr().out
    rep = run_compare(path, TOKENS)
    check_report(rep, 1e-8)


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(REFUSED))
def test_files_llamacpp_refuses_are_refused_with_its_reason(case, synth_model, tmp_path):
    from refengine.errors import ConfigError
    from refengine.model import Model
    arch, overrides, keys, ours, theirs = REFUSED[case]
    path = _dialect(synth_model, tmp_path, arch, overrides, keys)
    with pytest.raises(ConfigError, match=ours):
        Model(path)
    if theirs is not None:
        from refengine.oracle import run_llamacpp
        with pytest.raises(Exception, match=theirs):
            run_llamacpp(path, TOKENS[:4], n_ctx=64)


def test_entries_llamacpp_does_not_read_are_warned(synth_model, tmp_path):
    """An MLA block whose head_count entry differs from layer 0's: llama.cpp's graph runs it with layer 0's
    (n_head()); read the same, with a ConfigWarning naming the key (the file is ambiguous)."""
    from refengine.config import ConfigWarning
    from refengine.model import Model
    path = _dialect(synth_model, tmp_path, "kimi-linear", {"mla_layers": (0, 3)},
                    {"attention.head_count": [4, 0, 0, 8]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = Model(path)
    assert {s.n_head for s in m.cfg.layers} == {4}
    msgs = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert any(re.search(r"attention\.head_count = \[4, 0, 0, 8\].*layer 0's 4", s) for s in msgs), msgs
