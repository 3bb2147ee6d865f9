#!/usr/bin/env bash
# Session 25, call 1: the routed experts' prefill products by kernel / tile shape (timed, then ncu on the current
# shape), and the kernel profiles of deepseek2's and glm-dsa's 512-token prefills at this commit.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > "$OUT/smi.txt" 2>&1
timeout 170 python3 benchmarks/expert_prefill.py --json "$OUT/expert.json" > "$OUT/expert.log" 2>&1; echo "rc=$?" >> "$OUT/expert.log"
timeout 110 ncu --clock-control none -k regex:gemm --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats \
  python3 benchmarks/expert_prefill.py --shapes 64x4x1x32 --kernels "" --check 0 --ncu > "$OUT/ncu.txt" 2>&1; echo "rc=$?" >> "$OUT/ncu.txt"
PROF_TIMEOUT=140 PROFPREFILL="deepseek2:deepseek-v3:2 glm-dsa:glm-5.2:2" STAGES=profprefill OUT=$OUT bash benchmarks/gpu_session.sh
