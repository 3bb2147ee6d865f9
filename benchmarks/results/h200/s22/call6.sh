mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_cuda_graph_step.py -k "qwen3moe or kimi-k3 or deepseek2 or qwen3next" 2>&1 | tail -4
