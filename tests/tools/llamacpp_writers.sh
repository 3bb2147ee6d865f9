#!/usr/bin/env bash
# llama.cpp's own writers as test sources (tests/test_llamacpp_written.py): its random-model writer
# (tests/test-llama-archs.cpp, -o) and llama-quantize, built from the oracle's own source (llama-cpp-python 0.3.36).
#
#   tests/tools/llamacpp_writers.sh prepare        the source tree (tests/tools/llamacpp_src.sh) trimmed to what these
#                                                  two tools need, in build/lcsrc (~34 MB: small enough to carry to the
#                                                  GPU machine, whose 16 cores build it in ~45 s; 2 cores here: ~20 min)
#   tests/tools/llamacpp_writers.sh build          static, generic-x86 binaries in build/llamacpp-tools/bin (a build on
#                                                  the GPU machine runs here too: bring bin/ back through $OUT)
#   tests/tools/llamacpp_writers.sh write [DIR]    every registered arch's writer files in DIR/writer and their
#                                                  llama-quantize forms in DIR/quant (default build/llamacpp-written)
# The writer's seed is random unless SEED is set (SEED=7 ... write).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${REFENGINE_LLAMACPP_BIN:-build/llamacpp-tools/bin}
ARCHS='^(llama|qwen3moe|deepseek2|deepseek32|glm-dsa|qwen3next|kimi-linear|kimi-k3|deepseek4|qwen4exp|glm5-next)$'
case "${1:-}" in
  prepare)
    TREE=$(tests/tools/llamacpp_src.sh)
    rm -rf build/lcsrc && mkdir -p build/lcsrc
    tar cf - -C "$TREE" --exclude=./models --exclude=./docs --exclude=./media --exclude=./tools/ui --exclude=./benches \
        --exclude=./gguf-py --exclude=./conversion --exclude='./ggml/src/ggml-sycl' --exclude='./ggml/src/ggml-vulkan' \
        --exclude='./ggml/src/ggml-opencl' --exclude='./ggml/src/ggml-hexagon' --exclude='./ggml/src/ggml-metal' \
        --exclude='./ggml/src/ggml-et' --exclude='./ggml/src/ggml-cuda' . | tar xf - -C build/lcsrc
    du -sh build/lcsrc ;;
  build)
    B=${BUILD_DIR:-/tmp/lcb}
    cmake -S build/lcsrc -B "$B" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DCMAKE_EXE_LINKER_FLAGS=-static > /dev/null
    cmake --build "$B" -j "$(nproc)" --target test-llama-archs llama-quantize llama-results llama-perplexity
    mkdir -p "$BIN" && cp "$B/bin/test-llama-archs" "$B/bin/llama-quantize" "$B/bin/llama-results" \
        "$B/bin/llama-perplexity" "$BIN/" && strip "$BIN"/* || true
    ls -l "$BIN" ;;
  write)
    D=${2:-build/llamacpp-written}
    mkdir -p "$D/writer" "$D/quant"
    "$BIN/test-llama-archs" -a "$ARCHS" ${SEED:+-s $SEED} -o "$D/writer"
    for f in "$D"/writer/*.gguf; do
        n=$(basename "$f" .gguf)
        # the Kimi K3 case: small tensors quantized beside F32 vectors (llama-quantize never quantizes ffn_gate_inp)
        "$BIN/llama-quantize" --tensor-type ssm_f_b=q8_0 --tensor-type ssm_f_a=q8_0 --tensor-type attn_k_b=q8_0 \
            --tensor-type ffn_gate_inp=q8_0 --tensor-type ssm_beta=q8_0 --tensor-type ssm_alpha=q8_0 \
            "$f" "$D/quant/$n.q4km-ovr.gguf" Q4_K_M > /dev/null
        case $n in *moe*) "$BIN/llama-quantize" "$f" "$D/quant/$n.mxfp4moe.gguf" MXFP4_MOE > /dev/null ;; esac
    done
    ls "$D/writer" "$D/quant" ;;
  *) sed -n 2,13p "$0"; exit 2 ;;
esac
