#!/usr/bin/env bash
# Session 34, the lease's last call (~200 s): the prefill attention kernel (fused._attention_rows) on the GPU, then
# each cut's prefill under the three paths (benchmarks/prefill_paths.py: modules + rows, modules + batched, DeviceModel)
#   bash benchmarks/results/h100/s34/call3.sh        (carry [".whl"])
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/m $OUT; S0=$(date +%s)
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
CUTS="llama:llama-3-8b qwen3moe:qwen3-30b-a3b kimi-linear:kimi-linear-48b"
(for c in $CUTS; do IFS=: read -r a p <<< "$c"; nice -n 19 python3 -c "
from refengine.cuda.randmodel import cut_file; cut_file('/tmp/w', '$a', '$p', 4, 'Q4_K')" && \
  mv /tmp/w/$a-$p-L4-Q4_K.gguf /tmp/m/ && echo "wrote $a $(date +%T)"; done) > $OUT/write.log 2>&1 &
timeout ${TESTS_S:-70} python3 -m pytest -q -p no:cacheprovider tests/test_fused.py -k "attention" > $OUT/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - S0 )) s"; tail -3 $OUT/tests.log
for c in $CUTS; do IFS=: read -r a p <<< "$c"; f=/tmp/m/$a-$p-L4-Q4_K.gguf
  while [ ! -f $f ] && [ $(( $(date +%s) - S0 )) -lt ${LIMIT_S:-190} ]; do sleep 1; done
  [ $(( $(date +%s) - S0 + 30 )) -gt ${LIMIT_S:-190} ] && { echo "no time for $a"; continue; }
  paths=rows,batched,devicemodel; [ $a = kimi-linear ] && paths=rows,batched
  timeout $(( ${LIMIT_S:-190} - ($(date +%s) - S0) )) python3 benchmarks/prefill_paths.py $f --paths $paths \
    --json $OUT/pp_$a.json 2>&1 | grep -v Warning | tee -a $OUT/pp.log | grep "prefill\|Error\|error"
done
cat $OUT/write.log; echo "done $(( $(date +%s) - S0 )) s"
