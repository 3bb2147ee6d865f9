#!/usr/bin/env bash
# The expert-cache table of BENCHMARKS.md: one process per budget (each peak its own), logits against a saved
# reference (the fully resident run, first process).
#   benchmarks/expert_cache_sweep.sh MODEL.gguf OUTDIR [budgets...]   (extra args to expert_cache.py: $EXTRA)
set -euo pipefail
m=$1; out=$2; shift 2
budgets=${*:-0.125 0.25 0.5 1.0}
mkdir -p "$out"
py=${PYTHON:-python3}
$py benchmarks/expert_cache.py "$m" --budgets 1.0 --save-reference "$out/ref.npz" --json "$out/b_ref.json" \
    ${EXTRA:-} 2>&1 | grep -v Warning | tee "$out/b_ref.log"
for b in $budgets; do
    $py benchmarks/expert_cache.py "$m" --budgets "$b" --reference "$out/ref.npz" --json "$out/b_$b.json" \
        ${EXTRA:-} 2>&1 | grep -v Warning | tee "$out/b_$b.log" | tail -1
done
