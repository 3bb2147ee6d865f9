"""benchmarks/launches.py: a step's launches counted on the sim device. The count can fail: a view is not a launch
and a gather is; each fused kernel's stand-in is one launch where its NumPy statement is several (deepseek4's step
with the stand-ins counts fewer, and holds its gates, tail ropes and gathered attention as one op each)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import launches  # noqa: E402


def test_views_are_not_launches():
    dev = ("dev", (4, 8), "<f4")
    assert not launches.launches("getitem", (dev, ("slice", 0, 2, None)), ("dev", (2, 8), "<f4"))
    assert launches.launches("getitem", (dev, ("dev", (3,), "<i8")), ("dev", (3, 8), "<f4"))
    assert not launches.launches(".reshape", (dev, (32,)), ("dev", (32,), "<f4"))
    assert not launches.launches(".astype", (dev, ("float32",), ()), ("dev", (4, 8), "<f4"))   # (as recorded)
    assert launches.launches(".astype", (dev, ("float64",), ()), ("dev", (4, 8), "<f8"))
    assert launches.launches("np.add", (dev, dev), dev)


def test_fused_ops_count_once(tmp_path):
    fused = launches.count("deepseek4", str(tmp_path))
    plain = launches.count("deepseek4", str(tmp_path), stand_in=False)
    assert fused["launches"] < plain["launches"]
    for op in ("fused hc_gates", "fused rope_tail", "fused attention_gathered", "fused collapse", "fused hc_post"):
        assert fused["by_op"].get(op, 0) > 0 and op not in plain["by_op"], op


def test_fused_kernels_script_runs_its_cases(tmp_path, monkeypatch):
    """benchmarks/fused_kernels.py at toy sizes in the simulator: every case runs, and the two norm kernels give the
    same rows (the script's check that the forms it times compute one thing)."""
    import json
    import os
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        import pytest
        pytest.skip("the script's toy check runs in the simulator")
    import fused_kernels
    out = tmp_path / "k.json"
    assert fused_kernels.main(["--sim", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["case"] for r in rows} == {"norm", "delta", "rows"}
    warps = [r for r in rows if "rms_warps_us" in r]
    assert warps and all(r["max_abs_diff"] <= 1e-6 for r in warps)
