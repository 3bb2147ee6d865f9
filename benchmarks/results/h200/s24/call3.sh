# s24 call 3: the graph tests (greedy with flag pages made ahead), then per cut our decode (pinned read-back, the
# caller's logits buffer), greedy, 512-token ubatches (a capture's invalidating op named by the probe), prefill-512:
# qwen3moe L1, qwen3next L4, kimi-linear L4 (llama.cpp: session 23's figures on the same seeded files).
O=/tmp/o3; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
g() { n=$1; shift; timeout -k 5 $1 python3 benchmarks/graph_decode.py "${@:2}" --type Q4_K --dir /tmp \
  --json $O/g_$n.json > $O/g_$n.log 2>&1; echo "g $n rc=$?" >> $O/t.log; date >> $O/t.log; }
inner() {
  date > $O/t.log
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_cuda_graph_step.py > $O/tests.log 2>&1
  echo "tests rc=$?" >> $O/t.log; date >> $O/t.log
  g qwen3moe 100 --arch qwen3moe --preset qwen3-30b-a3b --layers 1 --decode 32 --greedy 64
  g qwen3next 170 --arch qwen3next --preset qwen3-next-80b --layers 4 --decode 32 --greedy 64 --ubatch 512 --ubatches 3 --prefill 512
  g kimi-linear 170 --arch kimi-linear --preset kimi-linear-48b --layers 4 --decode 32 --greedy 64 --ubatch 512 --ubatches 3 --prefill 512
}
export -f inner g; export O
timeout -k 5 ${INNER:-560} bash -c inner
tar czf $OUT/call3.tgz -C $O . ; cp $O/t.log $OUT/
grep -h "passed\|failed" $O/tests.log | tail -2; grep -h "^FAILED" $O/tests.log | head; cat $O/t.log
grep -h "decode per token\|by phase\|greedy\|ubatches\|prefill of\|Error" $O/g_*.log
