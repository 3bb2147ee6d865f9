#!/usr/bin/env bash
# llama-bench built on the project machine (nvcc 13.0, as on the GPU machines; ~40 min on 2 cores) so a lease need
# not spend ~5 min of device time building it: the result goes to .dev/llama-bench.txz (carried), which gpu_session.sh's
# llbuild stage unpacks and uses when `llama-bench --list-devices` runs there (else it builds as before).
# cuBLAS comes from pip's nvidia-cublas wheel (headers and .so to link against; the GPU machine's own at run time);
# libcuda is a stub named libcuda.so.1 with the driver functions ggml-cuda calls (the driver's at run time).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
SRC=$(tests/tools/llamacpp_src.sh); W=${W:-/tmp/llb}; TK=$W/cudatk; mkdir -p $W
if [ ! -d $TK ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
    "nvidia-cublas>=13.0,<13.1" -d $W/cublas && (cd $W/cublas && python3 -m zipfile -e nvidia_cublas-*.whl x)
  cp -as "$(readlink -f /usr/local/cuda)/" $TK && R=$(readlink -f $TK/lib64) && rm $TK/lib64 && mkdir $TK/lib64
  for f in $R/*; do ln -s $f $TK/lib64/; done
  cp -s $W/cublas/x/nvidia/cu13/include/*.h $TK/include/
  for l in libcublas libcublasLt; do ln -sf $W/cublas/x/nvidia/cu13/lib/$l.so.13 $TK/lib64/$l.so.13
    ln -sf $l.so.13 $TK/lib64/$l.so; done
  mkdir -p $TK/lib64/stubs && echo "" > $W/e.c && gcc -shared -o $TK/lib64/stubs/libcuda.so -Wl,-soname,libcuda.so.1 $W/e.c
fi
cmake -S "$SRC" -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT=$TK -DCMAKE_CUDA_COMPILER=$TK/bin/nvcc > $W/cfg.log
cmake --build $W/build --target llama-bench -j $(nproc) > $W/build.log 2>&1 || {
  # the link wants libcuda's symbols: a stub defining the ones the objects use (each a function returning 0)
  nm -u $W/build/ggml/src/ggml-cuda/libggml-cuda.a 2>/dev/null | awk '$2 ~ /^cu[A-Z]/ && $2 !~ /^cuda|^cublas/ {print $2}' \
    | sort -u | sed 's/.*/int &(void) { return 0; }/' > $W/stub.c
  gcc -shared -o $TK/lib64/stubs/libcuda.so -Wl,-soname,libcuda.so.1 $W/stub.c
  cmake --build $W/build --target llama-bench -j $(nproc) >> $W/build.log 2>&1; }
# the binary stripped as llama-bench.bin beside its wrapper (llama-bench.sh here: cuBLAS / cudart 13 found there)
P=$W/pack; mkdir -p $P && cp $W/build/bin/llama-bench $P/llama-bench.bin && strip $P/llama-bench.bin
cp benchmarks/results/h200/s31/llama-bench.sh $P/llama-bench && chmod +x $P/llama-bench
tar cJf .dev/llama-bench.txz -C $P llama-bench llama-bench.bin       # ~41 MB: with .whl and .dev's rest under 64 MiB
ls -la .dev/llama-bench.txz
