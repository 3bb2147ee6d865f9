#!/usr/bin/env bash
# Session 30 (after two leaseless sessions): llama-bench built (detached) while the GPU tests of what sessions 29-30
# changed run (fused kernels, the graph decoder, fastlaunch's strided short path, a stacked weight), then llama.cpp
# and ours on the cut(s) in CUTS (default glm5-next's; GPU logits saved). Carry
# [".whl", ".dev"]; the next calls: benchmarks/results/h200/s30/PLAN.md.
O=/tmp/o; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  OUT=$O STAGES=llbuild bash benchmarks/gpu_session.sh > /dev/null 2>&1
  timeout 240 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_fused.py tests/test_cuda_graph_step.py \
    tests/test_cuda_fastlaunch.py tests/test_cuda_kernels.py::test_stacked_weight_is_its_parts tests/test_cuda_resident.py \
    > $O/tests.log 2>&1
  echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
  while [ ! -f /tmp/ll/build.done ]; do sleep 5; done; echo "build rc=$(cat /tmp/ll/build.done)" >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPH_SAVE=1 GRAPHLL="${CUTS:-glm5-next:glm-5.3-flash:3}" \
    STAGES=graphll bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-560} bash -c inner
tar czf $OUT/call1.tgz -C $O . ; cp $O/t.log $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed" $O/tests.log | tail -3; cat $O/t.log; grep -h "decode per token\|prefill\|saved" $O/session.log | tail -12
cat $O/llamabench.md 2>/dev/null | grep "pp512\|tg32"
