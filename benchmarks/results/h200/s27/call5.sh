#!/usr/bin/env bash
# Written in session 27 (no GPU lent), for a lease after session 26's call1/call2 (llama-bench built there, the
# machine still warm): the seed archs' cuts in the one-session table, llama.cpp and ours on the same file, GPU logits
# saved for benchmarks/check_logits.py. Two cuts a call (a cut ~3-4 min; the 10-minute limit):
#   bash benchmarks/results/h200/s27/call5.sh                     glm5-next (KDA dense, nope MLA + k-pool MoE, KDA MoE),
#                                                                 deepseek4 (window, CSA, HCA)
#   CUTS="qwen4exp:qwen3.8-flash-next:4:ngram_vocab_base=1000000 deepseek32:deepseek-v3.2:2" TAG=5b \
#     bash benchmarks/results/h200/s27/call5.sh      (the n-gram table shrunk: PLAN.md)
# The vendored llama.cpp (0.3.36's sdist) has src/models/glm5-next.cpp, deepseek4.cpp, qwen4exp.cpp, deepseek32.cpp:
# whether its CUDA back end runs every op of them (the lightning indexer, the k-pool, QSA) is what this finds out.
# First (TAG 5 only, ~30 s): the heap kernel alone, what a decode / prefill selection costs (benchmarks/heap_top_k.py).
mkdir -p $OUT
[ "${TAG:-5}" = 5 ] && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 benchmarks/heap_top_k.py --json $OUT/heap.json \
  > $OUT/heap.log 2>&1; cat $OUT/heap.log 2>/dev/null
CUTS=${CUTS:-glm5-next:glm-5.3-flash:3 deepseek4:deepseek-v4-flash:3} TAG=${TAG:-5} \
  bash "$(dirname "$0")/../s26/call2.sh"
