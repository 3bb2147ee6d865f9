"""Decode equals prefill: prefill N tokens then k one-token decodes give the logits of one prefill of N+k."""
import numpy as np
import pytest

from refengine import Model
from refengine.compare import metrics

TOKENS = [3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64]


def decode_cases():
    """Every registered arch, each small preset (and a quantized and an all-optional case of the first);
    an arch with two attention forms runs both. Adding an arch adds its cases here with no edit."""
    from refengine.archs import ARCHS
    from refengine.synth import PRESETS
    cases = []
    for arch in ARCHS:
        tiny = [p for p in PRESETS.get(arch, {}) if p.startswith("tiny")]
        for i, preset in enumerate(tiny):
            cases.append((arch, dict(preset=preset), None))
            if i == 0:
                cases.append((arch, dict(preset=preset, wtype="Q4_K"), None))
                cases.append((arch, dict(preset=preset, all_optional=True), None))
        forms = ARCHS[arch].ATTN_FORMS if tiny else ()
        for form in forms[1:]:
            cases.append((arch, dict(preset=tiny[0]), form))
    return cases


@pytest.mark.parametrize("arch,kw,form", decode_cases(),
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={w}" for k, w in (v or {}).items()))
def test_decode_equals_prefill(synth_model, arch, kw, form):
    """Prefill 8 tokens, then 4 one-token decodes through the carried state == one prefill of all 12."""
    m = Model(synth_model(arch, **kw))
    full = m.forward(TOKENS, m.new_state(form))                # [N+k, V]
    state = m.new_state(form)
    parts = [m.forward(TOKENS[:8], state)]
    for t in TOKENS[8:]:
        parts.append(m.forward([t], state))
    step = np.concatenate(parts)
    nmse, max_abs, _ = metrics(full, step)
    # only float32 summation order differs (BLAS blocks a 12-row and a 1-row product differently): measured
    # 1e-14 .. 1.6e-12 (deepseek2 all-optional: YaRN and the query temperature); 100x under the F32 tolerance
    assert nmse <= 1e-10, (nmse, max_abs)
    assert np.array_equal(full.argmax(-1), step.argmax(-1))


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_decode_matches_llamacpp_decode(synth_model, arch):
    """The same prefill-then-decode schedule in llama.cpp (its KV cache) and in refengine."""
    from refengine.oracle import run_llamacpp
    path = synth_model(arch)
    ref = run_llamacpp(path, TOKENS, chunks=[8, 1, 1, 1, 1], trace=False).logits
    m = Model(path)
    state = m.new_state()
    got = np.concatenate([m.forward(TOKENS[:8], state)] + [m.forward([t], state) for t in TOKENS[8:]])
    nmse, _, _ = metrics(ref, got)
    assert nmse <= 1e-8, nmse


def test_context_overflow_is_a_clear_error(synth_model):
    from refengine.errors import ConfigError
    m = Model(synth_model("llama"), n_ctx=8)
    with pytest.raises(ConfigError, match="n_ctx = 8"):
        m.forward(list(range(9)))


def test_token_out_of_vocab(synth_model):
    from refengine.errors import ConfigError
    m = Model(synth_model("llama"))
    with pytest.raises(ConfigError, match="token id 256 is outside the vocabulary"):
        m.forward([1, 256])


# llama.cpp's own prefill-then-decode schedule (8 tokens, then 4 one-token calls): its carried state (KV / latent
# cache, conv tails, delta-rule state) against ours, for the archs whose state is more than a KV cache
LLAMACPP_DECODE_CASES = [
    ("qwen3next", dict(overrides={"legacy_ssm_in": True})),
    ("kimi-linear", dict(preset="tiny")),
    ("kimi-linear", dict(preset="tiny-legacy")),
    ("kimi-k3", dict()),                      # the residual bank is rebuilt per call, nothing to carry
]


@pytest.mark.oracle
@pytest.mark.parametrize("arch,kw", LLAMACPP_DECODE_CASES,
                         ids=["qwen3next-legacy-ssm_in", "kimi-linear-tiny", "kimi-linear-tiny-legacy", "kimi-k3-tiny"])
def test_prefill_then_decode_matches_llamacpp(synth_model, arch, kw):
    """Prefill 8 then 4 one-token decodes in both engines: logits NMSE <= 1e-8."""
    from refengine.oracle import run_llamacpp
    path = synth_model(arch, **kw)
    ref = run_llamacpp(path, TOKENS, chunks=[8, 1, 1, 1, 1], trace=False).logits
    m = Model(path)
    state = m.new_state()
    got = np.concatenate([m.forward(TOKENS[:8], state)] + [m.forward([t], state) for t in TOKENS[8:]])
    nmse = metrics(ref, got)[0]
    assert nmse <= 1e-8, f"{arch} {kw}: logits NMSE {nmse:.2e}"
