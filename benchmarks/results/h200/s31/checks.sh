#!/usr/bin/env bash
# On the project machine after the calls: GPU == CPU for each cut whose logits came back (the cut rewritten here in
# /tmp/cuts, deleted after), then the table. DIRS: the calls' unpacked output folders.
#   bash benchmarks/results/h200/s31/checks.sh DIR...
set -uo pipefail
cd "$(dirname "$0")/../../../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
C=${CHECKS:-benchmarks/results/h200/s31/checks}; mkdir -p $C /tmp/cuts
for d in "$@"; do for f in $d/logits_*.npz; do
  [ -f "$f" ] || continue
  a=$(basename $f .npz); a=${a#logits_}
  [ -f $C/check_$a.json ] && continue
  spec=$(for e in "$@"; do cat "$e/done.txt" 2>/dev/null; done | grep "^$a:" | head -1)   # arch:preset:L[:K=V]
  IFS=: read -r A P L X <<< "$spec"
  echo "=== $a $(date +%T)" | tee -a $C/checks.log
  $PY benchmarks/check_logits.py $f --arch $A --preset $P --layers $L ${X:+--override $X} --dir /tmp/cuts \
    --json $C/check_$a.json 2>&1 | grep -v Warning | tail -2 | tee -a $C/checks.log
  rm -f /tmp/cuts/*.gguf
done; done
$PY benchmarks/table.py "$@" --checks $C
