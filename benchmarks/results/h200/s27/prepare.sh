#!/usr/bin/env bash
# On this (project) machine, before a lease: the two ignored folders the GPU calls carry (`carry: [".whl", ".dev"]`).
#   .whl  gguf, tqdm, pyyaml, safetensors as wheels for the GPU machine's Python 3.12 (README, Tests: it has numpy, numba-cuda,
#         CuPy; pip there installs them with --no-deps into /tmp/site)
#   .dev  the vendored llama.cpp of llama-cpp-python 0.3.36's sdist (the oracle's source) as llcpp.tgz, without
#         models/, docs/, tests and the ggml back ends other than CPU / CUDA (and the few CUDA's CMake reads), and
#         ../shared/tools/llamacpp_bench_device.sh (it builds llama-bench there and times the same files)
#   bash benchmarks/results/h200/s27/prepare.sh [--check]     (--check: a CMake configure of the tarball here)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p .whl .dev
"$PY" -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d .whl gguf==0.19.0 tqdm pyyaml safetensors
SRC=$(tests/tools/llamacpp_src.sh)                 # build/llamacpp-src/.../vendor/llama.cpp (pip's cache if there)
T=$(mktemp -d)
mkdir -p "$T/llama.cpp"
(cd "$SRC" && tar cf - --exclude=./models --exclude=./docs --exclude=./tests --exclude=./.git \
   --exclude='./ggml/src/ggml-'{cann,et,hexagon,metal,opencl,openvino,sycl,virtgpu,vulkan,webgpu,zdnn,zendnn} .) \
  | tar xf - -C "$T/llama.cpp"
tar czf .dev/llcpp.tgz -C "$T" llama.cpp
cp ../shared/tools/llamacpp_bench_device.sh .dev/
if [ -f .dev/llama-bench.txz ]; then    # the carried build runs there: the source tarball (only its fallback) would put
  mkdir -p build && mv .dev/llcpp.tgz build/llcpp.tgz   # the tree, .whl and .dev over the 64 MiB carry (session 33)
  echo ".dev/llama-bench.txz present: llcpp.tgz kept in build/ (not carried; move it back to build there)"
fi
echo "$(du -sh .whl | cut -f1) .whl, $(du -sh .dev/llcpp.tgz | cut -f1) .dev/llcpp.tgz (carry limit: 64 MiB in all)"
if [ "${1:-}" = --check ]; then
  rm -rf "$T/cfg" && (cd "$T/llama.cpp" && cmake -B "$T/cfg" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release > "$T/cfg.log" 2>&1) || true
  # (a machine without the CUDA libraries stops at generating, CUDA::cublas not found: the tree was read whole)
  grep -q -- "-- Configuring done" "$T/cfg.log" && echo "configure: the tree is complete" \
    || { tail -20 "$T/cfg.log"; exit 1; }
fi
rm -rf "$T"
