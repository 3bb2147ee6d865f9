# s24 call 2: the greedy graph's flag pages byte by byte (greedy_diag.py); the replay with its logits and flags
# read into pinned buffers (one wait) by phase, qwen3moe L1 and qwen3next L4 (+ 512-token ubatches, prefill-512);
# the GPU graph tests but greedy.
O=/tmp/o2; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  timeout 60 python3 benchmarks/results/h200/s24/greedy_diag.py > $O/diag.log 2>&1; echo "diag rc=$?" >> $O/t.log
  timeout -k 5 80 python3 benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers 1 --type Q4_K \
    --decode 32 --dir /tmp --json $O/g_qwen3moe.json > $O/g_qwen3moe.log 2>&1
  echo "g qwen3moe rc=$?" >> $O/t.log; date >> $O/t.log
  timeout -k 5 150 python3 benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K \
    --decode 32 --ubatch 512 --ubatches 3 --prefill 512 --dir /tmp --json $O/g_qwen3next.json > $O/g_qwen3next.log 2>&1
  echo "g qwen3next rc=$?" >> $O/t.log; date >> $O/t.log
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_cuda_graph_step.py -k "not greedy" > $O/tests.log 2>&1
  echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-480} bash -c inner
tar czf $OUT/call2.tgz -C $O . ; cp $O/t.log $OUT/
cat $O/diag.log | grep -v Warn | tail -22; grep -h "passed\|failed" $O/tests.log | tail -2; grep -h "^FAILED" $O/tests.log | head; cat $O/t.log
grep -h "decode per token\|by phase\|ubatches\|prefill of\|Error" $O/g_*.log
