#!/usr/bin/env bash
# The llama.cpp source tree the oracle was built from (vendored in llama-cpp-python 0.3.36's sdist), unpacked
# under build/llamacpp-src: its convert_hf_to_gguf.py and gguf-py make the converter's test files
# (tests/hf_fixtures.py, tests/tools/make_converted.py); build_llamacpp_tools.sh compiles its tools.
#   tests/tools/llamacpp_src.sh        prints the tree's path (downloads ~77 MB once, from pip's cache if there)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
SRC_CACHE=build/llamacpp-src
VERSION=0.3.36
TREE="$SRC_CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$TREE/convert_hf_to_gguf.py" ]; then
    mkdir -p "$SRC_CACHE"
    [ -f "$SRC_CACHE/llama_cpp_python-$VERSION.tar.gz" ] || \
        "$PY" -m pip download -q --no-deps --no-binary=:all: "llama-cpp-python==$VERSION" -d "$SRC_CACHE" >&2
    tar xzf "$SRC_CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$SRC_CACHE"
fi
echo "$PWD/$TREE"
