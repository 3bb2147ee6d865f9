mkdir -p $OUT; python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date > $OUT/t.log
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_fused.py tests/test_cuda_graph_step.py tests/test_cuda_resident.py -x > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/t.log; date >> $OUT/t.log
grep -h "passed\|failed\|Error" $OUT/tests.log | tail -8; cat $OUT/t.log
