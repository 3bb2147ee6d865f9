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
        add_norm = g.add_norm                  # rms_head's final norm (with the last block's sum)

        def scaled(x, w, eps):
            total, h = add_norm(x, w, eps)
            return total, np.float32(1.5) * h
        g.add_norm = scaled
    elif bug == "output":
        from refengine.runtime import Runtime
        matmul = Runtime.matmul

        def mm(self, x, w):
            if w.name == "output.weight" and self.mode == "llamacpp":
                return self._be.matmul(self._forced_input(x), w, mode="exact")
            return matmul(self, x, w)
        Runtime.matmul = mm
