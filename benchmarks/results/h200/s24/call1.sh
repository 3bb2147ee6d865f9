# s24 call 1: the GPU tests of session 23's unrun kernels (group_limited, add_rms_norm, l2_norm, gdn_gates, ubatch
# graphs, greedy); then where a replay's host time goes (phases + cProfile) on a 1-block Qwen3-30B-A3B and the
# Qwen3-Next cut, the greedy decode fed on the device, a prompt's 512-token ubatches through the graph.
O=/tmp/o; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_cuda_graph_step.py tests/test_cuda_resident.py \
    tests/test_fused.py -k "not kernel_products" > $O/tests.log 2>&1; echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
  timeout -k 5 100 python3 benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers 1 --type Q4_K \
    --decode 32 --greedy 64 --profile 8 --dir /tmp --json $O/g_qwen3moe.json > $O/g_qwen3moe.log 2>&1
  echo "g qwen3moe rc=$?" >> $O/t.log; date >> $O/t.log
  timeout -k 5 200 python3 benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K \
    --decode 32 --greedy 64 --ubatch 512 --ubatches 3 --prefill 512 --dir /tmp --json $O/g_qwen3next.json > $O/g_qwen3next.log 2>&1
  echo "g qwen3next rc=$?" >> $O/t.log; date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-530} bash -c inner
tar czf $OUT/call1.tgz -C $O . ; cp $O/t.log $O/tests.log $OUT/ 2>/dev/null
grep -h "passed\|failed" $O/tests.log | tail -2; grep -h "^FAILED\|Error" $O/tests.log | head; cat $O/t.log
grep -h "decode per token\|by phase\|greedy\|ubatches\|prefill of\|launches" $O/g_*.log
