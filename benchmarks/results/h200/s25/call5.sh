#!/usr/bin/env bash
# Session 25, call 5: decode (graph) and prefill-512 with tcq the experts' default, on the MoE cuts not yet timed so.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/rs
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
for spec in kimi-linear:kimi-linear-48b:4 qwen3next:qwen3-next-80b:4 glm-dsa:glm-5.2:2; do IFS=: read -r A P L <<< "$spec"
  timeout 150 python3 benchmarks/graph_decode.py --arch $A --preset $P --layers $L --type Q4_K --decode 12 --prefill 512 \
    --dir /tmp/rs --json "$OUT/graph_$A.json" > "$OUT/graph_$A.log" 2>&1; echo "rc=$?" >> "$OUT/graph_$A.log"
  rm -f /tmp/rs/*.gguf
done
