#!/usr/bin/env bash
# Written in session 26, for the next lease, right after call1.sh (the machine warm: llama-bench built there): the
# one-session table, part 2: kimi-linear, deepseek2, glm-dsa (CUTS=... for others; TAG=2b names a second run's
# output), GPU logits saved. Then on the host, per cut:
#   python3 benchmarks/check_logits.py logits_ARCH.npz --arch ARCH --preset P --layers L [--override full_attn=2] \
#     --json checks/check_ARCH.json
# and the table: python3 benchmarks/table.py DIR1 DIR2 --checks checks   (the calls' unpacked output)
T=${TAG:-2}; O=/tmp/o$T; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
inner() {
  date >> $O/t.log
  OUT=$O GRAPH_DECODE=12 GRAPH_SAVE=1 \
    GRAPHLL="${CUTS:-kimi-linear:kimi-linear-48b:4 deepseek2:deepseek-v3:2 glm-dsa:glm-5.2:2}" \
    STAGES=graphll bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O T
timeout -k 5 ${INNER:-570} bash -c inner
tar czf $OUT/call$T.tgz -C $O . ; cp $O/t.log $OUT/
cat $O/t.log; grep -h "decode per token\|prefill\|saved" $O/session.log | tail -12
cat $O/llamabench.md 2>/dev/null | grep "pp512\|tg32"
