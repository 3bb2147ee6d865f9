"""numba-cuda kernels over packed GGUF weights: GEMV, GEMM, grouped expert dispatch (the `cuda` backend).

    matmul(x, w, *, mode="exact")                       x [T, I], w QTensor [O, I] -> [T, O]
    moe_ffn(x, ids, weights, *, up, gate, down, ...)    same contract as refengine.moe.experts.moe_ffn

Host arrays in, host arrays out, like `quant.ref`; the device-level entry points (`matmul.dense`,
`matmul.grouped`, `moe.moe_ffn_device`) keep activations on the GPU. Weights are uploaded once,
lazily, in their packed form (`weights.py`); routed experts when first routed to.

Without a GPU, `NUMBA_ENABLE_CUDASIM=1` (set before numba is first imported) runs the same kernels
in numba's simulator, slowly: the tests use it on toy sizes.
"""
import numpy as _np

# numba-cuda 0.30.4 looks up np.row_stack, which numpy 2.5 removed: the one shim, before numba loads.
if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack

from numba import cuda as _cuda  # noqa: E402

from .device import SIM  # noqa: E402
from .decoders import SPECS  # noqa: E402
from .ops import matmul, supported  # noqa: E402
from .moe import moe_ffn  # noqa: E402
from .resident import matmul_heads_resident, matmul_resident, moe_ffn_resident  # noqa: E402
from .rows import get_rows as get_rows_resident  # noqa: E402
from . import fastlaunch as _fastlaunch  # noqa: E402

import os as _os  # noqa: E402

# the short launch path (fastlaunch.py) on a GPU; REFENGINE_FASTLAUNCH=0 keeps numba's own every time
if not SIM and _os.environ.get("REFENGINE_FASTLAUNCH", "1") != "0":
    _fastlaunch.install()

MOE_GATED_ACTS = True    # moe_ffn takes act=(fn, trace name): another gated activation than SwiGLU (Kimi-K3's SiTU)


class GPUUnavailable(RuntimeError):
    """No CUDA device (and the simulator is not enabled)."""


def available() -> bool:
    """True when kernels can run: a CUDA GPU is visible, or the simulator is on."""
    try:
        return bool(_cuda.is_available())
    except Exception:                                            # pragma: no cover - driver errors
        return False


def check_available() -> None:
    """Raise GPUUnavailable with the reason when no kernel can run here."""
    if available():
        return
    why = ""
    try:
        _cuda.detect()
    except Exception as e:                                       # pragma: no cover
        why = " (" + " ".join(str(e).split())[:200] + ")"
    raise GPUUnavailable("the cuda backend needs an NVIDIA GPU with a working driver, and numba-cuda found none"
                         f"{why}; use --backend numpy, or set NUMBA_ENABLE_CUDASIM=1 to run the kernels in "
                         "numba's (slow) simulator")


TYPES = tuple(SPECS)

__all__ = ["matmul", "moe_ffn", "matmul_resident", "matmul_heads_resident", "moe_ffn_resident", "get_rows_resident", "supported", "available", "check_available", "GPUUnavailable", "TYPES", "SIM"]
