export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
mkdir -p /tmp/rs
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 500 > $OUT/clocks.csv 2>&1 &
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda_fastlaunch.py tests/test_hgemm.py tests/test_cuda_resident.py tests/test_cuda_graph_step.py tests/test_fused.py -k "not kernel_products" > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/tests.log
tail -12 $OUT/tests.log
timeout 60 python3 benchmarks/h3_accuracy.py > $OUT/h3.txt 2>&1; cat $OUT/h3.txt
P() { timeout ${2:-100} python3 benchmarks/profile_prefill.py $1 --tokens 512 --dir /tmp/rs --top 10 --sort cumulative 2>&1 | grep -v Warn >> $OUT/prof.log; }
P "--arch qwen3next --preset qwen3-next-80b --layers 4"; rm -f /tmp/rs/*.gguf
P "--arch glm-dsa --preset glm-5.2 --layers 2" 110; rm -f /tmp/rs/*.gguf
P "--arch kimi-linear --preset kimi-linear-48b --layers 4" 100; rm -f /tmp/rs/*.gguf
P "--arch deepseek2 --preset deepseek-v3 --layers 2" 100; rm -f /tmp/rs/*.gguf
grep -h "prefill of\|kernels:" $OUT/prof.log
P "--arch kimi-k3 --preset kimi-k3 --layers 3 --override full_attn=2" 200
grep -h "prefill of\|kernels:" $OUT/prof.log | tail -2
