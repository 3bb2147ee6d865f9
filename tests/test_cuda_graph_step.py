"""Decode steps replayed from a captured CUDA graph (refengine/cuda/graph_step.py) on the GPU: for each arch whose
decode step tests/test_capture.py proves capturable on the sim device, the tiny preset in Q8_0, a prompt then
decoded tokens (past the point where a cache doubles, so one recapture happens): the graph's logits equal bit for bit
those of the eager device-resident run with the same fixed shapes (the same kernels in the same order), and stay
within rel-RMS 1e-5 of the NumPy backend with the same argmax.

Needs a GPU and CuPy (skipped otherwise).
"""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from numerics import rel_rms  # noqa: E402
from refengine.model import Model  # noqa: E402
from refengine.runtime import Runtime  # noqa: E402
from test_capture import CAPTURABLE  # noqa: E402

pytestmark = pytest.mark.cuda
GPU = not qc.SIM and qc.available()
PROMPT = [3, 17, 101, 5, 250, 42, 7]
DECODE = [9, 44, 2, 71, 18, 5, 33, 60, 12, 8, 90, 1, 27, 64, 3, 11, 50, 7, 21, 38]   # 7 + 20 > 16: a cache grows


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", CAPTURABLE)
def test_graph_decode_equals_eager(synth_model, arch):
    pytest.importorskip("cupy")
    from refengine.cuda.graph_step import GraphDecoder
    m = Model(synth_model(arch, wtype="Q8_0"))
    eager, graph, host = Runtime(backend="cuda", fixed_shapes=True), Runtime(backend="cuda", fixed_shapes=True), \
        Runtime()
    st_e, st_g, st_h = m.new_state(), m.new_state(), m.new_state()
    for rt, st in ((eager, st_e), (graph, st_g), (host, st_h)):
        m.forward(PROMPT, st, rt=rt)
    dec = GraphDecoder(m, graph, st_g)
    for i, tok in enumerate(DECODE):
        want = m.forward([tok], st_e, rt=eager)[-1]
        got = dec.step(tok)
        ref = m.forward([tok], st_h, rt=host)[-1]
        assert np.array_equal(got, want), f"{arch} token {i}: graph != eager fixed-shape, max " \
                                          f"{np.max(np.abs(got - want)):.3g} ({dec.eager} eager, {dec.replays} replays)"
        assert rel_rms(got, ref) <= 1e-5 and np.argmax(got) == np.argmax(ref), f"{arch} token {i} vs numpy"
    assert st_g.n_past == st_e.n_past and dec.replays >= len(DECODE) - 4 and dec.captures >= 2, \
        (dec.eager, dec.captures, dec.replays, dec.failed)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next", "kimi-k3", "deepseek4", "glm5-next"])
def test_graph_ubatches_equal_eager(synth_model, arch):
    """A prompt in ubatches of 4 tokens through one decoder with room reserved (a graph per token count: eager,
    capture, replays), then decoded tokens: each last position equals the eager fixed-shape run's bit for bit (the
    same kernels: under 128 tokens no product takes cuBLAS) and the NumPy backend's within rel-RMS 1e-5."""
    pytest.importorskip("cupy")
    from refengine.cuda.graph_step import GraphDecoder
    m = Model(synth_model(arch, wtype="Q8_0"))
    eager, graph, host = Runtime(backend="cuda", fixed_shapes=True), Runtime(backend="cuda", fixed_shapes=True), \
        Runtime()
    st_e, st_g, st_h = m.new_state(), m.new_state(), m.new_state()
    dec = GraphDecoder(m, graph, st_g)
    dec.reserve(48)
    steps = [DECODE[i:i + 4] for i in range(0, 20, 4)] + [[t] for t in DECODE[:6]]
    for i, toks in enumerate(steps):
        want = m.forward(toks, st_e, rt=eager, last_only=True)[-1]
        got = dec.step(toks if len(toks) > 1 else toks[0])
        ref = m.forward(toks, st_h, rt=host, last_only=True)[-1]
        assert np.array_equal(got, want), f"{arch} step {i}: max {np.max(np.abs(got - want)):.3g} ({dec.failed})"
        assert rel_rms(got, ref) <= 1e-5 and np.argmax(got) == np.argmax(ref), f"{arch} step {i} vs numpy"
    assert dec.failed is None and dec.replays == 3 + 4, (dec.eager, dec.captures, dec.replays)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next", "kimi-k3", "deepseek4", "llama"])
def test_graph_greedy_feeds_itself(synth_model, arch):
    """`GraphDecoder.greedy` on the GPU (each replay's argmax fed to the next on the device, replays launched back to
    back, ids read once a chunk): the ids of `Model.generate` on the eager fixed-shape runtime, with and without
    room reserved (a cache growing mid-run: an eager step and a new capture)."""
    pytest.importorskip("cupy")
    from refengine.cuda.graph_step import GraphDecoder
    m = Model(synth_model(arch, wtype="Q8_0"))
    want = m.generate(PROMPT, 24, rt=Runtime(backend="cuda", fixed_shapes=True))
    for reserve in (True, False):
        rt, st = Runtime(backend="cuda", fixed_shapes=True), m.new_state()
        first = int(np.argmax(m.forward(PROMPT, st, rt=rt, last_only=True)[-1]))
        dec = GraphDecoder(m, rt, st)
        if reserve:
            dec.reserve(len(PROMPT) + 24)
        got = dec.greedy(first, 24, chunk=5)
        assert got == want and dec.failed is None and dec.replays >= 16, (arch, reserve, got, want, dec.failed)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["qwen3next", "deepseek2"])
def test_graph_generate_stops_at_eos(synth_model, arch):
    """`GraphDecoder.generate` on the GPU (what `run --graph` decodes with: runs of greedy replays): Model.generate's
    ids on the eager fixed-shape runtime, ending at an eos met inside a run as generate ends there."""
    pytest.importorskip("cupy")
    from refengine.cuda.graph_step import GraphDecoder
    m = Model(synth_model(arch, wtype="Q8_0"))
    plain = m.generate(PROMPT, 20, rt=Runtime(backend="cuda", fixed_shapes=True))
    eos = plain[9]
    for stop, want in ((None, plain), (eos, plain[:plain.index(eos) + 1])):
        rt, st = Runtime(backend="cuda", fixed_shapes=True), m.new_state()
        last = m.forward(PROMPT, st, rt=rt, last_only=True)
        dec = GraphDecoder(m, rt, st)
        dec.reserve(len(PROMPT) + 20)
        got = dec.generate(last, 20, eos=stop, chunk=8)
        assert got == want and dec.failed is None, (arch, stop, got, want, dec.failed)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["qwen3next", "deepseek2"])
def test_graph_large_ubatches_capture(synth_model, arch):
    """Ubatches past the cuBLAS threshold (136 tokens) through one decoder: the eager step takes the capture's
    kernels (`timing.graph_kernels`: no cuBLAS, the tensor-core products and their tables made outside the capture),
    the second ubatch is captured and the third replays it, nothing invalidates the capture, and each last position
    stays within rel-RMS 1e-5 of the NumPy backend with the same argmax."""
    pytest.importorskip("cupy")
    from refengine.cuda.graph_step import GraphDecoder
    m = Model(synth_model(arch, wtype="Q8_0"))
    U = 136
    if m.n_ctx < 3 * U + 8:
        pytest.skip(f"n_ctx {m.n_ctx}")
    ids = [int(t) for t in np.random.default_rng(5).integers(0, m.cfg.n_vocab, 3 * U)]
    st_g, st_h = m.new_state(), m.new_state()
    dec = GraphDecoder(m, Runtime(backend="cuda", fixed_shapes=True), st_g)
    dec.reserve(3 * U + 8)
    for i in range(3):
        got = dec.step(ids[i * U:(i + 1) * U])
        ref = m.forward(ids[i * U:(i + 1) * U], st_h, rt=Runtime(), last_only=True)[-1]
        assert dec.failed is None, dec.failed
        assert rel_rms(got, ref) <= 1e-5 and np.argmax(got) == np.argmax(ref), f"{arch} ubatch {i}"
    assert (dec.eager, dec.captures, dec.replays) == (1, 1, 1)
