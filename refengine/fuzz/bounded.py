"""The two runs of a mutant, each in a forked child bounded in address space, CPU time and wall time.

    run_bounded(run_refengine, path)   Model(path); load_all(); forward([1, 2, 3])
    run_bounded(run_llamacpp, path)    ggml's gguf_init_from_file (the GGUF reader), then llama_model_load_from_file

Each returns {"outcome": ..., "error": ..., "msg": ..., "wall_s": ..., "peak_mb": ...}. refengine's outcomes:
typed (a refengine error), ran, warned (ran, with a note that llama.cpp refuses the file), untyped (any other
exception: a bug), crash (killed by a signal), hang (past the deadline or the CPU bound), memory (MemoryError,
or the address-space bound hit). llama.cpp's: accepted, refused (with its logged reason), crash, hang.

The parent imports refengine and loads llama.cpp before forking, so a child starts warm (a few ms).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import signal
import time
import traceback

OUTCOMES = ("typed", "ran", "warned", "untyped", "crash", "hang", "memory")
DEADLINE_S = 10.0
MEMORY_BYTES = 1 << 30          # address space a child may add to what it inherits from the fork


def run_refengine(path: str) -> dict:
    import warnings

    from ..config import LlamaCppWouldRefuse
    from ..errors import GGUFError, RefengineError
    from ..model import Model
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            m = Model(path)
            m.load_all()
            m.forward([1, 2, 3])
        notes = [str(x.message) for x in w if issubclass(x.category, LlamaCppWouldRefuse)]
        unused = m.unused_tensors()           # `refengine info` and `lint` say: llama.cpp's tensor count differs
        if unused:
            notes.append(f"unused tensors (llama.cpp would refuse the file: \"done_getting_tensors: wrong number of "
                         f"tensors\"): {', '.join(unused[:3])}")
        return {"outcome": "warned" if notes else "ran", "msg": notes[0][:300] if notes else ""}
    except RefengineError as e:           # reader: the file itself (GGUFError), not what it describes
        return {"outcome": "typed", "error": type(e).__name__, "msg": str(e)[:300], "reader": isinstance(e, GGUFError)}
    except MemoryError as e:
        return {"outcome": "memory", "error": "MemoryError", "msg": str(e)[:300]}
    except Exception as e:                                   # noqa: BLE001  (what the fuzzer is for)
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"outcome": "untyped", "error": type(e).__name__,
                "msg": f"{str(e)[:200]} at {os.path.basename(tb.filename)}:{tb.lineno}"}


_LOG: list[str] = []
_LOG_CB = None


def llamacpp_setup():
    """Load llama.cpp once, before forking: its error log lines are collected into _LOG (llama.cpp's reason)."""
    global _LOG_CB
    import llama_cpp as L

    from quant import ggml as qggml
    if _LOG_CB is None:
        state = {"last": 0}

        def log(level, text, user):                   # ggml_log_level: 4 error, 5 continues the last line
            if level == 5:
                level = state["last"]
            state["last"] = level
            if level == 4 and text:
                _LOG.append(text.decode("utf-8", errors="replace").strip())
        _LOG_CB = L.llama_log_callback(log)
        L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
        L.llama_backend_init()
        g = qggml.lib("ggml-base")
        g.gguf_init_from_file.restype = ctypes.c_void_p
        g.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GGUFInitParams]
        g.gguf_free.argtypes = [ctypes.c_void_p]
    return L, qggml.lib("ggml-base")


class _GGUFInitParams(ctypes.Structure):
    """`struct gguf_init_params` (ggml/include/gguf.h): no_alloc, ctx (NULL: read the metadata only)."""
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def _gguf_params():
    return _GGUFInitParams(True, None)


def run_llamacpp(path: str) -> dict:
    L, g = llamacpp_setup()
    _LOG.clear()
    ctx = g.gguf_init_from_file(path.encode(), _gguf_params())
    if not ctx:
        return {"outcome": "refused", "stage": "gguf", "msg": _reason()}
    g.gguf_free(ctx)
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False
    _LOG.clear()
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        return {"outcome": "refused", "stage": "model", "msg": _reason()}
    L.llama_model_free(model)
    return {"outcome": "accepted", "stage": "model", "msg": ""}


def _reason() -> str:
    errs = [x for x in _LOG if x and "failed to load model" not in x and "failed to read" not in x]
    return (errs[0] if errs else (_LOG[0] if _LOG else "?"))[:300]


def run_bounded(fn, path: str, *, deadline: float = DEADLINE_S, memory: int = MEMORY_BYTES) -> dict:
    """fn(path) -> dict, in a forked child bounded in address space (+memory over the parent's), CPU time and
    wall time. Crashes, hangs and memory exhaustion become outcomes; 'peak_mb' is the child's peak RSS."""
    r, w = os.pipe()
    vm = _vm_bytes()
    pid = os.fork()
    if pid == 0:                                                       # the child
        try:
            os.close(r)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.environ["GGML_NO_BACKTRACE"] = "1"          # ggml_abort: no gdb attach (seconds per abort)
            import faulthandler
            faulthandler.disable()                           # an abort is an outcome here, not a report
            resource.setrlimit(resource.RLIMIT_AS, (vm + memory, vm + memory))
            cpu = int(math.ceil(deadline))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            res = fn(path)
        except MemoryError:
            res = {"outcome": "memory", "error": "MemoryError", "msg": "outside the run"}
        except BaseException as e:                                     # noqa: BLE001
            res = {"outcome": "untyped", "error": type(e).__name__, "msg": str(e)[:200]}
        try:
            os.write(w, json.dumps(res).encode()[:60000])
        finally:
            os._exit(0)
    os.close(w)
    t0 = time.monotonic()
    status = rusage = None
    while True:
        got, status, rusage = os.wait4(pid, os.WNOHANG)
        if got:
            break
        if time.monotonic() - t0 > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, rusage = os.wait4(pid, 0)
            os.close(r)
            return {"outcome": "hang", "msg": f"killed after {deadline:.0f} s", "wall_s": deadline}
        time.sleep(0.002)
    chunks = []
    while True:
        c = os.read(r, 65536)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    wall = time.monotonic() - t0
    peak_mb = rusage.ru_maxrss / 1024
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        kind = "hang" if sig == signal.SIGXCPU else "crash"
        return {"outcome": kind, "msg": f"killed by {signal.Signals(sig).name}", "wall_s": wall, "peak_mb": peak_mb}
    try:
        res = json.loads(b"".join(chunks))
    except ValueError:
        res = {"outcome": "crash", "msg": f"exit status {os.WEXITSTATUS(status)} without a result"}
    res.update(wall_s=round(wall, 3), peak_mb=round(peak_mb, 1))
    return res


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
