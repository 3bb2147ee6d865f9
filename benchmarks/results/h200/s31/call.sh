#!/usr/bin/env bash
# Session 31: the one-session table of all 11 archs (issue 23), three calls on one warm machine, carry [".whl", ".dev"]:
#   BUILD=1 TESTS="..." CUTS="..." TAG=1 bash benchmarks/results/h200/s31/call.sh   llama-bench built while the GPU
#       tests run and the cuts' files are written (each written to .tmp then renamed: a cut never reads a part-file),
#       then the cuts: llama.cpp and ours on each file in turn (s26/call2.sh's method, GPU logits saved)
#   CUTS="..." TAG=2 bash benchmarks/results/h200/s31/call.sh                        the next cuts (build done)
# On the host after: benchmarks/check_logits.py per cut, benchmarks/table.py over the calls' folders.
T=${TAG:-1}; O=/tmp/o$T; mkdir -p $O $OUT /tmp/m; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
prewrite() {
  for spec in "$@"; do IFS=: read -r a p l ov <<< "$spec"; f=/tmp/m/$a-$p-L$l${ov:+-$ov}.gguf
    [ -f "$f" ] && continue
    nice -n 19 python3 - "$f.tmp" "$a" "$p" "$l" "${ov:-}" <<'PY' && mv "$f.tmp" "$f" && echo "wrote $f $(date +%T)"
import sys
from refengine.cuda.randmodel import write_random_model
f, arch, preset, layers, ov = sys.argv[1:]
o = None
if ov:
    k, v = ov.split("=")
    o = {k: tuple(int(x) for x in v.split(",")) if "," in v or k == "full_attn" else int(v)}
write_random_model(f, "Q4_K", int(layers), arch=arch, preset=preset, overrides=o)
PY
  done
}
inner() {
  date > $O/t.log
  [ -n "${BUILD:-}" ] && OUT=$O STAGES=llbuild bash benchmarks/gpu_session.sh > /dev/null 2>&1
  prewrite ${PREWRITE:-} > $O/prewrite.log 2>&1 &     # nice: it may overlap a cut's timing (WAIT_PW=1: not)
  PW=$!
  if [ -n "${TESTS:-}" ]; then
    timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -n ${TESTS_N:-10} $TESTS > $O/tests.log 2>&1
    echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
  fi
  [ -n "${WAIT_PW:-}" ] && { wait $PW; cat $O/prewrite.log >> $O/t.log; }
  while [ ! -f /tmp/ll/build.done ]; do sleep 5; done; echo "build rc=$(cat /tmp/ll/build.done) $(date +%T)" >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPH_SAVE=1 GRAPHLL="$CUTS" STAGES=graphll bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner prewrite; export O CUTS PREWRITE
timeout -k 5 ${INNER:-570} bash -c inner
tar czf $OUT/call$T.tgz -C $O --exclude='*.npz' . ; cp $O/t.log $O/*.npz $OUT/ 2>/dev/null; cp $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed" $O/tests.log 2>/dev/null | tail -3; grep -v WARNING $O/t.log
grep -h "decode per token\|prefill of\|saved\|Error\|error" $O/session.log | tail -24
cat $O/prewrite.log; df -h /tmp | tail -1
grep -h "pp512\|tg32" $O/llamabench.md 2>/dev/null
