"""Compile the refengine.cuda kernels for Hopper (sm_90) without a GPU: `python -m refengine.cuda.ptx`.

Exit status as `quant.cuda.ptx` (0 ok, 1 a kernel failed, 3 no NVVM)."""
from __future__ import annotations

import sys

from quant.cuda import ptx as qptx

from .attn import softmax_causal_kernel

from .kernels import (add_kernel, add_rms_norm_kernel, attention_gqa_kernel, attention_kernel, qk_rope_kernel,
                      rms_norm_kernel, route_kernel)

F1, F2, F3, I1, I2 = "float32[::1]", "float32[:, ::1]", "float32[:, :, ::1]", "int32[::1]", "int32[:, ::1]"
KERNELS = [
    ("rms_norm", rms_norm_kernel, f"void({F2}, {F1}, float64, {F2})"),
    ("add", add_kernel, f"void({F2}, {F2}, {F2})"),
    ("add_rms_norm", add_rms_norm_kernel, f"void({F2}, int64, {F2}, boolean, {F1}, float64, {F2}, {F2})"),
    ("qk_rope", qk_rope_kernel, f"void({F2}, int64, int64, int64, {F1}, {F1}, boolean, float64, {F2}, {F2}, int64, "
                                f"boolean, {I1}, {F3}, {F3}, {F3}, {F3})"),
    ("attention", attention_kernel, f"void({F3}, {F3}, {F3}, {I1}, float64, {F2})"),
    ("attention_gqa[G=8]", attention_gqa_kernel(8), f"void({F3}, {F3}, {F3}, {I1}, float64, {F2})"),
    ("attention_gqa[G=1]", attention_gqa_kernel(1), f"void({F3}, {F3}, {F3}, {I1}, float64, {F2})"),
    ("softmax_causal", softmax_causal_kernel, f"void({F2}, int64, {I1}, float64, int64)"),
    ("route[E=128]", route_kernel(128), f"void({F2}, int64, boolean, {I2}, {F1})"),
    ("route[E=1024]", route_kernel(1024), f"void({F2}, int64, boolean, {I2}, {F1})"),
]


def main() -> int:
    if qptx.SIM:
        print("NUMBA_ENABLE_CUDASIM is set: nothing to compile")
        return 3
    failed = qptx.compile_all(KERNELS)
    print(f"{len(failed)} failed" if failed else f"all {len(KERNELS)} kernels compile for sm_90")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
