"""The graph driver (refengine/cuda/graph_step.py GraphDecoder) on the "sim" device, where a CUDA graph is a tape of
the captured span's ops recomputed into the same buffers (`Device.taping` / `Device.replay`): what a replay runs is
only those ops, no Python of the span, so the driver's own work is what keeps the sequence right: the token id and
position written into the captured step's buffers, every state int the step changed advanced by its delta, state
arrays the step replaced written back, a recapture when a cache is full.

For each arch whose decode step is capturable (tests/test_capture.py), tiny preset: a prompt, then 20 decoded tokens
(past the cache's first capacity of 16 rows: one eager step and one recapture on the way) through the decoder, each
step's logits equal bit for bit to the eager run of the same fixed shapes; the counters say how many steps were
replayed. A control: replaying a tape without the driver's position update gives other logits (the check can fail).
"""
from pathlib import Path

import numpy as np
import pytest

from refengine.cuda.graph_step import GraphDecoder, state_leaves
from refengine.errors import ConfigError
from refengine.model import Model
from refengine.runtime import Runtime
from test_capture import CAPTURABLE

ROOT = Path(__file__).resolve().parent.parent

PROMPT = [3, 17, 101, 5, 250, 42, 7]
DECODE = [9, 44, 2, 71, 18, 5, 33, 60, 12, 8, 90, 1, 27, 64, 3, 11, 50, 7, 21, 38]


@pytest.mark.parametrize("arch", CAPTURABLE)
def test_sim_graph_decode_equals_eager(synth_model, arch):
    m = Model(synth_model(arch, wtype="Q4_K"))
    eager, graph = Runtime(resident=True, fixed_shapes=True), Runtime(resident=True, fixed_shapes=True)
    st_e, st_g = m.new_state(), m.new_state()
    m.forward(PROMPT, st_e, rt=eager)
    m.forward(PROMPT, st_g, rt=graph)
    dec = GraphDecoder(m, graph, st_g)
    for i, tok in enumerate(DECODE):
        want = m.forward([tok], st_e, rt=eager)[-1]
        got = dec.step(tok)
        assert np.array_equal(got, want), f"{arch} token {i}: max {np.max(np.abs(got - want)):.3g} " \
                                          f"({dec.eager} eager, {dec.captures} captures, {dec.replays} replays)"
    assert st_g.n_past == st_e.n_past == len(PROMPT) + len(DECODE)
    assert dec.eager == 2 and dec.captures == 2 and dec.replays == len(DECODE) - 4, \
        (dec.eager, dec.captures, dec.replays)
    ints = lambda st: {p: v for p, (_, _, v) in state_leaves(st).items() if isinstance(v, (int, np.integer))}  # noqa
    assert ints(st_g) == ints(st_e)                  # every host counter where the eager run has it


UBATCH_ARCHS = ["deepseek2", "qwen3next", "kimi-k3", "deepseek4", "glm-dsa", "qwen4exp", "glm5-next"]


@pytest.mark.parametrize("arch", UBATCH_ARCHS)
def test_sim_graph_ubatches_equal_eager(synth_model, arch):
    """A prompt prefilled in ubatches of 4 tokens, then decoded a token at a time, through one decoder: a graph per
    token count (4 and 1), each captured at its second step and replayed after; a cache that grows ends every graph.
    The last position's logits of each ubatch and step equal the eager fixed-shape run's bit for bit, and the host
    counters end where the eager run's do."""
    m = Model(synth_model(arch, wtype="Q4_K"))
    eager, graph = Runtime(resident=True, fixed_shapes=True), Runtime(resident=True, fixed_shapes=True)
    st_e, st_g = m.new_state(), m.new_state()
    dec = GraphDecoder(m, graph, st_g)
    prompt = DECODE[:20]
    steps = [prompt[i:i + 4] for i in range(0, 20, 4)] + [[t] for t in DECODE[:6]]
    kinds = []
    for i, toks in enumerate(steps):
        want = m.forward(toks, st_e, rt=eager, last_only=True)[-1]
        n = (dec.eager, dec.captures, dec.replays)
        got = dec.step(toks if len(toks) > 1 else toks[0])
        kinds.append("ecr"[[a != b for a, b in zip(n, (dec.eager, dec.captures, dec.replays))].index(True)])
        assert np.array_equal(got, want), f"{arch} step {i} ({len(toks)} tokens, {kinds[-1]}): " \
                                          f"max {np.max(np.abs(got - want)):.3g}"
    assert "".join(kinds) == "ecrre" + "ecrrrr", kinds   # (ubatch 5 outgrows 16 rows; a token's first step eager)
    ints = lambda st: {p: v for p, (_, _, v) in state_leaves(st).items() if isinstance(v, (int, np.integer))}  # noqa
    assert ints(st_g) == ints(st_e)


@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next", "deepseek4"])
def test_sim_graph_ubatches_reserved(synth_model, arch):
    """With room reserved for the whole sequence (`GraphDecoder.reserve`) no cache grows: the prompt's ubatches go
    eager, capture, replay, replay, replay and the tokens after it eager, capture, replays; every last position
    equals the eager fixed-shape run's."""
    m = Model(synth_model(arch, wtype="Q4_K"))
    eager, graph = Runtime(resident=True, fixed_shapes=True), Runtime(resident=True, fixed_shapes=True)
    st_e, st_g = m.new_state(), m.new_state()
    dec = GraphDecoder(m, graph, st_g)
    assert dec.reserve(40) > 0
    steps = [DECODE[i:i + 4] for i in range(0, 20, 4)] + [[t] for t in DECODE[:6]]
    kinds = []
    for toks in steps:
        want = m.forward(toks, st_e, rt=eager, last_only=True)[-1]
        n = (dec.eager, dec.captures, dec.replays)
        got = dec.step(toks if len(toks) > 1 else toks[0])
        kinds.append("ecr"[[a != b for a, b in zip(n, (dec.eager, dec.captures, dec.replays))].index(True)])
        assert np.array_equal(got, want), (arch, len(kinds))
    assert "".join(kinds) == "ecrrr" + "ecrrrr", kinds


@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next", "kimi-k3", "deepseek4"])
@pytest.mark.parametrize("reserve", [True, False])
def test_sim_greedy_feeds_itself(synth_model, arch, reserve):
    """`GraphDecoder.greedy`: each replay feeds its argmax to the next on the device, chunks of replays read back
    once: the same ids as `Model.generate` on the eager fixed-shape runtime; without room reserved a cache grows
    mid-run (an eager step, a new capture) and the ids still agree; the host counters end where generate's do."""
    m = Model(synth_model(arch, wtype="Q4_K"))
    eager, graph = Runtime(resident=True, fixed_shapes=True), Runtime(resident=True, fixed_shapes=True)
    st_e, st_g = m.new_state(), m.new_state()
    want = m.generate(PROMPT, 24, rt=eager, state=st_e)
    first = int(np.argmax(m.forward(PROMPT, st_g, rt=graph, last_only=True)[-1]))
    dec = GraphDecoder(m, graph, st_g)
    if reserve:
        dec.reserve(len(PROMPT) + 24)
    got = dec.greedy(first, 24, chunk=5)
    assert got == want, (arch, got, want)
    ints = lambda st: {p: v for p, (_, _, v) in state_leaves(st).items()                         # noqa: E731
                       if isinstance(v, (int, np.integer)) and not p.endswith(".reserved")}  # (a capacity hint)
    assert ints(st_g) == ints(st_e)
    assert dec.replays >= 16 and (dec.captures == 1 if reserve else dec.captures >= 2), \
        (dec.eager, dec.captures, dec.replays)


@pytest.mark.parametrize("arch", ["qwen3next", "deepseek2"])
def test_sim_graph_generate_stops_at_eos(synth_model, arch):
    """`GraphDecoder.generate` (what `run --graph` decodes with): Model.generate's ids through runs of the
    self-feeding graph, ending at the first eos as generate does (an eos inside a run: the ids after it are
    dropped, `overshoot` counts them), every id given to on_token once in order; with no eos the state's counters
    end where generate's do."""
    m = Model(synth_model(arch, wtype="Q4_K"))
    plain = m.generate(PROMPT, 20, rt=Runtime(resident=True, fixed_shapes=True))
    eos = plain[9]                                        # (inside the second run of 8)
    cut = plain[:plain.index(eos) + 1]
    for stop, want in ((None, plain), (eos, cut)):
        rt, st = Runtime(resident=True, fixed_shapes=True), m.new_state()
        last = m.forward(PROMPT, st, rt=rt, last_only=True)
        dec = GraphDecoder(m, rt, st)
        dec.reserve(len(PROMPT) + 20)
        seen = []
        got = dec.generate(last, 20, eos=stop, on_token=seen.append, chunk=8)
        assert got == want == seen, (stop, got, want)
        fed = len(PROMPT) + len(got) - 1 + dec.overshoot
        assert st.n_past == fed and (dec.overshoot == 0) == (stop is None or len(cut) in (1, 9, 17)), \
            (st.n_past, fed, dec.overshoot)
    assert dec.generate(last, 0) == [] == m.generate([], 0, logits=last, state=m.new_state())
    with pytest.raises(ConfigError, match="expected \\[V\\] or \\[T, V\\]"):
        dec.generate(last[..., :-1], 4)


def test_sim_greedy_sees_every_steps_flags(synth_model):
    """NaN put into a visible cache row before a greedy run reaches the logits of its first pipelined step only
    through that step's replay; the flags of all its replays, ANDed on the device, still warn after the run."""
    from refengine.cache import Rows
    m = Model(synth_model("deepseek2", wtype="Q4_K"))
    rt = Runtime(resident=True, fixed_shapes=True)
    st = m.new_state()
    first = int(np.argmax(m.forward(PROMPT, st, rt=rt, last_only=True)[-1]))
    dec = GraphDecoder(m, rt, st)
    dec.reserve(64)
    ids = dec.greedy(first, 4)                            # eager, capture: the greedy graph exists now
    rows = [v for _, _, v in state_leaves(st).values() if isinstance(v, Rows) and v._buf is not None]
    rows[0]._buf.raw[0] = np.nan
    with pytest.warns(RuntimeWarning, match="NaN|nan|inf"):
        dec.greedy(ids[-1], 6, chunk=5)
    assert dec.replays >= 5


def test_replay_without_the_position_update_differs(synth_model):
    """The control: the same driver with the position buffer left at the captured token's gives other logits."""
    m = Model(synth_model("deepseek2", wtype="Q4_K"))
    eager, graph = Runtime(resident=True, fixed_shapes=True), Runtime(resident=True, fixed_shapes=True)
    st_e, st_g = m.new_state(), m.new_state()
    m.forward(PROMPT, st_e, rt=eager)
    m.forward(PROMPT, st_g, rt=graph)
    dec = GraphDecoder(m, graph, st_g)
    for tok in DECODE[:3]:
        m.forward([tok], st_e, rt=eager)
        dec.step(tok)
    real = graph.device.xp.copyto
    g = dec.graphs[1]
    frozen = g.step.pos.raw.copy()
    want = m.forward([DECODE[3]], st_e, rt=eager)[-1]
    got = dec.step(DECODE[3])
    assert np.array_equal(got, want)
    graph.device.xp.copyto(g.step.pos.raw, frozen)          # (what a replay with a stale position buffer reads)
    assert real is graph.device.xp.copyto
    g.graph.launch()
    stale = graph.to_host(g.logits)[-1]
    assert not np.array_equal(stale, want)


def test_decoder_refuses_a_runtime_it_cannot_capture(synth_model):
    m = Model(synth_model("deepseek2", wtype="Q4_K"))
    for rt in (Runtime(), Runtime(resident=True)):                 # host; resident without fixed shapes
        with pytest.raises(ConfigError, match="fixed_shapes=True"):
            GraphDecoder(m, rt, m.new_state())


def test_replay_reads_the_steps_nan_flags(synth_model):
    """A replayed step's NaN/inf flags are rewritten by the graph and read after it (`Runtime.pack_deferred`): NaN put
    into the key cache after the capture reaches the logits of the next replay, which warns as an eager step does."""
    from refengine.cache import Rows
    m = Model(synth_model("deepseek2", wtype="Q4_K"))
    graph = Runtime(resident=True, fixed_shapes=True)
    st = m.new_state()
    m.forward(PROMPT, st, rt=graph)
    dec = GraphDecoder(m, graph, st)
    for tok in DECODE[:3]:
        dec.step(tok)
    assert dec.replays == 1 and np.all(np.isfinite(dec.step(DECODE[3])))
    rows = [v for _, _, v in state_leaves(st).values() if isinstance(v, Rows) and v._buf is not None]
    rows[0]._buf.raw[0] = np.nan                            # a visible row of layer 0's cache
    with pytest.warns(RuntimeWarning, match="NaN|nan|inf"):
        out = dec.step(DECODE[4])
    assert dec.replays == 3 and not np.all(np.isfinite(out))


def test_run_graph_cli(synth_model, tmp_path, capsys):
    """`refengine run --graph` (the sim device off a GPU): the same greedy ids as the plain run, decoded through
    one capture and replays (room reserved for every token: no cache grows; its counters printed and in --json);
    with an expert budget it is refused with a clear error naming both."""
    import json

    from refengine.cli import main
    f = synth_model("deepseek2", wtype="Q4_K")
    j, jg = tmp_path / "plain.json", tmp_path / "graph.json"
    assert main(["run", str(f), "--tokens", "3,17,101,5", "-n", "24", "-q", "--json", str(j)]) == 0
    assert main(["run", str(f), "--tokens", "3,17,101,5", "-n", "24", "-q", "--graph", "--json", str(jg)]) == 0
    err = capsys.readouterr().err
    plain, graph = json.loads(j.read_text()), json.loads(jg.read_text())
    assert graph["ids"] == plain["ids"] and len(plain["ids"]) == 24
    g = graph["graph"]
    assert g["failed"] is None and g["captures"] == 1 and g["replays"] == 21 and g["eager"] == 1, g   # 23 steps
    assert plain["graph"] is None and "[graph: " in err and "replayed steps" in err
    assert main(["run", str(f), "--tokens", "3,17", "-n", "2", "-q", "--graph", "--gpu-expert-budget", "0.5"]) != 0
    err = capsys.readouterr().err
    assert "--graph" in err and "drop --gpu-expert-budget" in err and "Traceback" not in err


def test_replay_phases_cover_the_step(synth_model):
    """timing=True splits each replayed step into REPLAY_PHASES (inputs, launch, GPU wait, read back, copy): one record
    per replay, none for the eager and capture steps, and together they are the step's wall time (>= 90% of it timed
    from outside: the phases leave out only the call itself)."""
    import time
    m = Model(synth_model("qwen3next", wtype="Q4_K"))
    rt = Runtime(resident=True, fixed_shapes=True)
    st = m.new_state()
    m.forward(PROMPT, st, rt=rt)
    dec = GraphDecoder(m, rt, st, timing=True)
    walls = []
    for tok in DECODE[:6]:
        n = dec.replays
        t0 = time.perf_counter()
        dec.step(tok)
        if dec.replays > n:
            walls.append(1e3 * (time.perf_counter() - t0))
    assert len(dec.phases) == len(walls) == dec.replays == 4
    for ph, wall in zip(dec.phases, walls):
        assert tuple(ph) == GraphDecoder.REPLAY_PHASES and min(ph.values()) >= 0
        assert 0.9 * wall <= sum(ph.values()) <= wall


def test_graph_decode_benchmark_dry_run(tmp_path):
    """benchmarks/graph_decode.py on the sim device (`--backend numpy`): the script's own checks hold (graph ==
    eager fixed-shape, GPU-side run == the host backend's prompt row and first two decode steps) and it writes
    its record, prefill time included."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("graph_decode", ROOT / "benchmarks" / "graph_decode.py")
    gd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gd)
    out = tmp_path / "r.json"
    rc = gd.main(["--arch", "deepseek2", "--backend", "numpy", "--decode", "5", "--prefill", "16", "--check-cpu",
                  "numpy", "--ubatch", "4", "--ubatches", "3", "--greedy", "6", "--chunk", "3", "--dir", str(tmp_path),
                  "--json", str(out)])
    rec = json.loads(out.read_text())
    assert rc == 0 and rec["cpu_ok"] and len(rec["cpu_rel_rms"]) == 3 and rec["prefill_ms"] > 0, rec
    assert set(rec["graph_phases_ms"]) == set(GraphDecoder.REPLAY_PHASES)
    assert rec["ubatch_kinds"] == "ecr" and max(rec["ubatch_rel_rms"]) == 0 and rec["ubatch_replay_ms"] > 0
    assert rec["greedy_ids_equal"] and rec["greedy_ms"] > 0 and rec["greedy_capture_failed"] is None


def test_saved_gpu_logits_checked_on_a_host_backend(tmp_path):
    """graph_decode.py --save-logits (the sim device here) then benchmarks/check_logits.py on the host backends: the
    same ids through the same file agree (rel-RMS <= 1e-5, same argmax); a changed row fails, a different file is
    refused by its fingerprint."""
    import importlib.util
    import json
    import numpy as np

    def load(name):
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    gd, cl = load("graph_decode"), load("check_logits")
    saved = tmp_path / "g.npz"
    assert gd.main(["--arch", "deepseek2", "--backend", "numpy", "--decode", "3", "--prefill", "12",
                    "--save-logits", str(saved), "--dir", str(tmp_path)]) == 0
    model = str(tmp_path / "deepseek2-tiny-LNone-Q8_0.gguf")
    for backend in ("numpy", "cpu"):
        out = tmp_path / f"{backend}.json"
        assert cl.main([str(saved), model, "--backend", backend, "--json", str(out)]) == 0
        rec = json.loads(out.read_text())
        assert rec["ok"] and len(rec["rel_rms"]) == 3 and rec["prompt_tokens"] == 12, rec
    z = dict(np.load(saved))
    z["logits"] = z["logits"].copy()
    z["logits"][1] *= 1.001                               # one row off by 1e-3: over the bar
    np.savez(tmp_path / "bad.npz", **z)
    assert cl.main([str(tmp_path / "bad.npz"), model, "--backend", "numpy"]) == 1
    z["fingerprint"] = np.asarray("1:00")
    np.savez(tmp_path / "other.npz", **z)
    assert cl.main([str(tmp_path / "other.npz"), model, "--backend", "numpy"]) == 2
