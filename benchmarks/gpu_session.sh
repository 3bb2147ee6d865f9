#!/usr/bin/env bash
# One call on the GPU machine (device tool): carried wheels, then the stages named in $STAGES, each under a
# time limit; everything is appended to $OUT/session.log, tables and figures land in $OUT as JSON / Markdown.
#   STAGES="info layers matmul prefill gemv1 ncudecode tune tests" bash benchmarks/gpu_session.sh
#   STAGES="graph graphtiny graphreal prefetch" bash benchmarks/gpu_session.sh   (the decode graph, issue 23; expert prefetch, 24)
#   GRAPHREAL="qwen3moe:qwen3-30b-a3b:1 qwen3next:qwen3-next-80b:4" GRAPH_DECODE=32 STAGES=graphreal ...  (a replay's
#     phases: graph_decode.py prints them; GRAPH_UBATCH=512 GRAPH_PREFILL=512 adds a prompt's ubatches through the graph;
#     GRAPH_GREEDY=64: a greedy decode fed on the device, replays launched back to back)
#   PROFPREFILL="glm-dsa:glm-5.2:2" STAGES="profprefill prefillsweep" ...  (a prefill's kernels; the same under policies)
#   STAGES="experts proffixed" ...  (the experts' tc / tcq shapes incl. the staged ST=1, the f16 H=1 and 16-pair tiles; the kernels of a
#     fixed-shape 512-token prefill with a capture's kernels: why a replayed ubatch took 526 ms, session 25)
#   STAGES="llbuild graph" ... then GRAPHLL="arch:preset:layers[:KEY=VALUE] ..." STAGES=graphll: llama-bench and ours on
#   each file in turn (.dev/ holds ../shared/tools/llamacpp_bench_device.sh and the vendored llama.cpp: see its header)
#     (GRAPH_SAVE=1: each cut's GPU logits saved as $OUT/logits_ARCH.npz, to compare on a host: benchmarks/check_logits.py;
#     GRAPH_POLICY=KEY=VALUE: our runs under that KernelPolicy setting, e.g. prefill_gemm=tcq16;
#     GRAPH_PROFILE=1: the prefill's kernels and segments on the same file after; GRAPH_ALT="K=V ...": the prefill's
#     wall under each of those settings too, e.g. GRAPH_ALT=gathered_prefill=fused)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/rs
LOG="$OUT/session.log"
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
stage() { echo "=== $1 ($(date +%T))" | tee -a "$LOG"; }
# SM clock and power every 250 ms (an idle GPU runs at 345 MHz: figures taken before the clocks rise are wrong)
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv,noheader -lms 250 > "$OUT/clocks.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
for st in ${STAGES:-info layers matmul tests}; do
  case $st in
    info) stage info
      nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv >> "$LOG" 2>&1
      python3 -c "import numpy, numba, numba_cuda, sys; print(sys.version.split()[0], numpy.__version__, numba.__version__, numba_cuda.__version__)" >> "$LOG" 2>&1 ;;
    layers) for t in ${LAYER_TYPES:-Q4_K Q8_0}; do stage "layers $t"
        timeout ${LAYER_TIMEOUT:-200} python3 benchmarks/cuda_layers.py --type $t --dir /tmp --check \
          --json "$OUT/layers_$t.json" ${LAYER_ARGS:-} >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"; done ;;
    matmul) stage matmul
      timeout ${MATMUL_TIMEOUT:-300} python3 benchmarks/cuda_matmul.py --json "$OUT/matmul.json" --md "$OUT/matmul.md" \
        ${MATMUL_ARGS:-} >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG" ;;
    prefill) stage prefill
      timeout ${PREFILL_TIMEOUT:-300} python3 benchmarks/cuda_prefill.py --json "$OUT/prefill.json" ${PREFILL_ARGS:-} >> "$LOG" 2>&1
      echo "rc=$?" >> "$LOG" ;;
    gemv1) stage gemv1
      timeout ${GEMV1_TIMEOUT:-300} python3 benchmarks/cuda_gemv1.py --json "$OUT/gemv1.json" ${GEMV1_ARGS:-} >> "$LOG" 2>&1
      echo "rc=$?" >> "$LOG" ;;
    ncudecode) for t in ${LAYER_TYPES:-Q4_K Q8_0}; do stage "ncu decode $t"
        timeout ${NCU_TIMEOUT:-200} ncu --clock-control none --profile-from-start off --csv --metrics \
          gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
          python3 benchmarks/ncu_decode.py --type $t --layers 2 > "$OUT/ncu_decode_$t.csv" 2>> "$LOG"; echo "rc=$?" >> "$LOG"; done ;;
    tune) for t in ${LAYER_TYPES:-Q4_K Q8_0}; do stage "tune $t"
        timeout ${TUNE_TIMEOUT:-150} python3 benchmarks/cuda_gemv1.py --types $t --dims ${TUNE_DIMS:-5120x2048,2048x4096} \
          --ids-shapes none --shapes ${TUNE_SHAPES:-8x4x8x128x1,8x4x8x128x0,4x4x4x128x1,4x4x4x128x0,2x4x2x128x0,16x4x8x128x0,8x1x8x128x0,4x1x4x128x1} \
          --reps 9 --json "$OUT/tune_$t.json" >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"
        F=$(python3 benchmarks/pick_fast1.py "$OUT/tune_$t.json" $t); echo "picked $t: $F" | tee -a "$LOG"
        [ -n "$F" ] && timeout ${LAYER_TIMEOUT:-200} python3 benchmarks/cuda_layers.py --type $t --dir /tmp --no-profile \
          --no-prefill --fast1 "$F" --json "$OUT/layers_tuned_$t.json" >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"; done ;;
    realsize) for spec in ${REALSIZE:-deepseek4:deepseek-v4-flash:3}; do IFS=: read -r A P L X <<< "$spec"
        stage "realsize $A $P L=$L ${X:-}"
        timeout ${RS_TIMEOUT:-300} python3 benchmarks/cuda_deepseek2.py --arch $A --preset $P --layers $L \
          --type ${RS_TYPE:-Q4_K} --dir /tmp/rs --json "$OUT/realsize_$A.json" ${X:+--override $X} >> "$LOG" 2>&1
        echo "rc=$?" >> "$LOG"; rm -f /tmp/rs/*.gguf; done ;;
    graph) stage "graph tests"                       # the captured decode step == eager, tiny presets
      timeout ${GRAPH_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graph_step.py \
        tests/test_products.py tests/test_fused.py -k "${GRAPH_K:-}" >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG" ;;
    graphtiny) stage "graph tiny"                      # eager vs graph per token, tiny presets
      timeout ${GRAPHTINY_TIMEOUT:-240} python3 benchmarks/graph_decode.py --arch ${GRAPH_ARCH:-deepseek2,llama,qwen3moe,qwen3next,kimi-linear,kimi-k3,deepseek32,glm-dsa,qwen4exp,deepseek4} --decode 32 \
        --json "$OUT/graph_tiny.json" >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG" ;;
    graphreal) for spec in ${GRAPHREAL:-kimi-k3:kimi-k3:3:full_attn=2 deepseek2:deepseek-v3:2 qwen3next:qwen3-next-80b:4 glm-dsa:glm-5.2:2 kimi-linear:kimi-linear-48b:4}; do IFS=: read -r A P L X <<< "$spec"
        stage "graph real-size $A $P L=$L ${X:-}"     # a real-size cut: eager vs graph per token
        timeout ${GRAPH_TIMEOUT:-300} python3 benchmarks/graph_decode.py --arch $A --preset $P --layers $L ${X:+--override $X} \
          --type Q4_K --decode ${GRAPH_DECODE:-24} ${GRAPH_PREFILL:+--prefill $GRAPH_PREFILL} --dir /tmp/rs \
          ${GRAPH_CHECK:+--check-cpu $GRAPH_CHECK} ${GRAPH_UBATCH:+--ubatch $GRAPH_UBATCH --ubatches ${GRAPH_UBATCHES:-4}} \
          ${GRAPH_GREEDY:+--greedy $GRAPH_GREEDY} --json "$OUT/graph_$A.json" >> "$LOG" 2>&1
        echo "rc=$?" >> "$LOG"; rm -f /tmp/rs/*.gguf; done ;;
    profprefill) for spec in ${PROFPREFILL:-deepseek2:deepseek-v3:2}; do IFS=: read -r A P L X <<< "$spec"
        stage "prefill profile $A $P L=$L ${X:-}"      # GPU time per kernel + host functions, one prefill
        timeout ${PROF_TIMEOUT:-300} python3 benchmarks/profile_prefill.py --arch $A --preset $P --layers $L \
          ${X:+--override $X} --tokens ${PROF_TOKENS:-512} --dir /tmp/rs ${PROF_ARGS:---segments} >> "$LOG" 2>&1
        echo "rc=$?" >> "$LOG"; rm -f /tmp/rs/*.gguf; done ;;
    prefillsweep) for spec in ${PROFPREFILL:-deepseek2:deepseek-v3:2}; do IFS=: read -r A P L X <<< "$spec"
        for item in default ${SWEEP:-group_avg=16 sgemm_decode=staged sgemm_min=32}; do   # KEY=V[+KEY=V] each
          pol=""; [ "$item" != default ] && for kv in ${item//+/ }; do pol="$pol --policy $kv"; done
          stage "prefill sweep $A $P L=$L ${X:-} $item"   # the same cut under each policy (the file kept between)
          timeout ${PROF_TIMEOUT:-300} python3 benchmarks/profile_prefill.py --arch $A --preset $P --layers $L \
            ${X:+--override $X} --tokens ${PROF_TOKENS:-512} --dir /tmp/rs $pol --top 12 >> "$LOG" 2>&1
          echo "rc=$?" >> "$LOG"; done; rm -f /tmp/rs/*.gguf; done ;;
    llbuild) stage "llama.cpp build (detached)"          # llama-bench from the oracle's vendored source (.dev/)
      B=/tmp/ll/llama.cpp/build/bin                    # a llama-bench built on the project machine (.dev/llama-bench.txz,
      if [ -f .dev/llama-bench.txz ] && [ ! -f /tmp/ll/build.done ]; then    # s31/build_llamabench.sh): used if it runs
        mkdir -p $B && tar xJf .dev/llama-bench.txz -C $B && $B/llama-bench --list-devices >> "$LOG" 2>&1 \
          && { echo 0 > /tmp/ll/build.done; echo "llama-bench: the carried build" >> "$LOG"; } || rm -rf /tmp/ll
      fi
      STEPS=build bash .dev/llamacpp_bench_device.sh >> "$LOG" 2>&1 ;;
    graphll) for spec in ${GRAPHLL:-deepseek2:deepseek-v3:2}; do IFS=: read -r A P L X <<< "$spec"
        stage "llama.cpp and ours, one file: $A $P L=$L ${X:-}"   # the same random-packed Q4_K file, both timed
        F=/tmp/m/$A-$P-L$L${X:+-$X}.gguf
        while [ -f $F.tmp ]; do sleep 1; done                   # a writer ahead of the cuts is writing it (s31/call.sh)
        MODELS="$spec" STEPS=models bash .dev/llamacpp_bench_device.sh >> "$LOG" 2>&1
        BENCH_FILES=$F STEPS=bench bash .dev/llamacpp_bench_device.sh >> "$LOG" 2>&1
        timeout ${GRAPH_TIMEOUT:-300} python3 benchmarks/graph_decode.py $F --type Q4_K --decode ${GRAPH_DECODE:-24} \
          --prefill ${GRAPH_PREFILL:-512} ${GRAPH_CHECK:+--check-cpu $GRAPH_CHECK} \
          ${GRAPH_UBATCH:+--ubatch $GRAPH_UBATCH --ubatches ${GRAPH_UBATCHES:-4}} ${GRAPH_GREEDY:+--greedy $GRAPH_GREEDY} \
          ${GRAPH_SAVE:+--save-logits "$OUT/logits_$A.npz"} ${GRAPH_POLICY:+--policy $GRAPH_POLICY} \
          --json "$OUT/graph_$A.json" >> "$LOG" 2>&1
        echo "rc=$?" >> "$LOG"
        if [ -n "${GRAPH_PROFILE:-}" ]; then stage "prefill profile $A"       # the same file: kernels, segments
          timeout ${PROF_TIMEOUT:-240} python3 benchmarks/profile_prefill.py $F --tokens ${GRAPH_PREFILL:-512} \
            --segments --top 25 >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"; fi
        for alt in ${GRAPH_ALT:-}; do stage "prefill under $alt $A"          # another KernelPolicy setting's wall
          timeout ${PROF_TIMEOUT:-240} python3 benchmarks/profile_prefill.py $F --tokens ${GRAPH_PREFILL:-512} \
            --wall-only --policy $alt >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"; done
        rm -f $F; done ;;
    prefetch) stage "expert prefetch"                 # Qwen3-Next cut, 1/8 budget, with and without prefetch
      F=/tmp/rs/qwen3next-L4-Q4_K.gguf
      python3 -c "from refengine.cuda.randmodel import write_random_model as w; w('$F', 'Q4_K', 4, arch='qwen3next', preset='qwen3-next-80b')" >> "$LOG" 2>&1
      R=/tmp/rs/qwen3next-ref.npz                    # the resident reference: run once, saved, read by the second
      for pf in "" "--prefetch"; do
        timeout ${PREFETCH_TIMEOUT:-200} python3 benchmarks/expert_cache.py $F --budgets 0.125,0.25 --decode 64 $pf \
          --ubatch 4 $([ -f $R ] && echo --reference $R || echo --save-reference $R) \
          --json "$OUT/prefetch${pf:+_on}.json" >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"; done ;;
    experts) stage "experts' prefill products by kernel"   # tc vs tcq shapes at DeepSeek-V3's expert shapes (session 25)
      timeout ${EXPERTS_TIMEOUT:-300} python3 benchmarks/expert_prefill.py --shapes ${EXPERTS_TC:-64x4x1x32} --kernels "" \
        --tcq ${EXPERTS_TCQ:-4x2x32,2x4x32x0x0x0x1,4x2x32x0x0x0x1,1x4x32x0x0x0x1,2x4x16,1x4x16,1x4x16x0x0x0x1,2x4x16x0x0x0x1,4x2x32x0x0x0x0x1,2x4x32x0x0x0x0x1,2x2x32x0x0x0x0x1,2x4x16x0x0x0x0x1,1x4x32x0x0x0x0x1} \
        ${EXPERTS_ARGS:-} --json "$OUT/experts.json" >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG" ;;
    proffixed) for spec in ${PROFPREFILL:-deepseek2:deepseek-v3:2}; do IFS=: read -r A P L X <<< "$spec"
        stage "fixed-shape prefill profile $A $P L=$L ${X:-}"   # where a 512-token ubatch graph's time goes
        timeout ${PROF_TIMEOUT:-300} python3 benchmarks/profile_prefill.py --arch $A --preset $P --layers $L \
          ${X:+--override $X} --tokens ${PROF_TOKENS:-512} --dir /tmp/rs --fixed-shapes --segments --top 20 >> "$LOG" 2>&1
        echo "rc=$?" >> "$LOG"; rm -f /tmp/rs/*.gguf; done ;;
    tests) stage tests
      timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider ${TESTS:-tests/test_cuda_layer.py tests/test_cuda_kernels.py} \
        -k "${TEST_K:-not ptx}" --durations=15 >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG" ;;
  esac
done
stage done
grep -v "^ok \|^\.\+$" "$LOG" | tail -60
