# s24 call 4: a prompt's 512-token ubatches through the graph now that the dispatch tables upload off the captured
# stream (qwen3next, kimi-linear: host-bound prefills); then glm-dsa, deepseek2, kimi-k3 decode (pinned read-back),
# greedy, prefill-512 (llama.cpp: session 23's figures on the same seeded files).
O=/tmp/o4; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
g() { n=$1; shift; timeout -k 5 $1 python3 benchmarks/graph_decode.py "${@:2}" --type Q4_K --dir /tmp \
  --json $O/g_$n.json > $O/g_$n.log 2>&1; echo "g $n rc=$?" >> $O/t.log; date >> $O/t.log; }
inner() {
  date > $O/t.log
  g qwen3next 110 --arch qwen3next --preset qwen3-next-80b --layers 4 --decode 6 --ubatch 512 --ubatches 3
  g kimi-linear 110 --arch kimi-linear --preset kimi-linear-48b --layers 4 --decode 6 --ubatch 512 --ubatches 3
  g glm-dsa 150 --arch glm-dsa --preset glm-5.2 --layers 2 --decode 24 --greedy 64 --ubatch 512 --ubatches 3 --prefill 512
  g deepseek2 120 --arch deepseek2 --preset deepseek-v3 --layers 2 --decode 24 --greedy 64 --prefill 512
  g kimi-k3 150 --arch kimi-k3 --preset kimi-k3 --layers 3 --override full_attn=2 --decode 24 --greedy 64 --prefill 512
}
export -f inner g; export O
timeout -k 5 ${INNER:-565} bash -c inner
tar czf $OUT/call4.tgz -C $O . ; cp $O/t.log $OUT/
cat $O/t.log; grep -h "decode per token\|by phase\|greedy\|ubatches\|prefill of\|Error" $O/g_*.log
