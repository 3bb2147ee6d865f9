"""benchmarks/route_ties.py: the nearest routing tie of a run is found, and choosing its runner-up changes the
chosen experts at that row only (the tool that explained qwen4exp's GPU == CPU distance of session 39: one token's
router picked the other of two experts 1 ulp apart)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    sys.path.insert(0, str(ROOT / "benchmarks"))           # (its import of check_logits)
    spec = importlib.util.spec_from_file_location("route_ties", ROOT / "benchmarks" / "route_ties.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runner_up_chosen_at_the_nearest_tie(synth_model):
    from refengine.model import Model
    rt = _tool()
    m = Model(synth_model("qwen3moe"))
    prompt, tokens = [3, 9, 27, 81, 5, 17], [11, 2]
    probes = []
    rows, gaps = rt.run(m, prompt, tokens, "numpy", probe_out=probes)
    gap, rel, step, il, r, kth, nxt = min(gaps, key=lambda g: g[1])
    assert gap >= 0 and kth != nxt
    plain = probes[0].ids
    assert kth in plain[(step, il)][r] and nxt not in plain[(step, il)][r]
    flipped_rows, _ = rt.run(m, prompt, tokens, "numpy", flips=[(step, il, r)], probe_out=probes)
    flipped = probes[1].ids
    assert nxt in flipped[(step, il)][r] and kth not in flipped[(step, il)][r]
    for key, ids in plain.items():                          # the rows before it and the other rows of its call
        if key[0] < step or (key == (step, il)) or (key[0] == step and key[1] < il):
            other = np.delete(ids, r, axis=0) if key == (step, il) else ids
            same = np.delete(flipped[key], r, axis=0) if key == (step, il) else flipped[key]
            assert np.array_equal(other, same), key
    assert not np.array_equal(rows, flipped_rows)           # another expert: other logits
