"""Compile refengine.cuda's fused kernels (fused.py) for Hopper (sm_90) without a GPU:
`python -m refengine.cuda.ptx [--resources] [-k NAME]` (--resources: ptxas's registers, spills and cubin size a
kernel, where ptxas is on PATH).

Exit status as `quant.cuda.ptx` (0 ok, 1 a kernel failed, 3 no NVVM)."""
from __future__ import annotations

import sys

from quant.cuda import ptx as qptx

from . import fused as fz

F1, F2, F3 = "float32[::1]", "float32[:, ::1]", "float32[:, :, ::1]"
A1, A2, A3 = "float32[:]", "float32[:, :]", "float32[:, :, :]"     # the fused kernels take strided views too
DR_SIG = f"void({A3}, {A3}, {A3}, {A3}, boolean, {A2}, {A3}, boolean, float32, {F3}, {F3})"
KERNELS = [
    ("fused_rms_norm", fz._rms_rows, f"void({F2}, {F2}, int64, {F2}, boolean, boolean, {F1}, boolean, float32, "
                                     f"float32, {F2}, {F2})"),
    ("fused_rms_norm[slots]", fz._rms_rows_slots, f"void({F2}, {F2}, int64, {F2}, boolean, boolean, {F1}, boolean, "
                                                  f"float32, float32, {F2}, {F2})"),
    ("fused_rms_warps", fz._rms_warps, f"void({F2}, {F2}, int64, {F2}, boolean, boolean, {F1}, boolean, float32, "
                                       f"float32, {A2}, int64, {F2}, {F2})"),
    ("fused_softmax", fz._softmax_rows, f"void({F2}, {F2})"),
    ("fused_layer_norm", fz._layer_rows, f"void({F2}, {F1}, boolean, {F1}, boolean, float32, {F2})"),
    ("fused_silu", fz._silu, f"void({F1}, {F1})"),
    ("fused_sigmoid", fz._sigmoid, f"void({F1}, {F1})"),
    ("fused_softplus", fz._softplus, f"void({F1}, {F1})"),
    ("fused_gdn_gates", fz._gdn_gates, f"void({F2}, {F2}, int64, {F1}, {F1}, {F2}, {F2}, {F2})"),
    ("fused_swiglu", fz._swiglu, f"void({F1}, {F1}, {F1})"),
    ("fused_situ", fz._situ, f"void({F1}, {F1}, float32, float32, {F1})"),
    ("fused_swiglu_clamp", fz._swiglu_clamp, f"void({F1}, {F1}, float32, {F1})"),
    ("fused_delta_rule", fz.delta_rule_kernel(128), DR_SIG),
    ("fused_delta_rule[K=256]", fz.delta_rule_kernel(256), DR_SIG),
    ("fused_delta_rule[cols=1]", fz.delta_rule_kernel(128, 1), DR_SIG),
    ("fused_kda_gates", fz._kda_gates, f"void({F2}, {F2}, {F1}, {F1}, int64, boolean, float32, {F3}, {F2})"),
    ("fused_causal_conv", fz._causal_conv, f"void({A2}, {F2}, {A2}, boolean, boolean, {F2}, {F2})"),
    ("fused_rope_cos_sin", fz._rope_cos_sin, f"void(int64[:], float32, {F1}, boolean, float32, {F1}, {F1}, boolean, "
                                             f"float32, {F2}, {F2})"),
    ("fused_rope", fz._rope, f"void({A3}, {A2}, {A2}, int64, boolean, int64, float32, {F3}, {A3}, {F3}, boolean)"),
    ("fused_pool_at", fz._pool_at, f"void({F2}, {F2}, int64[::1], int64, int64, int64, {F2})"),
    ("fused_append_rows", fz._append_rows, f"void({F2}, {A2}, int64[::1], {F2}, {A2}, int64[::1], boolean, boolean)"),
    ("fused_norm_rope", fz._norm_rope, f"void({A3}, {F1}, boolean, {A3}, {F1}, boolean, boolean, float32, {F2}, {F2}, "
                                        f"int64, boolean, {F3}, {F3})"),
    ("fused_norm_rope_append", fz._norm_rope_append, f"void({A3}, {F1}, boolean, {A3}, {F1}, boolean, {A3}, float32, "
                                                      f"{F2}, {F2}, int64, boolean, {F3}, {F3}, int64[::1], {F3}, "
                                                      f"int64[::1], int32[::1], boolean)"),
    ("fused_attention", fz._attention, f"void({A3}, {A3}, {A3}, int64[:], float32, boolean, int64[:, :], int64[:, :], "
                                        f"boolean, {F1}, boolean, {F2}, {F3})"),
    ("fused_attention_rows", fz._attention_rows, f"void({A3}, {A3}, {A3}, int64[::1], float32, boolean, {F3})"),
    ("fused_attention_gathered", fz._attention, f"void({A3}, {A3}, {A3}, int64[::1], float32, boolean, int64[:, :], "
                                                 f"boolean[:, :], boolean, {F1}, boolean, {F2}, {F3})"),
    ("fused_hc_gates", fz._hc_gates, f"void({F2}, {F1}, {F1}, int64, float32, {F2}, {F2}, {F3})"),
    ("fused_collapse", fz._collapse, f"void({A3}, {A2}, {F2})"),
    ("fused_hc_post", fz._hc_post, f"void({A2}, {A3}, {A2}, {A3}, {F3})"),
    ("fused_gated_mean", fz._gated_mean, f"void({A3}, {A3}, float32, {F2})"),
    ("fused_streams_combine", fz._streams_combine, f"void({A3}, {A2}, {A2}, float32, {F3})"),
    ("fused_top_k", fz._top_k, f"void({A2}, int64, int32[:, ::1])"),
    ("fused_route_softmax", fz._route_softmax, f"void({F2}, int64, boolean, float32, boolean, {F2}, int32[:, ::1], "
                                                f"{F2})"),
    ("fused_route_softmax_warps", fz._route_softmax_warps, f"void({F2}, int64, boolean, float32, boolean, {F2}, "
                                                            f"int32[:, ::1], {F2})"),
    ("fused_route_sigmoid_warps", fz._route_sigmoid_warps, f"void({F2}, int64, {A1}, boolean, boolean, float32, "
                                                            f"boolean, {F2}, {F2}, int32[:, ::1], {F2})"),
    ("fused_route_softmax_warps[rwe=4]", fz.route_warp_kernels(4)[0], f"void({F2}, int64, boolean, float32, boolean, "
                                                                      f"{F2}, int32[:, ::1], {F2})"),
    ("fused_route_sigmoid_warps[rwe=1]", fz.route_warp_kernels(1)[1], f"void({F2}, int64, {A1}, boolean, boolean, "
                                                                      f"float32, boolean, {F2}, {F2}, int32[:, ::1], "
                                                                      f"{F2})"),
    ("fused_route_sigmoid", fz._route_sigmoid, f"void({F2}, int64, {A1}, boolean, int64, int64, boolean, float32, "
                                                f"boolean, {F2}, {F2}, {F2}, int32[:, ::1], int32[:, ::1], {F2})"),
    ("fused_group_limited", fz._group_limited, f"void({A2}, int64, int64, {F2}, int32[:, ::1])"),
    ("fused_ggml_top_k_rows", fz._ggml_top_k_rows, f"void({F2}, int64[::1], int64, boolean, int32[:, ::1])"),
    ("fused_all_finite", fz._all_finite_many, f"void({', '.join([F1] * fz.FLAG_BATCH)}, boolean[::1], "
                                              f"{', '.join(['int64'] * fz.FLAG_BATCH)})"),
]


def main() -> int:
    if qptx.SIM:
        print("NUMBA_ENABLE_CUDASIM is set: nothing to compile")
        return 3
    import argparse
    ap = argparse.ArgumentParser(description="Compile the refengine.cuda kernels for sm_90 (no GPU needed).")
    ap.add_argument("--resources", action="store_true", help="each kernel's registers, spills and cubin size "
                    "(ptxas on PATH)")
    ap.add_argument("-k", default="", help="only the kernels whose name holds this")
    a = ap.parse_args()
    items = [k for k in KERNELS if a.k in k[0]]
    failed = qptx.compile_all(items, with_resources=a.resources)
    print(f"{len(failed)} failed" if failed else f"all {len(items)} kernels compile for sm_90")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
