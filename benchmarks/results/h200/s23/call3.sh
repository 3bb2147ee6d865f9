# s23 call 3: llama-bench built (detached) while the GPU tests of this session's changes run; the qwen3next decode
# step profiled (against call 1's, same session); then llama.cpp and ours on the same file: qwen3next, kimi-linear.
# Everything under /tmp/o, packed into one file at the end (the device returns 8 files at most).
O=/tmp/o; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  OUT=$O STAGES=llbuild bash benchmarks/gpu_session.sh > /dev/null 2>&1
  timeout 220 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_cuda_graph_step.py tests/test_cuda_resident.py \
    tests/test_fused.py -k "not kernel_products" > $O/tests.log 2>&1; rc=$?
  echo "tests rc=$rc" >> $O/t.log; date >> $O/t.log
  if [ $rc != 0 ]; then tar xzf benchmarks/results/h200/s23/fallback.tgz; touch /tmp/fallback; echo "FALLBACK to b02d17c" >> $O/t.log; fi
  timeout -k 5 110 python3 benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K \
    --decode 16 --profile 6 --dir /tmp --json $O/g_qwen3next.json > $O/g_qwen3next.log 2>&1
  echo "g qwen3next rc=$?" >> $O/t.log; date >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPHLL="qwen3next:qwen3-next-80b:4 kimi-linear:kimi-linear-48b:4" STAGES=graphll \
    bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-530} bash -c inner
tar czf $OUT/call3.tgz -C $O . ; cp $O/t.log $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed" $O/tests.log | tail -2; cat $O/t.log; grep -h "decode per token\|launches\|prefill" $O/g_qwen3next.log $O/session.log | tail -12; cat $O/llamabench.md 2>/dev/null | grep pp512\\\|tg32
