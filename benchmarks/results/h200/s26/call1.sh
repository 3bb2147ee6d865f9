#!/usr/bin/env bash
# Written in session 26 (no GPU lent), for the next lease: the one-session table, part 1. llama-bench built (detached)
# while the GPU tests of sessions 25-26 run (tcq, the tiled bmm, the prefill's ids on the device, the resident and
# graph paths); then llama.cpp and ours on the same file for qwen3next, its GPU logits saved (GRAPH_SAVE=1) for
# benchmarks/check_logits.py on the host. Run from the repo root with carry [".whl", ".dev"]:
#   bash benchmarks/results/h200/s26/call1.sh ; then call2.sh at once (the build lives in the machine's /tmp), then
#   CUTS=kimi-k3:kimi-k3:3:full_attn=2 TAG=2b bash benchmarks/results/h200/s26/call2.sh. (s23's call with the tests
#   and two cuts was cut by the 10-minute limit: a cut takes ~3.2 min, the tests up to 4.)
O=/tmp/o; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  OUT=$O STAGES=llbuild bash benchmarks/gpu_session.sh > /dev/null 2>&1
  [ -n "${SKIP_TESTS:-}" ] || timeout 240 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_cuda_tcq.py tests/test_products.py \
    tests/test_cuda_resident.py tests/test_cuda_graph_step.py tests/test_fused.py::test_ggml_top_k_rows \
    -k "not kernel_products" > $O/tests.log 2>&1
  echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
  while [ ! -f /tmp/ll/build.done ]; do sleep 5; done; echo "build rc=$(cat /tmp/ll/build.done)" >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPH_SAVE=1 GRAPHLL="${CUTS:-qwen3next:qwen3-next-80b:4}" \
    STAGES=graphll bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-560} bash -c inner
tar czf $OUT/call1.tgz -C $O . ; cp $O/t.log $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed" $O/tests.log | tail -2; cat $O/t.log; grep -h "decode per token\|prefill\|saved" $O/session.log | tail -12
cat $O/llamabench.md 2>/dev/null | grep "pp512\|tg32"
