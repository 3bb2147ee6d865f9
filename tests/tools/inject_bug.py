"""pytest plugin: patch one bug in at start (INJECT=norm: the final norm x1.5; INJECT=output: output.weight's input
left unrounded in llama.cpp mode), to see which llama.cpp-mode cases it fails (docs/quant.md, "Injected bugs").

    INJECT=norm PYTHONPATH=tests/tools pytest -p inject_bug -n 0 tests/test_llamacpp_mode.py -k test_logits_within_1e7
"""
import os
import numpy as np


def pytest_configure(config):
    bug = os.environ.get("INJECT")
    if bug == "norm":
        import refengine.globals as g
        norm = g.rms_norm
        g.rms_norm = lambda x, w, eps: np.float32(1.5) * norm(x, w, eps)
    elif bug == "output":
        from refengine.runtime import Runtime
        matmul = Runtime.matmul

        def mm(self, x, w):
            if w.name == "output.weight" and self.mode == "llamacpp":
                return self._be.matmul(self._forced_input(x), w, mode="exact")
            return matmul(self, x, w)
        Runtime.matmul = mm
