#!/bin/sh
# llama-bench built on the project machine (benchmarks/results/h200/s31/build_llamabench.sh): cuBLAS / cudart 13 from
# the GPU machine's CUDA toolkit or its Python's nvidia wheels
D=$(dirname "$0")
for p in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
  [ -d "$p" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$p"
done
export LD_LIBRARY_PATH
exec "$D/llama-bench.bin" "$@"
