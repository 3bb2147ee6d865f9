"""Files written by llama.cpp's own quantizing writer load in refengine and match llama.cpp (issue 22, dialect 2).

`llama_cpp.llama_model_quantize` is the library function behind `llama-quantize` (src/llama-quant.cpp,
`llama_model_quantize_impl`): its own choice of which tensors to quantize, its own metadata rewrite. For every
registered arch (WRITER_CASES, data): the tiny synthetic F32 file (`refengine.synth.write_synth`) quantized by it
to MOSTLY_Q8_0 and MOSTLY_Q4_K_M (its own type mix, with fallbacks where rows do not fit 256), then
  - the types llama.cpp chose for the notable small tensors are the pinned ones (e.g. kimi-k3: `ssm_f_a`,
    `ssm_f_b`, `ssm_beta` Q8_0 beside F32 `ssm_a` / `ssm_dt.bias` / conv kernels: the Kimi K3 loader case);
  - `refengine.lint` refuses nothing and flags exactly the quantized small matrices (for strict loaders);
  - refengine loads it and, in llama.cpp mode, its logits are within 1e-7 of llama.cpp's or the difference is a
    rounding flip proven by teacher forcing (`refengine.flips.prove_flips`); the outcome pinned in
    tests/llamacpp_mode_outcomes.py as "llamacpp-writer-{arch}-{ftype}".
"""
import numpy as np
import pytest

from refengine.archs import ARCHS

pytestmark = pytest.mark.oracle

FTYPES = ("Q8_0", "Q4_K_M")
_KDA_SMALL = ("ssm_f_a.weight", "ssm_f_b.weight", "ssm_beta.weight")
_DS4_APE = ("attn_compressor_ape.weight", "indexer_compressor_ape.weight")
_K3_TYPES = {"ffn_gate_inp.weight": "F32", "ssm_conv1d_q.weight": "F32", "ssm_a": "F32", "ssm_dt.bias": "F32"}

# ftype -> arch -> ({tensor name suffix: the type llama.cpp's writer gave every such tensor}, {suffixes lint flags})
# (measured with llama-cpp-python 0.3.36). Q8_0: the router gate and 1-D tensors stay F32, every other matrix
# Q8_0. Q4_K_M: llama.cpp's mix (Q6_K output, Q4_K/Q5_K/Q6_K by role), and where rows are not a multiple of 256
# its fallback (Q5_0, Q5_1, Q8_0: "required fallback quantization"): kimi-k3's ssm_f_b (rows of kda.head_dim) Q5_0.
WRITER_CASES = {
    "Q8_0": {
        "llama": ({"token_embd.weight": "Q8_0", "output.weight": "Q8_0", "attn_norm.weight": "F32"}, set()),
        "qwen3moe": ({"ffn_gate_inp.weight": "F32", "ffn_up_exps.weight": "Q8_0"}, set()),
        "deepseek2": ({"ffn_gate_inp.weight": "F32", "attn_k_b.weight": "Q8_0", "exp_probs_b.bias": "F32"}, set()),
        "deepseek32": ({"ffn_gate_inp.weight": "F32", "attn_k_b.weight": "Q8_0", "indexer.proj.weight": "Q8_0"},
                       set()),
        "glm-dsa": ({"ffn_gate_inp.weight": "F32", "attn_k_b.weight": "Q8_0", "indexer.proj.weight": "Q8_0"}, set()),
        "qwen3next": ({"ffn_gate_inp.weight": "F32", "ssm_ba.weight": "Q8_0", "ssm_conv1d.weight": "F32",
                       "ssm_a": "F32"}, {"ssm_ba.weight"}),
        "kimi-linear": ({**_K3_TYPES, "attn_k_b.weight": "Q8_0", "ssm_g_b.weight": "Q8_0",
                         **{n: "Q8_0" for n in _KDA_SMALL}}, set(_KDA_SMALL)),
        "kimi-k3": ({**_K3_TYPES, "attn_k_b.weight": "Q8_0", "ssm_g.weight": "Q8_0",
                     **{n: "Q8_0" for n in _KDA_SMALL}}, set(_KDA_SMALL)),
        # deepseek4: the I32 tid2eid kept; the compressors' ape tables quantized like any matrix (get_rows takes them)
        "deepseek4": ({"ffn_gate_inp.weight": "F32", "ffn_gate_tid2eid.weight": "I32", "hc_attn_fn.weight": "Q8_0",
                       "attn_output_a.weight": "Q8_0", "attn_compressor_ape.weight": "Q8_0",
                       "indexer_compressor_ape.weight": "Q8_0", "attn_sinks.weight": "F32"}, set(_DS4_APE)),
        # glm5-next: llama-quant.cpp:331-346 keeps hc_*, the indexer's matrices, KDA's small ones and the MLA latent's
        # (attn_kv_a_mqa, attn_k_b, attn_v_b) unquantized
        "glm5-next": ({"ffn_gate_inp.weight": "F32", "hc_attn_fn.weight": "F32", "attn_k_b.weight": "F32",
                       "indexer_compressor_gate.weight": "F32", "ssm_f_b.weight": "F32", "attn_q_b.weight": "Q8_0",
                       "ffn_up_exps.weight": "Q8_0"}, set()),
    },
    "Q4_K_M": {
        "llama": ({"token_embd.weight": "Q4_K", "output.weight": "Q6_K", "attn_norm.weight": "F32"}, set()),
        "qwen3moe": ({"ffn_gate_inp.weight": "F32", "ffn_gate_exps.weight": "Q4_K", "output.weight": "Q6_K"}, set()),
        "deepseek2": ({"ffn_gate_inp.weight": "F32", "attn_k_b.weight": "Q5_0", "attn_v_b.weight": "Q5_0"}, set()),
        "deepseek32": ({"ffn_gate_inp.weight": "F32", "attn_k_b.weight": "Q5_0", "indexer.proj.weight": "Q4_K"},
                       set()),
        "glm-dsa": ({"ffn_gate_inp.weight": "F32", "attn_k_b.weight": "Q5_0", "indexer.proj.weight": "Q4_K"}, set()),
        "qwen3next": ({"ffn_gate_inp.weight": "F32", "ssm_ba.weight": "Q4_K", "ssm_conv1d.weight": "F32"},
                      {"ssm_ba.weight"}),
        "kimi-linear": ({**_K3_TYPES, "ssm_f_a.weight": "Q4_K", "ssm_f_b.weight": "Q5_0", "ssm_beta.weight": "Q4_K",
                         "ssm_g_b.weight": "Q5_0", "attn_k_b.weight": "Q5_0"}, set(_KDA_SMALL)),
        "kimi-k3": ({**_K3_TYPES, "ssm_f_a.weight": "Q4_K", "ssm_f_b.weight": "Q5_0", "ssm_beta.weight": "Q4_K",
                     "ssm_g.weight": "Q4_K", "ffn_gate_exps.weight": "Q5_0", "ffn_routed_up.weight": "Q5_0"},
                    set(_KDA_SMALL)),
        # deepseek4's rows of 32 (expert down, D = 64) fall back to Q8_0 / Q5_0; ape of block 2 (ratio 128) Q4_K
        "deepseek4": ({"ffn_gate_inp.weight": "F32", "ffn_gate_tid2eid.weight": "I32", "hc_attn_fn.weight": "Q4_K",
                       "attn_output_a.weight": "Q4_K", "ffn_gate_exps.weight": "Q5_0", "token_embd.weight": "Q5_0",
                       "indexer_compressor_ape.weight": "Q5_0"}, set(_DS4_APE)),
        # glm5-next: the same kept F32; attn_q_a / attn_q_b never below Q8_0 (llama-quant.cpp:472-485); D = 64 rows
        # fall back to Q5_0
        "glm5-next": ({"hc_attn_fn.weight": "F32", "attn_v_b.weight": "F32", "indexer.proj.weight": "F32",
                       "ssm_g_a.weight": "F32", "attn_q_a.weight": "Q8_0", "attn_q_b.weight": "Q8_0",
                       "ffn_gate_exps.weight": "Q5_0", "output.weight": "Q8_0"}, set()),
    },
}
# archs whose file llama.cpp's writer makes unrunnable by llama.cpp itself: ftype -> arch -> ({suffix: type},
# {suffixes lint refuses}). qwen4exp: llama_model_quantize quantizes the PLE layer's 2-D [P, D] norm gammas
# ple_norm_key / ple_norm_query / ple_norm_conv (their names do not end in "_norm.weight", unlike hc_*_norm), and
# the graph's ggml_mul on them aborts the process ("binary_op: unsupported types: dst: f32, src0: f32, src1: q8_0",
# ggml-cpu/binary-ops.cpp:135; measured with llama-cpp-python 0.3.36): lint refuses the file, naming them.
_PLE_NORMS = {"ple_norm_key.weight", "ple_norm_query.weight", "ple_norm_conv.weight"}
WRITER_REFUSED = {
    "Q8_0": {"qwen4exp": ({**{n: "Q8_0" for n in _PLE_NORMS}, "hc_attn_norm.weight": "F32", "ple_conv1d.weight": "F16",
                           "hc_attn_up.weight": "F16", "indexer.q_proj.weight": "F32"}, _PLE_NORMS)},
    "Q4_K_M": {"qwen4exp": ({**{n: "Q4_K" for n in _PLE_NORMS}, "hc_attn_norm.weight": "F32",
                             "ple_conv1d.weight": "F16", "hc_attn_up.weight": "F16", "indexer.q_proj.weight": "F32"},
                            _PLE_NORMS)},
}
CASES = [(a, t) for t in FTYPES for a in WRITER_CASES[t]]
REFUSED_CASES = [(a, t) for t in FTYPES for a in WRITER_REFUSED[t]]
CASE_IDS = [f"llamacpp-writer-{a}-{t}" for a, t in CASES]


def test_every_arch_has_a_case():
    assert all(set(WRITER_CASES[t]) | set(WRITER_REFUSED[t]) == set(ARCHS) for t in FTYPES)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """(arch, ftype) -> path of its tiny synthetic F32 file quantized by llama.cpp's `llama_model_quantize` to
    LLAMA_FTYPE_MOSTLY_{ftype} (each written once)."""
    import llama_cpp
    from refengine.synth import write_synth
    root = tmp_path_factory.mktemp("llamacpp-writer")
    cache = {}

    def get(arch, ftype):
        if (arch, ftype) not in cache:
            src = root / f"{arch}-F32.gguf"
            if not src.exists():
                write_synth(arch, src)
            out = root / f"{arch}-{ftype}.gguf"
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
            params.nthread = 2
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
            assert rc == 0, f"{arch} {ftype}: llama_model_quantize returned {rc}"
            cache[arch, ftype] = str(out)
        return cache[arch, ftype]
    return get


def _types_by_suffix(path) -> dict[str, set[str]]:
    from refengine.gguf import open_gguf
    got: dict[str, set[str]] = {}
    for name, ti in open_gguf(path).tensors.items():
        suffix = name.split(".", 2)[2] if name.startswith("blk.") else name
        got.setdefault(suffix, set()).add(ti.type.name)
    return got


@pytest.mark.parametrize("arch,ftype", CASES, ids=CASE_IDS)
def test_writer_types(quantized, arch, ftype):
    """The types llama.cpp's writer chose for the notable tensors (every layer's copy alike)."""
    got = _types_by_suffix(quantized(arch, ftype))
    want, _ = WRITER_CASES[ftype][arch]
    assert {n: got.get(n) for n in want} == {n: {t} for n, t in want.items()}, (arch, ftype)


@pytest.mark.parametrize("arch,ftype", REFUSED_CASES, ids=[f"llamacpp-writer-{a}-{t}" for a, t in REFUSED_CASES])
def test_lint_refuses_what_llamacpp_cannot_run(quantized, arch, ftype):
    """A file llama.cpp's writer makes that llama.cpp's graph aborts on: the types it wrote, and lint refuses
    exactly the tensors the graph cannot take (llama.cpp is not run: it would end the test process)."""
    from refengine.lint import lint
    path = quantized(arch, ftype)
    got = _types_by_suffix(path)
    want, refused = WRITER_REFUSED[ftype][arch]
    assert {n: got.get(n) for n in want} == {n: {t} for n, t in want.items()}, (arch, ftype)
    rep = lint(path)
    assert rep.refused
    named = {n for n in (t.name.split(".", 2)[2] for t in rep.tensors if t.name.startswith("blk."))
             if any(f".{n}'" in r for r in rep.refusals)}
    assert named == refused and len(rep.refusals) == len(refused), rep.refusals


@pytest.mark.parametrize("arch,ftype", CASES, ids=CASE_IDS)
def test_lint_accepts(quantized, arch, ftype):
    """lint refuses nothing on a file llama.cpp wrote; it flags exactly the quantized small matrices."""
    from refengine.lint import lint
    rep = lint(quantized(arch, ftype))
    assert not rep.refused and not rep.refusals, rep.refusals
    flagged = {t.name.split(".", 2)[2] for t in rep.tensors if any("strict loaders" in f for f in t.flags)}
    assert flagged == WRITER_CASES[ftype][arch][1], (arch, ftype, flagged)


@pytest.mark.parametrize("arch,ftype", CASES, ids=CASE_IDS)
def test_logits_match_llamacpp(quantized, arch, ftype):
    """Loaded by refengine, in llama.cpp mode: logits within 1e-7 of llama.cpp's on 16 tokens (seed 0), or a
    proven rounding flip; held to tests/llamacpp_mode_outcomes.py."""
    from refengine.flips import prove_flips
    from refengine.model import Model
    from tests.llamacpp_mode_outcomes import hold
    model = Model(quantized(arch, ftype))
    tokens = np.random.default_rng(0).integers(0, model.cfg.n_vocab, 16)
    hold(f"llamacpp-writer-{arch}-{ftype}", prove_flips(model, tokens))
