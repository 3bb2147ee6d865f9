"""Files written by llama.cpp's own tools load in refengine and match llama.cpp (issue 22, dialects 1 and 2).

    writer/*.gguf   llama.cpp's random-model writer: `test-llama-archs -a ARCH -o DIR` (tests/test-llama-archs.cpp:
                    every hparam key through llama_model_saver, per-layer head counts [H, 0] for the hybrid archs,
                    every optional tensor the loader creates), written as {arch}-dense.gguf / {arch}-moe.gguf;
    quant/*.gguf    those files through `llama-quantize` (Q4_K_M with `--tensor-type` overrides making small
                    tensors such as ssm_f_a / ssm_f_b / attn_k_b / ffn_gate_inp / ssm_beta / ssm_alpha Q8_0, and
                    MXFP4_MOE for the MoE files): the Kimi K3 case of a quantized small tensor beside F32 vectors.

The files are megabytes each (n_embd 128-256), so they are not committed: the folder is $REFENGINE_LLAMACPP_WRITTEN
(default build/llamacpp-written), holding writer/ and quant/ as above; without it every case skips. Exhaustive
tier. Two quant/ files under 1 MB are committed (tests/fixtures/llamacpp_written/quant/, the Kimi K3 case, below)
and run in the default tier. To write them: `tests/tools/llamacpp_writers.sh prepare`, `... build` (the two tools
from the oracle's vendored llama.cpp, static: ~45 s on the GPU machine's 16 cores, whose binaries run here), then
`... write` (every arch's writer files, then `llama-quantize --tensor-type NAME=q8_0 ... Q4_K_M` and MXFP4_MOE).

Each file of a registered arch: `refengine lint` refuses
nothing (or, on a file llama.cpp's own graph aborts on, LLAMACPP_ABORTS, exactly the tensors it aborts on); an
all-F32 file matches llama.cpp at NMSE 1e-8 for every tensor llama.cpp names (exact mode); a quantized one, in
llama.cpp mode, is within 1e-7 or a rounding flip proven by teacher forcing (`refengine.flips.prove_flips`).
"""
import os
from pathlib import Path

import numpy as np
import pytest

from reportcheck import check_report

pytestmark = pytest.mark.oracle
exhaustive = pytest.mark.exhaustive
ROOT = Path(__file__).resolve().parents[1]
WRITTEN = Path(os.environ.get("REFENGINE_LLAMACPP_WRITTEN", ROOT / "build" / "llamacpp-written"))
TOKENS = [7, 100, 13, 55, 1, 99, 44, 3, 120, 31, 8, 77, 19, 64, 127, 2, 17, 33, 5, 61, 42, 9, 88, 70]
# archs landing while this file was written (their own helpers add their writer cases)
NOT_YET: set = set()
# the block output's name where it is not l_out: the residual-stream archs name it l_last (deepseek4.cpp:1321,
# qwen4exp.cpp: the second hc_combine of a block renamed)
BLOCK_OUT = {"deepseek4": "l_last", "qwen4exp": "l_last"}
# files llama-quantize writes that llama.cpp's own graph aborts on: file stem -> the tensor suffixes lint refuses.
# qwen4exp: llama-quantize quantizes the PLE layer's [P, D] norm gammas (Q4_K under Q4_K_M, Q8_0 under MXFP4_MOE)
# and the graph's ggml_mul on them aborts ("binary_op: unsupported types: dst: f32, src0: f32, src1: q4_K",
# ggml-cpu/binary-ops.cpp:135; measured on both files with llama-cpp-python 0.3.36), as in test_llamacpp_writer.
_PLE_NORMS = {"ple_norm_key.weight", "ple_norm_query.weight", "ple_norm_conv.weight"}
LLAMACPP_ABORTS = {"qwen4exp-moe.q4km-ovr": _PLE_NORMS, "qwen4exp-moe.mxfp4moe": _PLE_NORMS}


def _arch(path) -> str:
    from refengine.gguf import open_gguf
    return str(open_gguf(path).kv["general.architecture"])


def _files(kind: str) -> list:
    """(id, path) of the files under WRITTEN/kind of a registered arch, found at collection."""
    from refengine.archs import ARCHS
    d = WRITTEN / kind
    if not d.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no {d} (module docstring: how to write it)"))]
    out = []
    for p in sorted(d.glob("*.gguf")):
        arch = _arch(p)
        marks = () if arch in set(ARCHS) - NOT_YET else pytest.mark.skip(reason=f"{arch}: not run here yet")
        out.append(pytest.param(str(p), id=f"{kind}-{p.stem}", marks=marks))
    return out


def _all_f32(path) -> bool:
    from refengine.gguf import open_gguf
    return {t.type.name for t in open_gguf(path).tensors.values()} <= {"F32"}


@exhaustive
@pytest.mark.parametrize("path", _files("writer") + _files("quant"))
def test_lint_refuses_nothing(path, capsys):
    """Exit 0; on a file llama.cpp's graph aborts on (LLAMACPP_ABORTS), exit 1 naming exactly those tensors."""
    from refengine.cli import main
    from refengine.lint import lint
    refused = LLAMACPP_ABORTS.get(Path(path).stem)
    if refused is None:
        assert main(["lint", path]) == 0
        assert "would refuse" not in capsys.readouterr().out
        return
    assert main(["lint", path]) == 1
    assert "verdict: llama.cpp would refuse this file" in capsys.readouterr().out
    rep = lint(path)
    named = {n for n in (t.name.split(".", 2)[2] for t in rep.tensors if t.name.startswith("blk."))
             if any(f".{n}'" in r for r in rep.refusals)}
    assert named == refused and len(rep.refusals) == len(refused), rep.refusals


@exhaustive
@pytest.mark.parametrize("path", _files("writer") + _files("quant"))
def test_matches_llamacpp(path):
    from refengine.compare import run_compare
    from refengine.flips import prove_flips
    from refengine.model import Model
    if Path(path).stem in LLAMACPP_ABORTS:
        pytest.skip("llama.cpp's graph aborts on this file (LLAMACPP_ABORTS): nothing to compare against")
    model = Model(path)
    tokens = np.array([t % model.cfg.n_vocab for t in TOKENS])
    if _all_f32(path):
        # every block's output compared (traced_names' per-arch lists fit synth's files, not every optional
        # tensor this writer adds); only_in_llamacpp empty: every tensor llama.cpp names is traced
        out = BLOCK_OUT.get(_arch(path), "l_out")
        want = {"result_norm", "result_output"} | {f"{out}-{il}" for il in range(model.cfg.n_layer)}
        check_report(run_compare(model, tokens), 1e-8, want=want)
        return
    proof = prove_flips(model, tokens)
    assert proof.outcome in ("pass", "proven-flip"), proof.summary()


@exhaustive
def test_every_registered_arch_has_writer_files():
    """With the folder present: each registered arch has the random-model writer's file(s)."""
    from refengine.archs import ARCHS
    d = WRITTEN / "writer"
    if not d.is_dir():
        pytest.skip(f"no {d}")
    have = {_arch(p) for p in d.glob("*.gguf")}
    assert set(ARCHS) - NOT_YET <= have, sorted(set(ARCHS) - NOT_YET - have)


# ---------------------------------------------------------------- committed: the Kimi K3 case (default tier)
# Two of the quant/ files (each under 1 MB) are committed: kimi-k3 and kimi-linear random-model-writer files
# through `llama-quantize --tensor-type ssm_f_a=q8_0 --tensor-type ssm_f_b=q8_0 ... Q4_K_M`: a Q8_0 `ssm_f_a` /
# `ssm_f_b` beside F32 `ssm_a`, `ssm_dt.bias`, conv kernels and `ssm_beta` (its override ignored, [128, 1]), with
# the writer's per-layer head counts [1, 0] and every other hparam key llama_model_saver writes.
COMMITTED = ROOT / "tests" / "fixtures" / "llamacpp_written" / "quant"
KIMI_TYPES = {"ssm_f_a.weight": "Q8_0", "ssm_f_b.weight": "Q8_0", "ssm_a": "F32", "ssm_dt.bias": "F32",
              "ssm_beta.weight": "F32", "ssm_conv1d_q.weight": "F32", "ffn_gate_inp.weight": "F32",
              "attn_k_b.weight": "Q8_0"}
COMMITTED_CASES = {"kimi-k3-moe.q4km-ovr": "kimi-k3", "kimi-linear-moe.q4km-ovr": "kimi-linear"}


@pytest.mark.parametrize("name", list(COMMITTED_CASES))
def test_committed_kimi_quantized_small_tensors(name, capsys):
    """lint: exit 0, the Q8_0 ssm_f_a / ssm_f_b flagged for strict loaders and nothing else; the types as the tool
    wrote them; in llama.cpp mode within 1e-7 of llama.cpp or a proven flip (pinned: "llama-quantize-{name}")."""
    from refengine.cli import main
    from refengine.flips import prove_flips
    from refengine.gguf import open_gguf
    from refengine.lint import lint
    from refengine.model import Model
    from tests.llamacpp_mode_outcomes import hold
    path = str(COMMITTED / f"{name}.gguf")
    g = open_gguf(path)
    assert g.kv["general.architecture"] == COMMITTED_CASES[name]
    assert list(g.kv[f"{COMMITTED_CASES[name]}.attention.head_count"].value) == [1, 0]
    types = {}
    for n, ti in g.tensors.items():
        types.setdefault(n.split(".", 2)[2] if n.startswith("blk.") else n, set()).add(ti.type.name)
    assert {n: types.get(n) for n in KIMI_TYPES} == {n: {t} for n, t in KIMI_TYPES.items()}
    assert main(["lint", path]) == 0
    assert "llama.cpp accepts this file (2 flag(s) for strict loaders)" in capsys.readouterr().out
    flagged = {t.name for t in lint(path).tensors if any("strict loaders" in f for f in t.flags)}
    assert flagged == {"blk.1.ssm_f_a.weight", "blk.1.ssm_f_b.weight"}
    model = Model(path)
    hold(f"llama-quantize-{name}", prove_flips(model, np.array([t % model.cfg.n_vocab for t in TOKENS])))


@pytest.mark.parametrize("arch,name", [("kimi-k3", "ssm_conv1d_q.weight"), ("qwen3next", "ssm_conv1d.weight")])
def test_f16_conv_kernel_is_refused_by_lint(arch, name, synth_model, capsys):
    """The other half of the Kimi K3 case: an F16 conv kernel. llama-quantize never writes one (measured:
    `--tensor-type ssm_conv1d_q=f16` leaves it F32), nor does the converter (conversion/base.py keeps conv kernels
    F32); from any other writer, ggml_ssm_conv reads F32 only: lint exits 1 naming the tensor."""
    from refengine.cli import main
    path = synth_model(arch, tensor_types={name: "F16"})
    assert main(["lint", path]) == 1
    out = capsys.readouterr().out
    assert f"REFUSED: layer 0: {path}: tensor 'blk.0.{name}' is F16; llama.cpp's op here takes F32 only" in out
    assert "verdict: llama.cpp would refuse this file" in out


# ---------------------------------------------------------------- the writer's 3-D attn_output_a (default tier)
def test_deepseek4_attn_output_a_in_the_writers_3d_form(synth_model, capsys):
    """llama_model_saver (test-llama-archs -o) writes deepseek4's attn_output_a 3-D, {I, Ro, G}; the converter 2-D,
    {I, Ro*G}; llama.cpp creates it with TENSOR_ALLOW_RESHAPE (deepseek4.cpp:120-122: any shape of as many
    elements). The synth file in the writer's form (`wo_a_3d`, the same values as the 2-D file): lint exit 0,
    every block output within 1e-8 of llama.cpp, logits bitwise those of the 2-D file."""
    from refengine.cli import main
    from refengine.compare import run_compare
    from refengine.gguf import open_gguf
    from refengine.model import Model
    path = synth_model("deepseek4", overrides={"wo_a_3d": True})
    assert open_gguf(path).tensors["blk.0.attn_output_a.weight"].shape == (2, 32, 256)      # [G, Ro, I]
    assert main(["lint", path]) == 0
    assert "verdict: llama.cpp accepts this file" in capsys.readouterr().out
    model = Model(path)
    tokens = np.array(TOKENS)
    want = {"result_norm", "result_output"} | {f"l_last-{il}" for il in range(model.cfg.n_layer)}
    check_report(run_compare(model, tokens), 1e-8, want=want)
    flat = Model(synth_model("deepseek4"))
    assert flat.gf.tensors["blk.0.attn_output_a.weight"].shape == (64, 256)               # [G*Ro, I]
    assert np.array_equal(model.forward(tokens), flat.forward(tokens))


def test_deepseek4_attn_output_a_of_another_element_count_is_refused(synth_model, tmp_path):
    """TENSOR_ALLOW_RESHAPE checks the element count only (llama-model-loader.cpp:896-905): [G, Ro, I] written with
    one column short is refused, naming the tensor, the shapes and the rule."""
    from refengine.errors import ShapeError
    from refengine.gguf import open_gguf
    from refengine.model import Model
    from tests.gguf_edit import rewrite
    src = synth_model("deepseek4")
    name = "blk.0.attn_output_a.weight"
    good = np.asarray(open_gguf(src).tensor(name).raw).view(np.float32).reshape(2, 32, 256)
    bad = rewrite(src, tmp_path / "bad.gguf", drop_tensors=(name,), add_tensors={name: good[..., :255]})
    with pytest.raises(ShapeError, match=r"'blk\.0\.attn_output_a\.weight' has shape \[2, 32, 255\] \(NumPy order\), "
                                         r"expected \[64, 256\] or any shape of as many elements"):
        Model(bad).layer(0)
