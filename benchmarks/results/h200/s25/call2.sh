#!/usr/bin/env bash
# Session 25, call 2: the quant-domain tensor-core kernel (quant/cuda/tcq.py) against tc.py and cuBLAS, experts and dense.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
timeout 300 python3 benchmarks/expert_prefill.py --shapes 64x4x1x32 --tcq 2x4x32,1x4x32,2x2x32,4x2x32,1x8x32,2x8x32 \
  --kernels "" --dense 4096x14336,18432x7168,7168x18432,24576x1536 --json "$OUT/expert2.json" > "$OUT/expert2.log" 2>&1
echo "rc=$?" >> "$OUT/expert2.log"
timeout 150 ncu --clock-control none -k regex:gemm --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  python3 benchmarks/expert_prefill.py --shapes "" --tcq 2x4x32 --kernels "" --check 0 --ncu > "$OUT/ncu2.txt" 2>&1; echo "rc=$?" >> "$OUT/ncu2.txt"
