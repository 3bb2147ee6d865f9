mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date > $OUT/t.log
timeout 130 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_fused.py tests/test_cuda_graph_step.py -k "top_k or attention or graph" > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/t.log; date >> $OUT/t.log
G="benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K --decode 12 --dir /tmp"
timeout -k 5 120 python3 $G --pageable --json $OUT/g_pageable.json > $OUT/g_pageable.log 2>&1; echo "pageable rc=$?" >> $OUT/t.log; date >> $OUT/t.log
timeout -k 5 100 python3 $G --profile 4 --json $OUT/g_pinned.json > $OUT/g_pinned.log 2>&1; echo "pinned rc=$?" >> $OUT/t.log; date >> $OUT/t.log
grep -h "passed\|failed" $OUT/tests.log | tail -3; cat $OUT/t.log; grep -h "decode per token\|top_k\|_attention\|launches" $OUT/g_*.log
