"""Shared fixtures. The CUDA simulator must be chosen before numba is first imported."""
import os

if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402

from quant import ggml as qggml  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if qggml.available():
        return
    skip = pytest.mark.skip(reason="llama-cpp-python (the llama.cpp oracle) is not installed")
    for item in items:
        if "oracle" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory):
    """synth_model(arch, **kwargs) -> path of a cached synthetic GGUF written once per session."""
    from refengine.synth import write_synth
    root = tmp_path_factory.mktemp("synth")
    cache = {}

    def make(arch, **kw):
        key = arch + "".join(f"-{k}={v}" for k, v in sorted(kw.items()))
        if key not in cache:
            name = f"m{len(cache)}.gguf"
            cache[key] = write_synth(arch, root / name, **kw)
        return cache[key]
    return make
