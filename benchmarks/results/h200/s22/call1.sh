mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv,noheader -lms 500 > "$OUT/clocks.csv" 2>&1 &
date > $OUT/t.log
timeout 260 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda_fastlaunch.py tests/test_cuda_resident.py tests/test_hgemm.py tests/test_cuda_graph_step.py tests/test_fused.py -k "not kernel_products" > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/t.log; date >> $OUT/t.log
for L in 1 3; do timeout 100 python3 benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers $L --type Q4_K --decode 24 --dir /tmp --json $OUT/g_qwen3moe_L$L.json > $OUT/g_L$L.log 2>&1; echo "g L$L rc=$?" >> $OUT/t.log; done; date >> $OUT/t.log
timeout 120 python3 benchmarks/cuda_layers.py --type Q4_K --no-prefill --no-profile --json $OUT/layers_dm.json > $OUT/layers_dm.log 2>&1; echo "dm rc=$?" >> $OUT/t.log; date >> $OUT/t.log
tail -3 $OUT/tests.log; cat $OUT/t.log; grep -h "decode per token\|per layer" $OUT/*.log
