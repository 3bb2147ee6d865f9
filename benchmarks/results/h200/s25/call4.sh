#!/usr/bin/env bash
# Session 25, call 4: GPU tests with tcq the experts' default (new tests/test_cuda_tcq.py; session 24's unrun graph
# tests; the resident forwards of every arch), then deepseek2's graph decode + 512-token prefill + 512-token ubatches.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/rs
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
timeout 330 python3 -m pytest -n 14 -q -p no:cacheprovider tests/test_cuda_tcq.py tests/test_cuda_graph_step.py \
  tests/test_products.py tests/test_cuda_resident.py -k "not kernel_products" > "$OUT/tests.log" 2>&1; echo "rc=$?" >> "$OUT/tests.log"
timeout 200 python3 benchmarks/graph_decode.py --arch deepseek2 --preset deepseek-v3 --layers 2 --type Q4_K --decode 12 \
  --prefill 512 --ubatch 512 --ubatches 3 --dir /tmp/rs --json "$OUT/graph_deepseek2.json" > "$OUT/graph_deepseek2.log" 2>&1
echo "rc=$?" >> "$OUT/graph_deepseek2.log"
