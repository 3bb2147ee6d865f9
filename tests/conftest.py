"""Shared fixtures. The CUDA simulator must be chosen before numba is first imported.

The oracles:
- an `oracle` test needs llama.cpp (llama-cpp-python's libggml / libllama). Without it the test is skipped, but
  under `CI=true` it fails: a CI run that compared nothing with llama.cpp must not pass.
- the terminal summary states how many comparisons the run made with each oracle: llama.cpp runs (every
  `refengine.oracle.LlamaCpp` opened: `run_llamacpp`, `generate_llamacpp`, `compare`) and transformers
  comparisons (`check_golden(..., source="transformers")`), summed over pytest-xdist workers.
"""
import os

if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402

from quant import ggml as qggml  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() == "true"
COUNTS = {"llama.cpp": 0, "transformers": 0}          # this process's comparisons (a worker's, under xdist)


def _count_oracle_calls() -> None:
    """Count each oracle run where it happens, whatever the test imported."""
    import refengine.golden as golden
    import refengine.golden.check as golden_check
    from refengine.oracle import llamacpp

    init = llamacpp.LlamaCpp.__init__

    def counted_init(self, *a, **kw):
        init(self, *a, **kw)
        COUNTS["llama.cpp"] += 1
    llamacpp.LlamaCpp.__init__ = counted_init

    check = golden_check.check_golden

    def counted_check(*a, **kw):
        if kw.get("source") == "transformers":
            COUNTS["transformers"] += 1
        return check(*a, **kw)
    golden_check.check_golden = golden.check_golden = counted_check

    from refengine.oracle import transformers as hf_oracle
    build = hf_oracle.hf_model

    def counted_model(*a, **kw):                        # every run of the authors' code builds its model here
        COUNTS["transformers"] += 1
        return build(*a, **kw)
    hf_oracle.hf_model = counted_model


_count_oracle_calls()


_MISSING: list[str] = []


def _oracle_missing() -> str:
    """'' when llama.cpp loads, else why not (found once per process)."""
    if not _MISSING:
        why = ""
        try:
            qggml.lib()
            import llama_cpp  # noqa: F401
        except Exception as e:                           # GGMLUnavailable, OSError, ImportError
            why = f"{type(e).__name__}: {e}"
        _MISSING.append(why)
    return _MISSING[0]


def pytest_collection_modifyitems(config, items):
    why = _oracle_missing()
    if not why or IN_CI:                                 # in CI: failed in pytest_runtest_setup instead
        return
    skip = pytest.mark.skip(reason=f"llama-cpp-python (the llama.cpp oracle) cannot be loaded: {why}")
    for item in items:
        if "oracle" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    if IN_CI and "oracle" in item.keywords and _oracle_missing():
        pytest.fail(f"CI=true: this oracle test needs llama.cpp, which cannot be loaded ({_oracle_missing()})",
                    pytrace=False)


def pytest_sessionfinish(session):
    out = getattr(session.config, "workeroutput", None)  # an xdist worker: report to the controller
    if out is not None:
        out["oracle_counts"] = dict(COUNTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: add up what each worker counted."""
    for k, v in getattr(node, "workeroutput", {}).get("oracle_counts", {}).items():
        COUNTS[k] = COUNTS.get(k, 0) + v


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config, "workeroutput", None) is not None:
        return
    terminalreporter.write_line(f"oracle comparisons: llama.cpp {COUNTS['llama.cpp']} run(s), "
                                f"transformers {COUNTS['transformers']} comparison(s)")


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
