"""The `refengine` command line: exit status 0 / 1 / 2, JSON fields, clear errors on bad input."""
import json
import subprocess
import sys

import pytest

from refengine.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "refengine.cli", *map(str, args)], capture_output=True, text=True)


def test_help():
    r = run("--help")
    assert r.returncode == 0 and "synth" in r.stdout and "compare" in r.stdout
    for cmd in ("synth", "compare", "run", "info"):
        assert run(cmd, "--help").returncode == 0


def test_synth_info_run(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    assert main(["synth", "qwen3moe", "--type", "Q8_0", "--seed", "4", "-q", "-o", str(f)]) == 0
    assert main(["info", str(f)]) == 0
    out = capsys.readouterr().out
    assert "architecture: qwen3moe" in out and "Q8_0" in out and "n_expert           8" in out
    assert main(["run", str(f), "--tokens", "1,2,3", "-n", "4"]) == 0


@pytest.mark.oracle
def test_compare_json_default_model(capsys):
    """No FILE: the embedded default (a synthetic qwen3moe generated on the spot)."""
    assert main(["compare", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("arch", "ok", "first_divergence", "logits", "tensors"):
        assert k in d
    for k in ("nmse", "max_abs", "cosine", "top1_agreement", "kld_mean", "kld_max"):
        assert k in d["logits"]
    assert d["arch"] == "qwen3moe" and d["ok"] is True and d["first_divergence"] is None
    assert d["logits"]["nmse"] <= 1e-8
    assert len(d["tensors"]) > 40 and {"name", "nmse", "max_abs"} <= set(d["tensors"][0])


@pytest.mark.oracle
def test_compare_exit_1_on_divergence(tmp_path, capsys):
    """A tolerance no f32 computation can meet must give exit status 1 and name the first tensor."""
    f = tmp_path / "m.gguf"
    main(["synth", "llama", "-q", "-o", str(f)])
    capsys.readouterr()
    rc = main(["compare", str(f), "--tokens", "1,2,3", "--tol", "0", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 1 and d["ok"] is False and d["first_divergence"] is not None


def test_bad_input_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    assert main(["info", str(bad)]) == 2
    assert "bad.gguf" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing.gguf")]) == 2
    assert main(["synth", "nosucharch", "-o", str(tmp_path / "x.gguf")]) == 2
    assert main(["synth", "llama", "--type", "Q9_9", "-o", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert "nosucharch" in err and "Q9_9" in err


def test_prompt_on_file_without_tokenizer(tmp_path, capsys):
    f = tmp_path / "m.gguf"
    main(["synth", "llama", "-q", "-o", str(f)])
    assert main(["run", str(f), "--prompt", "hello"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


@pytest.mark.oracle
def test_ctx_and_ubatch_flags(tmp_path, capsys):
    """--ctx above the trained context warns and runs; --ubatch splits the prompt in run, golden and compare
    (compare: both engines in ubatches, the tensors of the first ubatch, logits of every position)."""
    f = tmp_path / "m.gguf"
    main(["synth", "llama", "-q", "-o", str(f)])
    toks = ",".join(str(t) for t in range(1, 21))
    capsys.readouterr()
    assert main(["run", str(f), "--tokens", toks, "-n", "3", "--ctx", "1024", "--ubatch", "7"]) == 0
    cap = capsys.readouterr()
    assert "n_ctx = 1024 > n_ctx_train = 512: possible training context overflow" in cap.err
    ids_ub = cap.err.split("ids: ")[1].splitlines()[0]
    assert main(["run", str(f), "--tokens", toks, "-n", "3"]) == 0
    assert capsys.readouterr().err.split("ids: ")[1].splitlines()[0] == ids_ub
    for args in (["run", "--ubatch", "0"], ["compare", "--ubatch", "-1"], ["golden", "--ctx", "0", "-o", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:           # every command with the flags: argparse refuses by name
            main([args[0], str(f), "--tokens", toks, *args[1:]])
        assert e.value.code == 2 and f"{args[1]} {args[2]}: wants an integer >= 1" in capsys.readouterr().err
    assert main(["compare", str(f), "--tokens", toks, "--ubatch", "8", "--ctx", "256", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] and d["logits"]["nmse"] <= 1e-8
    assert [t["shape"] for t in d["tensors"] if t["name"] == "l_out-0"][0][0] == 8     # the first ubatch's rows
    out = tmp_path / "g"
    assert main(["golden", str(f), "--tokens", toks, "--ubatch", "8", "--ctx", "64", "-q", "-o", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert (man["n_ctx"], man["n_ubatch"], man["intermediates_rows"]) == (64, 8, [0, 8])


def test_run_kernel_policy_errors(tmp_path, capsys):
    """run --kernel-policy: only with --backend cuda, and a setting that is not a KernelPolicy field is named."""
    f = tmp_path / "m.gguf"
    main(["synth", "llama", "-q", "-o", str(f)])
    capsys.readouterr()
    assert main(["run", str(f), "--tokens", "1,2", "-n", "1", "--kernel-policy", "sgemm_min=0"]) == 2
    assert "--kernel-policy" in capsys.readouterr().err
    assert main(["run", str(f), "--tokens", "1,2", "-n", "1", "--backend", "cuda", "--kernel-policy", "nope=1"]) == 2
    assert "has no field 'nope'" in capsys.readouterr().err     # (checked before the backend looks for a GPU)
