#!/usr/bin/env bash
# Written in session 26, for the next lease after the table (call1.sh, call2.sh): the experts' kernels by shape (tc,
# tcq TF32 incl. the staged ST=1, and the f16 variant H=1, 16-pair tiles) and two dense products (tc / tcq / tcq16 /
# decode + cuBLAS), then the kernels of a fixed-shape 512-token deepseek2 prefill (why a replayed ubatch took 526 ms).
O=/tmp/o3; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
inner() {
  date > $O/t.log
  OUT=$O EXPERTS_ARGS="--dense 4096x14336,18432x7168" STAGES="experts proffixed" bash benchmarks/gpu_session.sh \
    >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O
timeout -k 5 ${INNER:-560} bash -c inner
tar czf $OUT/call3.tgz -C $O . ; cp $O/t.log $O/experts.json $OUT/ 2>/dev/null
tail -40 $O/t.log
