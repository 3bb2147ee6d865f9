# s23 call 4 (right after call 3, the machine still warm: llama-bench built there): deepseek2, glm-dsa, kimi-k3.
O=/tmp/o4; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -f /tmp/fallback ] && tar xzf benchmarks/results/h200/s23/fallback.tgz && echo "FALLBACK to b02d17c" > $O/t.log
inner() {
  date >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPHLL="${CUTS:-deepseek2:deepseek-v3:2 glm-dsa:glm-5.2:2 kimi-k3:kimi-k3:3:full_attn=2}" \
    STAGES=graphll bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-540} bash -c inner
tar czf $OUT/call4.tgz -C $O . ; cp $O/t.log $OUT/
cat $O/t.log; grep -h "decode per token\|prefill" $O/session.log | tail -12; cat $O/llamabench.md 2>/dev/null | grep pp512\\\|tg32
