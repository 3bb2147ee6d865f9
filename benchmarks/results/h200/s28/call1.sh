#!/usr/bin/env bash
# Session 28, after the decode profile (s27/call7.sh: hc_gates one thread 72 us a call, attention blocks of 128
# threads, the prefill's gathered attention host-bound): llama-bench built (detached) while the fused kernels' GPU
# tests and the graph decoder's run, then llama.cpp and ours on deepseek4's cut (GPU logits saved). Carry
# [".whl", ".dev"]; then at once: CUTS=glm5-next:glm-5.3-flash:3 TAG=2 bash benchmarks/results/h200/s26/call2.sh.
# TESTS (the GPU tests run while llama-bench builds) and TESTS_S (their time limit) replace the defaults.
O=/tmp/o; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  OUT=$O STAGES=llbuild bash benchmarks/gpu_session.sh > /dev/null 2>&1
  timeout ${TESTS_S:-200} python3 -m pytest -q -p no:cacheprovider -n 12 \
    ${TESTS:-tests/test_fused.py tests/test_cuda_graph_step.py} > $O/tests.log 2>&1
  echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
  while [ ! -f /tmp/ll/build.done ]; do sleep 5; done; echo "build rc=$(cat /tmp/ll/build.done)" >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPH_SAVE=1 GRAPHLL="${CUTS:-deepseek4:deepseek-v4-flash:3}" \
    STAGES=graphll bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-560} bash -c inner
tar czf $OUT/call1.tgz -C $O . ; cp $O/t.log $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed" $O/tests.log | tail -3; cat $O/t.log; grep -h "decode per token\|prefill\|saved" $O/session.log | tail -12
cat $O/llamabench.md 2>/dev/null | grep "pp512\|tg32"
