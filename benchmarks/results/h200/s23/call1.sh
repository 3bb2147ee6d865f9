mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date > $OUT/t.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_cuda_graph_step.py tests/test_cuda_resident.py tests/test_fused.py tests/test_cuda_kernels.py -k "not kernel_products and not ptx" > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/t.log; date >> $OUT/t.log
for L in 1 3; do timeout 110 python3 benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers $L --type Q4_K --decode 24 --dir /tmp --json $OUT/g_qwen3moe_L$L.json > $OUT/g_qwen3moe_L$L.log 2>&1; echo "g L$L rc=$?" >> $OUT/t.log; done; date >> $OUT/t.log
timeout -k 5 110 python3 benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K --decode 16 --profile 6 --dir /tmp --json $OUT/g_qwen3next.json > $OUT/g_qwen3next.log 2>&1; echo "g qwen3next rc=$?" >> $OUT/t.log; date >> $OUT/t.log
grep -h "passed\|failed" $OUT/tests.log | tail -3; grep -h "^FAILED\|Error" $OUT/tests.log | head -20; cat $OUT/t.log; grep -h "decode per token\|launches" $OUT/g_*.log
