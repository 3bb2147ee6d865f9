"""`refengine lint`: the types llama.cpp accepts per tensor, small quantized tensors flagged, refusals named."""
import json

import numpy as np
import pytest
from gguf_edit import rewrite

from refengine.cli import main
from refengine.lint import lint


def retype(src, dst, name, wtype):
    """A copy with one tensor stored in another ggml type (the same values, re-encoded)."""
    from gguf import GGUFWriter
    from gguf.constants import GGMLQuantizationType

    import quant
    from refengine.gguf import LazyArray, open_gguf
    from refengine.synth import encode
    gf = open_gguf(src)
    w = GGUFWriter(str(dst), gf.get("general.architecture"))
    w.kv_data[0].pop("general.architecture", None)
    for k, v in gf.kv.items():
        if not k.startswith("GGUF.") and k != "general.alignment":
            w.add_key_value(k, list(v.value) if isinstance(v, LazyArray) else v, gf.kv_types[k],
                            sub_type=v.elem_type if isinstance(v, LazyArray) else None)
    for n, ti in gf.tensors.items():
        t = quant.type_info(wtype).type if n == name else ti.type
        raw = encode(quant.dequantize(gf.tensor(n)), t).view(np.uint8) if n == name else np.array(gf.tensor(n).raw)
        raw = raw.reshape(*ti.shape[:-1], -1)
        w.add_tensor(n, raw, raw_shape=list(raw.shape), raw_dtype=GGMLQuantizationType(int(t)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from refengine.synth import write_synth
    return write_synth("qwen3moe", tmp_path_factory.mktemp("lint") / "m.gguf", preset="tiny")


def test_clean_file(base, capsys):
    assert main(["lint", str(base), "--scan"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp accepts this file" in out
    rep = lint(base)
    roles = {t.name: (t.role, t.accepts) for t in rep.tensors}
    assert roles["blk.0.attn_norm.weight"] == ("vector", "F32")
    assert roles["blk.0.ffn_gate_inp.weight"] == ("small matrix", "any")
    assert roles["blk.1.ffn_down_exps.weight"] == ("matrix", "any")
    req = {k["key"] for k in rep.keys_read if k["required"]}
    assert {"qwen3moe.block_count", "qwen3moe.embedding_length", "qwen3moe.attention.head_count",
            "qwen3moe.expert_count"} <= req and "qwen3moe.rope.freq_base" not in req


def test_quantized_router_flagged_exit_0(base, tmp_path, capsys):
    """A Q8_0 router gate (a small matrix llama.cpp multiplies in any type): flagged, still exit 0."""
    f = retype(base, tmp_path / "r.gguf", "blk.0.ffn_gate_inp.weight", "Q8_0")
    assert main(["lint", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert not d["refused"] and any("blk.0.ffn_gate_inp.weight" in x for x in d["flags"])


@pytest.mark.parametrize("wtype", ["Q8_0", "F16"])
def test_non_f32_norm_refused(base, tmp_path, capsys, wtype):
    """A norm in Q8_0 or F16: llama.cpp loads it, then ggml-cpu's ggml_mul aborts (measured: the process dies
    in binary_op). Exit 1 naming the tensor."""
    f = retype(base, tmp_path / "n.gguf", "blk.1.attn_norm.weight", wtype)
    assert main(["lint", str(f)]) == 1
    out = capsys.readouterr().out
    assert "REFUSED: tensor 'blk.1.attn_norm.weight' is " + wtype in out


def test_unused_and_wrong_shape_refused(base, tmp_path, capsys):
    extra = rewrite(base, tmp_path / "x.gguf", add_tensors={"blk.0.mystery.weight": np.ones(4, np.float32)})
    assert main(["lint", str(extra)]) == 1
    assert "blk.0.mystery.weight" in capsys.readouterr().out
    short = rewrite(base, tmp_path / "s.gguf", drop_tensors={"blk.1.attn_k_norm.weight"},
                    add_tensors={"blk.1.attn_k_norm.weight": np.ones(64, np.float32)})
    assert main(["lint", str(short), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert any("blk.1.attn_k_norm.weight" in r and "shape" in r for r in d["refusals"])
    nokey = rewrite(base, tmp_path / "k.gguf", drop_keys={"qwen3moe.expert_count"})
    assert main(["lint", str(nokey)]) == 1
    assert "expert_count" in capsys.readouterr().out


def test_scan_counts_nan(base, tmp_path, capsys):
    def fn(n, raw):
        if n == "blk.0.ffn_up_exps.weight":
            a = raw.view(np.float32).copy()
            a.reshape(-1)[:3] = np.nan
            return a.view(np.uint8)
    f = rewrite(base, tmp_path / "nan.gguf", tensor_fn=fn)
    assert main(["lint", str(f), "--scan", "--json"]) == 0                  # llama.cpp loads it
    d = json.loads(capsys.readouterr().out)
    t = {x["name"]: x for x in d["tensors"]}
    assert t["blk.0.ffn_up_exps.weight"]["nonfinite"] == 3 and t["blk.0.ffn_down_exps.weight"]["nonfinite"] == 0


def test_bad_input_exit_2(tmp_path, capsys):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"not a gguf at all")
    assert main(["lint", str(p)]) == 2
    assert "junk.gguf" in capsys.readouterr().err


@pytest.mark.oracle
def test_lint_agrees_with_llamacpp_loader(base, tmp_path):
    """What lint calls refused / accepted is what llama.cpp does with the file (the cases that do not abort
    the process: a quantized router loads and runs; an unconsumed tensor is refused at load)."""
    from refengine.errors import OracleError
    from refengine.oracle import run_llamacpp
    ok = retype(base, tmp_path / "r.gguf", "blk.0.ffn_gate_inp.weight", "Q8_0")
    assert not lint(ok).refused and run_llamacpp(ok, [1, 2], trace=False).logits.shape == (2, 256)
    extra = rewrite(base, tmp_path / "x.gguf", add_tensors={"blk.0.mystery.weight": np.ones(4, np.float32)})
    assert lint(extra).refused
    with pytest.raises(OracleError):
        run_llamacpp(extra, [1, 2], trace=False)
