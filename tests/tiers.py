"""Test tiers (README, Tests): the default tier (`./dev.sh test`, what CI runs) and the `exhaustive` marker.

The default tier keeps, for each kernel family, a toy-size check (in the CUDA simulator without a GPU) and a
PTX compile of one representative specialization, so a kernel that breaks still fails CI. The exhaustive tier
holds the matrices (every type x every kernel), every PTX specialization and the long simulator runs:
`./dev.sh test-all`, and on the GPU, where the same test files run at real sizes.
"""
import os
import subprocess
import sys

import pytest

exhaustive = pytest.mark.exhaustive
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiered(values, keep):
    """`values` for parametrize: those in `keep` in the default tier, the others marked exhaustive."""
    return [v if v in keep else pytest.param(v, marks=exhaustive) for v in values]


# compile the named kernels of a ptx module (quant.cuda.ptx's kernels(), refengine.cuda.ptx's KERNELS) for sm_90;
# exit status as `python -m quant.cuda.ptx` (0 ok, 1 a kernel failed or an unknown name, 3 no NVVM)
_SUBSET = r"""
import importlib, sys
from quant.cuda import ptx as q
if q.SIM:
    print("NUMBA_ENABLE_CUDASIM is set: nothing to compile"); sys.exit(3)
try:
    importlib.import_module("cuda.bindings")
    from numba.cuda.cudadrv import nvvm
    nvvm.NVVM()
except Exception as e:
    print(f"NVVM is not available ({e}); pip install 'numba-cuda[cu13]'"); sys.exit(3)
mod = importlib.import_module(sys.argv[1])
items = mod.kernels() if hasattr(mod, "kernels") else mod.KERNELS
names = sys.argv[2:]
sel = [k for k in items if k[0] in names]
unknown = sorted(set(names) - {k[0] for k in sel})
if unknown:
    print(f"no such kernel in {sys.argv[1]}: {unknown}"); sys.exit(1)
failed = q.compile_all(sel)
print(f"{len(failed)} of {len(sel)} failed" if failed else f"all {len(sel)} kernels compile for sm_90")
sys.exit(1 if failed else 0)
"""


def ptx_sm90(module, names=None, args=(), timeout=1800):
    """Compile kernels for Hopper (sm_90) with NVVM in a subprocess without the simulator: every kernel of
    `python -m module` (with `args`), or only `names`. Skips where numba-cuda[cu13] (NVVM) is missing."""
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        pytest.skip("numba-cuda[cu13] (NVVM/NVRTC) is not installed")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    cmd = [sys.executable, "-m", module, *args] if names is None else [sys.executable, "-c", _SUBSET, module, *names]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout
