# the re-homing on the GPU: main's test, then fold.patch applied and the fold's state test
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 3 tests/test_cuda_resident.py -k another_runtime 2>&1 | tail -3
git apply benchmarks/results/h200/s31/fold.patch || echo PATCH FAILED
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_cuda_resident.py tests/test_cuda_layer.py -k "another_runtime or saved_and_loaded" 2>&1 | tail -3
