#!/usr/bin/env bash
# Written in session 26, for the next lease: where a fixed-shape 512-token prefill's time goes (a capture's kernels:
# session 25's replayed ubatch took 526 ms; the tiled bmm is new since), by default and with the dense Q4_K products
# on tcq16 (which, unlike cuBLAS, a capture can hold); then deepseek2's ubatch graph with the default kernels.
O=/tmp/o4; mkdir -p $O $OUT /tmp/rs; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  for pol in "" "--policy prefill_gemm=tcq16"; do
    timeout 150 python3 benchmarks/profile_prefill.py --arch deepseek2 --preset deepseek-v3 --layers 2 --tokens 512 \
      --dir /tmp/rs --fixed-shapes --segments --top 20 $pol >> $O/fixed.log 2>&1; echo "rc=$?" >> $O/fixed.log
  done
  date >> $O/t.log
  timeout 200 python3 benchmarks/graph_decode.py --arch deepseek2 --preset deepseek-v3 --layers 2 --type Q4_K \
    --decode 8 --ubatch 512 --ubatches 3 --dir /tmp/rs --json $O/graph_ubatch.json > $O/graph_ubatch.log 2>&1
  echo "rc=$?" >> $O/graph_ubatch.log; date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-570} bash -c inner
tar czf $OUT/call4.tgz -C $O . ; cp $O/t.log $OUT/
grep -h "kernels:\|prefill of\|ubatches" $O/fixed.log $O/graph_ubatch.log | tail -12
