mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date > $OUT/t.log
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_fused.py tests/test_cuda_graph_step.py tests/test_cuda_resident.py > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/t.log; date >> $OUT/t.log
G="benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers 3 --type Q4_K --decode 16 --dir /tmp"
timeout 80 python3 $G --profile 6 --json $OUT/g_qwen3moe.json > $OUT/g_qwen3moe.log 2>&1; echo "g qwen3moe rc=$?" >> $OUT/t.log
timeout 60 python3 $G --pageable --json $OUT/g_qwen3moe_pageable.json > $OUT/g_qwen3moe_pageable.log 2>&1; echo "g qwen3moe pageable rc=$?" >> $OUT/t.log
timeout 60 python3 $G --json $OUT/g_qwen3moe2.json > $OUT/g_qwen3moe2.log 2>&1; echo "g qwen3moe again rc=$?" >> $OUT/t.log; date >> $OUT/t.log
timeout 110 python3 benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K --decode 12 --dir /tmp --json $OUT/g_qwen3next.json > $OUT/g_qwen3next.log 2>&1; echo "g qwen3next rc=$?" >> $OUT/t.log; date >> $OUT/t.log
tail -2 $OUT/tests.log; grep -h "passed\|failed" $OUT/tests.log | tail -3; cat $OUT/t.log; grep -h "decode per token" $OUT/*.log
