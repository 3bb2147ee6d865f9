mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date > $OUT/t.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda_graph_step.py tests/test_cuda_fastlaunch.py tests/test_cuda_resident.py > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/t.log; date >> $OUT/t.log
timeout 120 python3 benchmarks/graph_decode.py --arch qwen3next --preset qwen3-next-80b --layers 4 --type Q4_K --decode 16 --profile 8 --dir /tmp --json $OUT/g_qwen3next.json > $OUT/g_qwen3next.log 2>&1; echo "g qwen3next rc=$?" >> $OUT/t.log
timeout 100 python3 benchmarks/graph_decode.py --arch qwen3moe --preset qwen3-30b-a3b --layers 3 --type Q4_K --decode 16 --profile 8 --dir /tmp --json $OUT/g_qwen3moe.json > $OUT/g_qwen3moe.log 2>&1; echo "g qwen3moe rc=$?" >> $OUT/t.log; date >> $OUT/t.log
for spec in kimi-linear:kimi-linear-48b:4 qwen3next:qwen3-next-80b:4; do IFS=: read -r A P L <<< "$spec"
timeout 100 python3 benchmarks/profile_prefill.py --arch $A --preset $P --layers $L --tokens 512 --dir /tmp --reps 9 --wall-only > $OUT/pp_$A.log 2>&1; echo "pp $A rc=$?" >> $OUT/t.log; done; date >> $OUT/t.log
tail -2 $OUT/tests.log; cat $OUT/t.log; grep -h "decode per token\|prefill of" $OUT/*.log
