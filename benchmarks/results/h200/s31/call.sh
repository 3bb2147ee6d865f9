#!/usr/bin/env bash
# Session 31: the one-session table of all 11 archs (issue 23) on one warm machine, carry [".whl", ".dev"]:
#   BUILD=1 TESTS="..." CUTS="a:p:L[:K=V] ..." TAG=1 bash benchmarks/results/h200/s31/call.sh
# llama-bench is built (detached) while the GPU tests run; a writer (nice 19) writes the cuts' random-packed files
# ahead of the timings, at most AHEAD finished files on disk (each written to .tmp, then renamed; gpu_session's cut
# waits for a .tmp of its file), so the cuts' writing overlaps the build and the previous cut's timing. The cuts run in
# turn (s26/call2.sh's method: llama.cpp and ours on each file, GPU logits saved) while the call has time for the
# next (CUT_S seconds; kimi-k3 twice that); those done are listed in $OUT/done.txt, the rest go to the next call
# (same command with the remaining CUTS, TAG=2, ...). On the host after: benchmarks/check_logits.py per cut, then
# benchmarks/table.py over the calls' folders. FOLD="1 3": the fold's measure (DeviceModel's layer against the concept
# modules' graph; since the fold (session 39) the modules' alone: no DeviceModel); FOLD_PROFILE=N: with DeviceModel's per-stage profile, and N decode steps' kernels of both paths under
# torch.profiler (benchmarks/fold_measure.py reads them back).
# GRAPH_PROFILE / GRAPH_ALT pass through to gpu_session.sh (its header). EXTRA="cmd": a command after the tests.
T=${TAG:-1}; O=/tmp/o$T; mkdir -p $O $OUT /tmp/m /tmp/rs; rm -f /tmp/m/*.tmp; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
START=$(date +%s)
prewrite() {
  for spec in "$@"; do IFS=: read -r a p l ov <<< "$spec"; f=/tmp/m/$a-$p-L$l${ov:+-$ov}.gguf
    [ -f "$f" ] && continue
    while [ "$(ls /tmp/m/*.gguf 2>/dev/null | wc -l)" -ge "${AHEAD:-2}" ]; do sleep 1; done
    nice -n 19 python3 - "$f.tmp" "$a" "$p" "$l" "${ov:-}" <<'PY' && mv "$f.tmp" "$f" && echo "wrote $f $(date +%T)"
import sys
from refengine.cuda.randmodel import parse_overrides, write_random_model
f, arch, preset, layers, ov = sys.argv[1:]
o = parse_overrides(arch, preset, [ov] if ov else []) or None
write_random_model(f, "Q4_K", int(layers), arch=arch, preset=preset, overrides=o)
PY
  done
}
[ -n "${BUILD:-}" ] && OUT=$O STAGES=llbuild bash benchmarks/gpu_session.sh > /dev/null 2>&1
date > $O/t.log
prewrite ${CUTS:-} > $O/prewrite.log 2>&1 &
PW=$!
if [ -n "${TESTS:-}" ]; then         # PATCH=file: the tests run on a copy of the tree with that diff applied (the fold)
  TD=$PWD; if [ -n "${PATCH:-}" ]; then TD=/tmp/p; rm -rf $TD; cp -r . $TD
    (cd $TD && { git apply "$PATCH" 2>/dev/null || patch -p1 -s < "$PATCH"; }) > $O/patch.log 2>&1 || echo "patch failed" >> $O/t.log; fi
  (cd $TD && PYTHONPATH=/tmp/site:$TD timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -n ${TESTS_N:-10} \
    $TESTS ${TESTS_K:+-k "$TESTS_K"}) > $O/tests.log 2>&1
  echo "tests rc=$? $(date +%T)" >> $O/t.log
fi
if [ -n "${EXTRA:-}" ]; then         # EXTRA="command": run after the tests (a kernel benchmark), output in extra.log
  (eval "$EXTRA") > $O/extra.log 2>&1; echo "extra rc=$? $(date +%T)" >> $O/t.log; tail -20 $O/extra.log
fi
left() {                      # seconds the call has left (less 15 for the packing), capped at $1
  local l=$(( ${LIMIT_S:-575} - ($(date +%s) - START) - 15 )); [ $l -gt $1 ] && l=$1; echo $l
}
fold() {                      # the fold's measure: DeviceModel's decode a layer, the generic graph's of 1 and 3 layers
  [ -n "${FOLD:-}" ] || return 0   # (each run's timeout is what the call has left: a run killed by the device's limit
  for ty in ${FOLD_TYPES:-Q4_K}; do s=$([ $ty = Q4_K ] || echo _$ty)   # would lose every file; FOLD_TYPES="Q4_K Q8_0")
  [ $(left 200) -lt 90 ] && break
  [ -f refengine/cuda/runner.py ] && timeout $(left 200) python3 benchmarks/cuda_layers.py --type $ty --layers 3 --dir /tmp/rs $([ -z "${FOLD_PROFILE:-}" ] && echo --no-profile) ${FOLD_PROFILE:+--kernel-profile $FOLD_PROFILE} --no-prefill \
    --json $O/fold_devicemodel$s.json >> $O/fold.log 2>&1; echo "fold DeviceModel $ty rc=$? $(date +%T)" >> $O/t.log
  for L in $FOLD; do
    [ $(left 200) -lt 90 ] && break
    timeout $(left 200) python3 benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers $L --type $ty \
      --decode 16 --dir /tmp/rs ${FOLD_PROFILE:+--profile $FOLD_PROFILE} --json $O/fold_L$L$s.json >> $O/fold.log 2>&1
    echo "fold $ty L=$L rc=$? $(date +%T)" >> $O/t.log
  done; done
}
[ -n "${FOLD_FIRST:-}" ] && fold
if [ -n "${CUTS:-}" ]; then
  while [ ! -f /tmp/ll/build.done ]; do sleep 3; done; echo "build rc=$(cat /tmp/ll/build.done) $(date +%T)" >> $O/t.log
fi
for spec in ${CUTS:-}; do
  need=${CUT_S:-100}; case $spec in kimi-k3*) need=$((2 * need));; esac
  [ $(( $(date +%s) - START + need )) -gt ${LIMIT_S:-575} ] && { echo "left for the next call: $spec" >> $O/t.log; continue; }
  IFS=: read -r a p l ov <<< "$spec"; f=/tmp/m/$a-$p-L$l${ov:+-$ov}.gguf
  while [ ! -f $f ] && kill -0 $PW 2>/dev/null; do sleep 1; done          # the writer's file, not a second writing
  OUT=$O GRAPH_DECODE=12 GRAPH_SAVE=1 GRAPHLL="$spec" STAGES=graphll timeout 300 bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  echo "$spec" >> $OUT/done.txt
done
[ -z "${FOLD_FIRST:-}" ] && fold
kill $PW 2>/dev/null; date >> $O/t.log
tar czf $OUT/call$T.tgz -C $O --exclude='*.npz' . ; cp $O/t.log $O/*.npz $OUT/ 2>/dev/null; cp $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed\|error" $O/tests.log 2>/dev/null | tail -5; grep -v WARNING $O/t.log
grep -h "decode per token\|prefill of\|Error\|error" $O/session.log | tail -30; grep -h "decode per token\|per layer\|decode" $O/fold.log 2>/dev/null | tail -8
cat $O/prewrite.log; df -h /tmp | tail -1
grep -h "pp512\|tg32" $O/llamabench.md 2>/dev/null
