#!/usr/bin/env bash
# Written in session 26, for the next lease after the table (call1.sh, call2.sh): the experts' kernels by shape (tc,
# tcq TF32 incl. the staged ST=1, the f16 variant H=1, 16-pair tiles) and two dense products (tc / tcq / tcq16 /
# decode + cuBLAS); then deepseek2's 512-token prefill under the f16 variant for the experts (tcq_shape H=1), for the
# dense Q4_K products (prefill_gemm=tcq16), and both, against the default (the file kept between).
O=/tmp/o3; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
H="tcq_shape={'MT':4,'WM':2,'BN':32,'H':1}"
inner() {
  date > $O/t.log
  OUT=$O EXPERTS_TIMEOUT=200 EXPERTS_ARGS="--dense 4096x14336,18432x7168" STAGES=experts bash benchmarks/gpu_session.sh \
    >> $O/t.log 2>&1
  date >> $O/t.log
  OUT=$O PROF_TIMEOUT=120 SWEEP="prefill_gemm=tcq16 $H prefill_gemm=tcq16+$H" STAGES=prefillsweep \
    bash benchmarks/gpu_session.sh >> $O/t.log 2>&1
  date >> $O/t.log
}
export -f inner; export O H
timeout -k 5 ${INNER:-570} bash -c inner
tar czf $OUT/call3.tgz -C $O . ; cp $O/t.log $O/experts.json $OUT/ 2>/dev/null
grep -h "prefill of\|GPU time\|launches" $O/session.log | tail -12; tail -30 $O/t.log
