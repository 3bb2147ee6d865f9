#!/usr/bin/env bash
# Build llama.cpp's `llama-results` and `llama-perplexity` (CPU) from the same source as the oracle
# (the llama.cpp vendored in llama-cpp-python 0.3.36), for the exhaustive golden-output tests
# (tests/test_golden_llamacpp_tools.py) and for checking a golden directory by hand.
#
#   tests/tools/build_llamacpp_tools.sh [BUILD_DIR]      default: build/llamacpp-tools
#
# About 15-25 minutes on 2 cores (libllama, ggml-cpu, llama-common and the two tools); the binaries land
# in BUILD_DIR/bin. The tests find them there, or through $REFENGINE_LLAMACPP_BIN.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build/llamacpp-tools}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
SRC_CACHE=build/llamacpp-src          # tests/tools/llamacpp_src.sh unpacks the same tree
VERSION=0.3.36
mkdir -p "$SRC_CACHE"
if [ ! -d "$SRC_CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp" ]; then
    [ -f "$SRC_CACHE/llama_cpp_python-$VERSION.tar.gz" ] || \
        "$PY" -m pip download -q --no-deps --no-binary=:all: "llama-cpp-python==$VERSION" -d "$SRC_CACHE"
    tar xzf "$SRC_CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$SRC_CACHE"
fi
LLAMA="$SRC_CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF
cmake --build "$BUILD" -j "$(nproc)" --target llama-results llama-perplexity
ls -l "$BUILD/bin/llama-results" "$BUILD/bin/llama-perplexity"
