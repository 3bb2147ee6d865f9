"""llama.cpp mode against llama.cpp itself, from one rounding step up to the logits.

1. The partner table and every activation rounding equal libggml-cpu's, byte for byte (`from_float`, and
   the repack path's `ggml_quantize_mat_t` that quantizes 4 rows at a time).
2. One matmul per weight type against ggml-cpu's `ggml_mul_mat`: only float summation order is left.
3. Whole synthetic models, every arch (LLAMACPP_CASES: arch, write_synth options):
   - teacher-forced: every quantized matmul of the model fed llama.cpp's own input reproduces llama.cpp's
     output (this covers the kernels llama.cpp really runs there: repacked Q4_K/Q2_K/MXFP4, tiled
     K-quants, llamafile sgemm, MUL_MAT_ID);
   - end to end: logits NMSE <= 1e-7 (compare.TOLERANCE_LLAMACPP), or rounding flips proven by teacher
     forcing from llama.cpp (refengine.flips.prove_flips); each case held to its pinned outcome
     (tests/llamacpp_mode_outcomes.py);
   - the proof fails on an injected bug (the final norm scaled, output.weight's input left unrounded), naming
     the tensor where teacher forcing stops agreeing.
"""
import numpy as np
import pytest

from quant import GGMLType, TYPES, QTensor
from quant import ggml as qggml
from quant.llamacpp import PROFILE_REF, cpu_profile, partner, quantize_activation
from quant.ref import matmul
from quant.rounding import bf16_bits, fp16_bits

pytestmark = pytest.mark.oracle

TIE_KINDS = ["normal", "ties", "zeros", "heavy"]
MODEL_TYPES = ["Q8_0", "Q4_K", "Q6_K", "Q2_K", "IQ2_XXS", "MXFP4", "F16", "BF16"]
TEACHER_TOL = 1e-10     # float summation order only (measured ~1e-13)


def nmse(ref, got) -> float:
    r = np.asarray(ref, np.float64).ravel()
    g = np.asarray(got, np.float64).ravel()
    return float(np.sum((g - r) ** 2) / np.sum(r ** 2))


def activations(kind: str, rows: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(TIE_KINDS.index(kind))
    if kind == "normal":
        return rng.standard_normal((rows, n)).astype(np.float32)
    if kind == "ties":      # amax = 127 makes id = 1, so every x.5 is an exact rounding tie
        x = rng.integers(-126, 127, (rows, n)).astype(np.float32) + 0.5
        x[:, ::32] = 127.0
        return x
    if kind == "zeros":
        x = rng.standard_normal((rows, n)).astype(np.float32)
        x[:, :256] = 0
        return x
    return rng.standard_t(2, (rows, n)).astype(np.float32)


# ---------------------------------------------------------------- 1. rounding steps

def test_partner_table_matches_ggml_cpu():
    from quant import ggml_cpu
    for t, info in TYPES.items():
        if info.vec_dot_type is not None:
            assert ggml_cpu.vec_dot_type(t) == info.vec_dot_type, t.name


@pytest.mark.parametrize("kind", TIE_KINDS)
@pytest.mark.parametrize("p", [GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K], ids=lambda t: t.name)
def test_activation_quantizer_bytes(p, kind):
    from quant import ggml_cpu
    x = activations(kind, 8, 512)
    ref = ggml_cpu.from_float(x, p)
    got = quantize_activation(x, p)
    bad = np.flatnonzero((ref != got).any(axis=1))
    assert bad.size == 0, (f"{p.name} ({cpu_profile()}) row {bad[0]}:\nggml {ref[bad[0]].tobytes().hex()}\n"
                           f"ours {got[bad[0]].tobytes().hex()}")
    if kind == "ties" and p != GGMLType.Q8_K and cpu_profile() != PROFILE_REF:
        # the x86 quantizer breaks ties to even, the reference one away from zero: the profiles differ here
        assert not np.array_equal(got, quantize_activation(x, p, PROFILE_REF))


@pytest.mark.parametrize("p", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_partner_bits(p):
    from quant import ggml_cpu
    x = activations("heavy", 4, 1024) * np.float32(3e3)
    ref = ggml_cpu.from_float(x, p).view(np.uint16)
    assert np.array_equal(ref, (fp16_bits if p == GGMLType.F16 else bf16_bits)(x))


def test_repack_quantize_mat_q8_0():
    """ggml_quantize_mat_t<8, Q8_0>: block_q8_0x4 = d[4] fp16 | qs[128], 8 values of each row in turn."""
    from quant import ggml_cpu
    for kind in TIE_KINDS:
        x = activations(kind, 4, 512)
        blk = ggml_cpu.quantize_mat(x, GGMLType.Q8_0, 8).reshape(16, 136)                   # [block, bytes]
        d = blk[:, :8].copy().view(np.float16)                                               # [block, row]
        q = blk[:, 8:].view(np.int8).reshape(16, 4, 4, 8).transpose(2, 0, 1, 3).reshape(4, 16, 32)
        ours = quantize_activation(x, GGMLType.Q8_0).reshape(4, 16, 34)
        assert np.array_equal(ours[..., :2].copy().view(np.float16)[..., 0], d.T), kind
        assert np.array_equal(ours[..., 2:].view(np.int8), q), kind


def test_repack_quantize_mat_q8_k():
    """ggml_quantize_mat_t<8, Q8_K>: block_q8_Kx4 = d[4] f32 | qs[1024] | bsums[64]. Same values d*q as
    quantize_row_q8_K; with +amax and -amax in one block it may pick the other sign for d and q."""
    from quant import ggml_cpu
    for kind in TIE_KINDS:
        x = activations(kind, 4, 512)
        blk = ggml_cpu.quantize_mat(x, GGMLType.Q8_K, 8).reshape(2, 1168)
        d = blk[:, :16].copy().view(np.float32).T                                            # [row, block]
        q = blk[:, 16:1040].view(np.int8).reshape(2, 32, 4, 8).transpose(2, 0, 1, 3).reshape(4, 2, 256)
        ours = quantize_activation(x, GGMLType.Q8_K).reshape(4, 2, 292)
        od = ours[..., :4].copy().view(np.float32)[..., 0]
        oq = ours[..., 4:260].view(np.int8)
        assert np.array_equal(d[..., None] * q, od[..., None] * oq), kind
        assert np.array_equal(np.abs(d), np.abs(od)) and np.array_equal(np.abs(q), np.abs(oq)), kind


# ---------------------------------------------------------------- 2. one matmul vs ggml_mul_mat

# every weight type ggml-cpu can multiply (Q8_1 is only ever an activation: no vec_dot for it)
MATMUL_TYPES = [t for t, i in TYPES.items() if i.vec_dot_type is not None and t != GGMLType.Q8_1]


@pytest.mark.parametrize("t", MATMUL_TYPES, ids=lambda t: t.name)
def test_matmul_vs_ggml_mul_mat(t):
    from quant import ggml_cpu
    O, I = 64, 512
    rng = np.random.default_rng(int(t))
    w = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32)
    x = rng.standard_normal((16, I)).astype(np.float32)
    imatrix = np.ones(I, np.float32) if qggml.requires_imatrix(t) else None
    raw = qggml.quantize(w, t, imatrix).reshape(O, -1)
    wq = QTensor.from_raw(f"w.{t.name}", t, (O, I), raw)
    for rows in (16, 1):       # batched (llamafile / tiled paths) and one token (vec_dot)
        ref = ggml_cpu.mul_mat(raw, t, (O, I), x[:rows])
        got = matmul(x[:rows], wq, mode="llamacpp")
        assert nmse(ref, got) <= TEACHER_TOL, (t.name, rows, nmse(ref, got))
        if partner(t) != GGMLType.F32:     # the rounding is what makes the difference
            assert nmse(ref, matmul(x[:rows], wq, mode="exact")) > 100 * TEACHER_TOL


# ---------------------------------------------------------------- 3. whole models

# (case id, arch, write_synth options): every llama.cpp-mode whole-model case of the test suite; its expected
# outcome is pinned in tests/llamacpp_mode_outcomes.py
# kimi-k3's small KDA matrices with their row length ne0: ssm_f_b's rows (kda.head_dim = 32) take the 32-blocks,
# the others' (D = 256) every type
K3_SMALL = (("ssm_f_a.weight", 256), ("ssm_f_b.weight", 32), ("ssm_beta.weight", 256), ("ssm_g.weight", 256))
K3_SMALL_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "IQ4_NL", "Q4_K", "Q6_K", "Q2_K"]


def _k3_small(t: str) -> dict:
    """kimi-k3's small KDA matrices in type t where their rows (ne0) fit t's block, everything else F32: the
    loader case (llama.cpp takes any type for a MUL_MAT weight)."""
    from quant import type_info
    bs = type_info(t).block_size
    return {"tensor_types": {n: t for n, ne0 in K3_SMALL if ne0 % bs == 0}}


# deepseek4: the routed experts in MXFP4 as published files store them (the converter repacks them, the rest F32);
# and the published mix (conversion/deepseek.py:691-760): FP8 weights written Q8_0, experts MXFP4, the F32 sources
# (hc_* mixes, the head's) kept F32
_DS4_EXPERTS = {f"ffn_{x}_exps.weight": "MXFP4" for x in ("gate", "up", "down")}
DS4_CASES = [("experts-MXFP4", {"tensor_types": _DS4_EXPERTS}),
             ("Q8_0-experts-MXFP4", {"wtype": "Q8_0", "tensor_types": {
                 **_DS4_EXPERTS, "hc_attn_fn.weight": "F32", "hc_ffn_fn.weight": "F32", "output_hc_fn.weight": "F32"}})]

# glm5-next as llama.cpp's quantizer writes it (llama-quant.cpp:331-346, :472-485): the hc_* mixes, the indexer's
# matrices, KDA's small ones (ssm_f_a/f_b/g_a/g_b/beta) and the MLA's latent ones (attn_kv_a_mqa, attn_k_b, attn_v_b)
# never quantized (kept F32); attn_q_a / attn_q_b, never below Q8_0 there, are Q8_0 here (rows of 64 / 32, or too
# short for Q4_K's 256). Q4_K: D = 256 (the tiny preset's 64 is too short a row for it)
_G5_KEPT = {f"{n}.weight": "F32" for n in (
    "hc_attn_fn", "hc_ffn_fn", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a", "ssm_f_b", "ssm_g_a", "ssm_g_b", "ssm_beta", "attn_kv_a_mqa", "attn_k_b",
    "attn_v_b")}
G5_CASES = [("Q8_0", {"wtype": "Q8_0", "tensor_types": _G5_KEPT}),
            ("Q4_K", {"wtype": "Q4_K", "tensor_types": _G5_KEPT, "overrides": {"n_embd": 256}})]

LLAMACPP_CASES = (
    [(f"{a}-{t}", a, {"wtype": t}) for a in ("llama", "qwen3moe") for t in MODEL_TYPES]
    + [(f"deepseek2-{t}", "deepseek2", {"wtype": t}) for t in ("Q8_0", "Q4_K", "IQ2_XXS")]
    + [(f"{a}-{t}", a, {"wtype": t}) for a in ("deepseek32", "glm-dsa") for t in ("Q8_0", "Q4_K")]
    + [(f"qwen3next-{t}", "qwen3next", {"wtype": t}) for t in ("Q8_0", "Q4_K")]
    + [(f"kimi-linear{v}-{t}", "kimi-linear", {"wtype": t, **kw}) for t in ("Q8_0", "Q4_K")
       for v, kw in (("", {}), ("-fused-qkv", {"fused_qkv": True}), ("-legacy", {"preset": "tiny-legacy"}))]
    + [(f"kimi-k3-{t}", "kimi-k3", {"wtype": t}) for t in ("Q8_0", "Q4_K")]
    + [(f"kimi-k3-small-{t}", "kimi-k3", _k3_small(t)) for t in K3_SMALL_TYPES]
    + [(f"deepseek4-{v}", "deepseek4", kw) for v, kw in DS4_CASES]
    + [(f"qwen4exp-{t}", "qwen4exp", {"wtype": t}) for t in ("Q8_0", "Q4_K")]
    + [(f"glm5-next-{v}", "glm5-next", kw) for v, kw in G5_CASES])
CASES_BY_ID = {c[0]: c for c in LLAMACPP_CASES}


@pytest.fixture(scope="module")
def runs(synth_model):
    """case id -> (model, tokens, llama.cpp result, refengine trace, logits) in llama.cpp mode, run once."""
    from refengine.model import Model
    from refengine.oracle import run_llamacpp
    from refengine.runtime import Runtime
    from refengine.trace import Trace
    cache = {}

    def get(case):
        if case not in cache:
            _, arch, kw = CASES_BY_ID[case]
            model = Model(synth_model(arch, **kw))
            for name, t in kw.get("tensor_types", {}).items():        # the file holds the types asked for
                assert {ti.type.name for n, ti in model.gf.tensors.items() if n == name or n.endswith("." + name)} == {t}, name
            tokens = np.random.default_rng(0).integers(0, model.cfg.n_vocab, 16)
            trace = Trace()
            # against llama.cpp: its QSA selection rule (qwen4exp), as refengine.compare runs it
            logits = model.forward(tokens, rt=Runtime(mode="llamacpp", trace=trace, qsa_rule="llamacpp"))
            cache[case] = (model, tokens, run_llamacpp(model.path, tokens, n_ctx=model.n_ctx), trace, logits)
        return cache[case]
    return get


# Quantized matmuls whose input or output tests/matmul_teacher.py cannot take from llama.cpp's trace: per case,
# weight name -> why. Every other quantized matmul of the case is checked.
_K3_Q_NOPE = ("per-head inputs from q_nope, a permuted view of Qcur that kimi-k3's graph names none of (kimi-k3.cpp:"
              "516-525; refengine's q_nope_perm is not a llama.cpp name): heads are located only in named tensors")
_K3_LATENT = ("per-expert rows of routed_in = ffn_routed_down(ffn_norm), which llama.cpp leaves unnamed (kimi-k3.cpp:"
              "575-577): rows are located only in named tensors")
_K3 = {**{f"blk.{il}.attn_k_b.weight": _K3_Q_NOPE for il in (2, 4)},
       **{f"blk.{il}.ffn_{x}_exps.weight": _K3_LATENT for il in (1, 2, 3, 4) for x in ("gate", "up")}}
_G5_Q = ("its output q is unnamed in glm5-next.cpp:944-945 (a node_N of the trace), located by nearness to ours; after "
         "the case's proven rounding flip (tests/llamacpp_mode_outcomes.py) a pool selection changes and ours drifts past "
         "LOCATE_NMSE in the later MLA blocks")
UNNAMED_MATMULS: dict[str, dict[str, str]] = {"kimi-k3-Q8_0": _K3, "kimi-k3-Q4_K": _K3,
                                              "glm5-next-Q8_0": {"blk.4.attn_q_b.weight": _G5_Q},
                                              "glm5-next-Q4_K": {f"blk.{il}.attn_q_b.weight": _G5_Q for il in (3, 4)}}


@pytest.mark.parametrize("case", [c[0] for c in LLAMACPP_CASES])
def test_teacher_forced_matmuls(runs, case):
    """Every quantized matmul of the model (attention and MLA projections, indexers, routers, routed and shared
    experts, dense FFN, output), fed llama.cpp's own input, gives llama.cpp's own output: only float summation
    order is left (this covers the kernels llama.cpp really runs: repacked Q4_K/Q2_K/MXFP4, tiled K-quants,
    llamafile sgemm, MUL_MAT_ID). The matmuls skipped are exactly those listed in UNNAMED_MATMULS."""
    from tests.matmul_teacher import teacher_forced_matmuls
    model, tokens, ref, _, _ = runs(case)
    checked, unnamed = teacher_forced_matmuls(model, tokens, ref)
    bad = {n: e for n, e in checked.items() if not e <= TEACHER_TOL}
    assert not bad, f"{case}: matmuls fed llama.cpp's input differ from llama.cpp's output: {bad}"
    assert unnamed == set(UNNAMED_MATMULS.get(case, {})), f"{case}: skipped {sorted(unnamed)}"
    assert checked, case


@pytest.mark.parametrize("case", [c[0] for c in LLAMACPP_CASES])
def test_logits_within_1e7(runs, case):
    """Logits within 1e-7, or a rounding flip proven by teacher forcing (refengine.flips.prove_flips); the
    outcome held to tests/llamacpp_mode_outcomes.py."""
    from refengine.flips import prove_flips
    from tests.llamacpp_mode_outcomes import hold
    model, tokens, ref, trace, logits = runs(case)
    hold(case, prove_flips(model, tokens, ref, trace=trace, logits=logits))


def test_outcome_table_covers_every_case():
    from tests.llamacpp_mode_outcomes import OUTCOMES
    from tests.test_converter_dialect import MATCH
    from tests.test_llamacpp_writer import CASE_IDS
    from tests.test_llamacpp_written import COMMITTED_CASES
    assert set(OUTCOMES) == (set(CASES_BY_ID) | {"quantize-moe-q2k"} | set(CASE_IDS)
                             | {f"converter-{c}-Q8_0" for c in MATCH} | {f"llama-quantize-{n}" for n in COMMITTED_CASES})


# ---------------------------------------------------------------- the proof fails on injected bugs

def _final_norm_scaled(monkeypatch):
    """The final norm's output multiplied by 1.5 (refengine.globals.rms_head's add_norm: the last block's sum and
    its norm)."""
    import refengine.globals as g
    add_norm = g.add_norm

    def scaled(x, w, eps):
        total, h = add_norm(x, w, eps)
        return total, np.float32(1.5) * h
    monkeypatch.setattr(g, "add_norm", scaled)


def _output_input_unrounded(monkeypatch):
    """In llama.cpp mode, output.weight's input is not rounded to its partner type (exact-mode product)."""
    from refengine.runtime import Runtime
    matmul = Runtime.matmul

    def mm(self, x, w):
        if w.name == "output.weight" and self.mode == "llamacpp":
            return self._be.matmul(self._forced_input(x), w, mode="exact")
        return matmul(self, x, w)
    monkeypatch.setattr(Runtime, "matmul", mm)


@pytest.mark.parametrize("case", ["qwen3moe-Q2_K", "qwen3moe-Q8_0"])
@pytest.mark.parametrize("bug,stop", [(_final_norm_scaled, "result_norm"), (_output_input_unrounded, "result_output")],
                         ids=["final-norm-x1.5", "output-input-unrounded"])
def test_injected_bug_fails_the_proof(runs, monkeypatch, case, bug, stop):
    """A bug is not explained away as a flip: with it patched in, the proof fails, naming the tensor where
    teacher forcing stops agreeing. qwen3moe Q2_K has a real flip to force first (attn_norm-1); Q8_0 none."""
    from refengine.flips import prove_flips
    model, tokens, ref, _, _ = runs(case)
    bug(monkeypatch)
    proof = prove_flips(model, tokens, ref)
    assert proof.outcome == "fails" and proof.stopped_at == stop, proof.summary()


def test_compare_report_names_the_first_flip_in_graph_order_and_the_proof(runs, capsys):
    """`refengine compare --mode llamacpp`: the census in llama.cpp's graph order (an earlier recording of a
    reused name, deepseek2's `q-1#1`, just before the name's last one), the first flip named from it, and the
    flip rule's verdict stated."""
    import json
    import re
    from refengine.cli import main
    from refengine.flips import graph_position
    model, tokens, _, _, _ = runs("deepseek2-Q4_K")
    assert main(["compare", model.path, "--tokens", ",".join(map(str, tokens)), "--mode", "llamacpp", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    order = [t["name"] for t in d["tensors"]]
    pos = [graph_position(f["name"], order) for f in d["flips"]]
    assert pos == sorted(pos)
    assert d["proof"]["outcome"] == "proven-flip"
    main(["compare", model.path, "--tokens", ",".join(map(str, tokens)), "--mode", "llamacpp", "--failures-only"])
    out = capsys.readouterr().out
    first = next(f["name"] for f in d["flips"] if f["flips"] or f["scale_flips"])
    assert re.search(rf"rounding flips \(llamacpp mode\): first at {re.escape(first)} ", out), out
    assert "flip rule (teacher forcing from llama.cpp): proven rounding flip" in out, out
