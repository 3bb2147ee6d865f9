"""llama.cpp mode against llama.cpp itself, from one rounding step up to the logits.

1. The partner table and every activation rounding equal libggml-cpu's, byte for byte (`from_float`, and
   the repack path's `ggml_quantize_mat_t` that quantizes 4 rows at a time).
2. One matmul per weight type against ggml-cpu's `ggml_mul_mat`: only float summation order is left.
3. Whole synthetic models (llama, qwen3moe) in Q8_0, Q4_K, Q6_K, Q2_K, IQ2_XXS, MXFP4, F16, BF16:
   - teacher-forced: every quantized matmul of the model fed llama.cpp's own input reproduces llama.cpp's
     output (this covers the kernels llama.cpp really runs there: repacked Q4_K/Q2_K/MXFP4, tiled
     K-quants, llamafile sgemm, MUL_MAT_ID);
   - end to end: logits NMSE <= 1e-7 (compare.TOLERANCE_LLAMACPP). Where a rounding flip (refengine.flips)
     happened before the first divergence the case is reported as xfail with the flip; a divergence
     that no flip explains fails.
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

@pytest.fixture(scope="module")
def runs(synth_model):
    """(arch, type) -> (model, llama.cpp result, refengine trace, logits) in llama.cpp mode, run once."""
    from refengine.model import Model
    from refengine.oracle import run_llamacpp
    from refengine.runtime import Runtime
    from refengine.trace import Trace
    cache = {}

    def get(arch, wtype):
        if (arch, wtype) not in cache:
            model = Model(synth_model(arch, wtype=wtype))
            tokens = np.random.default_rng(0).integers(0, model.cfg.n_vocab, 16)
            trace = Trace()
            logits = model.forward(tokens, rt=Runtime(mode="llamacpp", trace=trace))
            cache[arch, wtype] = (model, run_llamacpp(model.path, tokens, n_ctx=model.n_ctx), trace, logits)
        return cache[arch, wtype]
    return get


def teacher_forced(model, R: dict) -> list[tuple[str, float]]:
    """Every quantized matmul of a model (output projection, router, routed experts, dense FFN, and MLA's per-head
    attn_k_b / attn_v_b products), fed llama.cpp's own input tensor: NMSE against llama.cpp's own output."""
    out = []
    T = R["embd"].reshape(-1, model.cfg.n_embd).shape[0]
    mm = lambda x, w: matmul(np.asarray(x, np.float32).reshape(-1, w.shape[-1]), w, mode="llamacpp")  # noqa: E731
    for il in range(model.cfg.n_layer):
        L = model.layer(il)
        resid = R[f"l_out-{il - 1}"] if il else R["embd"]
        out.append((f"attn_output-{il}", nmse(R[f"ffn_inp-{il}"], mm(R[f"kqv_out-{il}"], L.attn_output) + resid)))
        if getattr(L, "attn_k_b", None) is not None:                           # MLA, absorbed: per-head products
            qn, kqv = R[f"q_nope_perm-{il}"], R[f"kqv-{il}"]                    # [H, T, dn], [H, T, C]
            H = L.attn_k_b.shape[0]
            qn, kqv = qn.reshape(H, T, -1), kqv.reshape(H, T, -1)
            out.append((f"attn_k_b-{il}", nmse(R[f"q_nope_absorbed-{il}"], np.stack([mm(qn[h], L.attn_k_b[h]) for h in range(H)]))))
            out.append((f"attn_v_b-{il}", nmse(R[f"kqv_mla-{il}"], np.stack([mm(kqv[h], L.attn_v_b[h]) for h in range(H)]))))
        h = R[f"ffn_norm-{il}"].reshape(T, -1)                                  # [T, D]
        if getattr(L, "ffn_gate_inp", None) is not None:
            out.append((f"ffn_gate_inp-{il}", nmse(R[f"ffn_moe_logits-{il}"], mm(h, L.ffn_gate_inp))))
            ids = R[f"ffn_moe_topk-{il}"].reshape(T, -1)
            act = R[f"ffn_moe_swiglu-{il}"].reshape(T, ids.shape[1], -1)
            for name, src, w in (("ffn_moe_up", h, L.ffn_up_exps), ("ffn_moe_gate", h, L.ffn_gate_exps),
                                 ("ffn_moe_down", None, L.ffn_down_exps)):
                ref = R[f"{name}-{il}"].reshape(T, ids.shape[1], -1)
                got = np.stack([np.stack([mm((h[t] if src is not None else act[t, a]), w[int(ids[t, a])])[0]
                                          for a in range(ids.shape[1])]) for t in range(T)])
                out.append((f"{name}-{il}", nmse(ref, got)))
        elif getattr(L, "ffn_up", None) is not None:
            out.append((f"ffn_up-{il}", nmse(R[f"ffn_up-{il}"], mm(h, L.ffn_up))))
            out.append((f"ffn_gate-{il}", nmse(R[f"ffn_gate-{il}"], mm(h, L.ffn_gate))))
            out.append((f"ffn_down-{il}", nmse(R[f"ffn_out-{il}"], mm(R[f"ffn_swiglu-{il}"], L.ffn_down))))
    out.append(("output", nmse(R["result_output"], mm(R["result_norm"], model.g.output))))
    return out


DS2_TYPES = ["Q8_0", "Q4_K", "IQ2_XXS"]          # deepseek2: MLA's 3-D attn_k_b / attn_v_b products included
DSA_TYPES = ["Q8_0", "Q4_K"]                     # deepseek32 / glm-dsa: 16 tokens, indexer top-k 8
MODEL_CASES = [(a, t) for a in ("llama", "qwen3moe") for t in MODEL_TYPES] + [("deepseek2", t) for t in DS2_TYPES] \
    + [(a, t) for a in ("deepseek32", "glm-dsa") for t in DSA_TYPES]


@pytest.mark.parametrize("arch,wtype", MODEL_CASES)
def test_teacher_forced_matmuls(runs, arch, wtype):
    model, ref, _, _ = runs(arch, wtype)
    bad = [(n, e) for n, e in teacher_forced(model, ref.tensors) if not e <= TEACHER_TOL]
    assert not bad, f"{arch} {wtype}: matmuls fed llama.cpp's input differ from llama.cpp's output: {bad}"


@pytest.mark.parametrize("arch,wtype", MODEL_CASES)
def test_logits_within_1e7(runs, arch, wtype):
    from refengine.compare import TOLERANCE_LLAMACPP, build_report, metrics
    from refengine.flips import flip_census
    model, ref, trace, logits = runs(arch, wtype)
    got = trace.tensors
    tol = TOLERANCE_LLAMACPP["quantized"]
    figure = metrics(ref.logits, logits)[0]
    if figure <= tol:
        return
    rep = build_report(model.cfg.arch, ref.logits, logits, ref.tensors, ref.order, got, tol)
    census = [f for f in flip_census(model, ref.tensors, got, ref.order, ref.earlier, trace.earlier)
              if f.flips or f.scale_flips]
    names = [s.name for s in rep.tensors]
    first_bad = names.index(rep.first_divergence) if rep.first_divergence in names else len(names)
    ties = [s for s in rep.tensors[:first_bad + 1] if s.name.startswith("top_k-") and "near-tie" in s.note]
    if ties:           # DSA: a key selection decided by a near-tie at the k-th indexer score, before the divergence
        pytest.xfail(f"{arch} {wtype}: logits NMSE {figure:.2e} > {tol:g}: selection near-tie at {ties[0].name} "
                     f"({ties[0].note}) before the first divergence {rep.first_divergence}")
    # a flip at an earlier occurrence of a reused name ("q-1#1") sits just before that name's final tensor
    pos = lambda n: names.index(n.split("#")[0]) - (0.5 if "#" in n else 0) if n.split("#")[0] in names else None  # noqa: E731
    if census and pos(census[0].name) is not None and pos(census[0].name) < first_bad:
        f = census[0]
        pytest.xfail(f"{arch} {wtype}: logits NMSE {figure:.2e} > {tol:g}: rounding flip at {f.name} "
                     f"({f.flips} {f.partner} code(s) of {f.values}, {f.scale_flips} block scale(s); float noise "
                     f"predicts {f.expected:.2g} and {f.expected_scale:.2g}) before the first divergence "
                     f"{rep.first_divergence}")
    pytest.fail(f"{arch} {wtype}: logits NMSE {figure:.2e} > {tol:g} with no rounding flip before "
                f"the first divergence {rep.first_divergence}")
