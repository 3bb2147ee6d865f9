"""benchmarks/table.py: the one-session table from a lease's raw output (graph_ARCH.json, llamabench.md), checked on
session 23's committed output (benchmarks/results/h200/s23) against the figures BENCHMARKS.md gives for it, and the
GPU == CPU column from check_logits.py records."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
S23 = ROOT / "benchmarks" / "results" / "h200" / "s23"


def _table():
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "benchmarks" / "table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_reproduces_session_23():
    t = _table()
    rows = {r["arch"]: r for r in t.rows([S23 / "call3", S23 / "call4"])}
    # BENCHMARKS.md, "every arch against llama.cpp, one session (session 23)": decode, its GPU time, llama.cpp's
    # tg32 per token, decode ratio, prefill, llama.cpp's pp512, prefill ratio
    want = {"deepseek2": (1.595, 1.099, 0.922, 1.73, 53.9, 12.69, 4.25),
            "qwen3next": (1.785, 0.847, 0.758, 2.36, 51.6, 15.98, 3.23),
            "glm-dsa": (2.002, 1.223, 1.038, 1.93, 55.1, 12.57, 4.38),
            "kimi-k3": (2.895, 2.299, 2.005, 1.44, 120.6, 44.00, 2.74)}
    assert set(rows) == set(want)
    for arch, w in want.items():
        r = rows[arch]
        got = (f"{r['decode_ms']:.3f}", f"{r['gpu_ms']:.3f}", f"{r['ll_tg_ms']:.3f}", f"{r['decode_ratio']:.2f}",
               f"{r['prefill_ms']:.1f}", f"{r['ll_pp_ms']:.2f}", f"{r['prefill_ratio']:.2f}")   # (as the table shows)
        assert got == (f"{w[0]:.3f}", f"{w[1]:.3f}", f"{w[2]:.3f}", f"{w[3]:.2f}", f"{w[4]:.1f}", f"{w[5]:.2f}",
                       f"{w[6]:.2f}"), arch
    assert rows["kimi-k3"]["cut"] == "kimi-k3 (`kimi-k3`, 3, full_attn=2)"
    assert "| glm-dsa (`glm-5.2`, 2) | 2.002 ms |" in t.markdown(list(rows.values()))


def test_table_gpu_cpu_column(tmp_path):
    t = _table()
    (tmp_path / "check_deepseek2.json").write_text(json.dumps(dict(ok=True, rel_rms=[1e-7, 3e-7, 2e-7])))
    (tmp_path / "check_glm-dsa.json").write_text(json.dumps(dict(ok=False, rel_rms=[2e-5, 1e-7, 1e-7])))
    rows = {r["arch"]: r for r in t.rows([S23 / "call4"], checks=str(tmp_path))}
    assert rows["deepseek2"]["gpu_cpu"] == "ok (rel-RMS <= 3.0e-07)"
    assert rows["glm-dsa"]["gpu_cpu"].startswith("FAIL")
    assert "gpu_cpu" not in rows["kimi-k3"]
