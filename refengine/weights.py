"""Weight tables: GGUF tensor name -> field, expected shape, required or optional.

Every arch declares its tensors as `W(...)` rows; `load_tensors` resolves a table for one layer against
the file, checks shapes, and returns a namespace whose fields are named after the GGUF tensors
(`attn_q`, `attn_q_bias`, `attn_q_scale`, `ffn_gate_exps`). Large matrices stay packed, mmapped
`QTensor`s; small vectors (norms, biases, scales) are decoded to float32 once and checked for NaN/inf.

A row also says which ggml types llama.cpp's graph takes at that place (`refengine lint` reports it):
a matrix goes through `ggml_mul_mat` / `ggml_get_rows`, which take every type; a dense vector goes
through an elementwise `ggml_mul` / `ggml_add` (norms, biases, `.scale`, `exp_probs_b`) or is a rope
factor, and ggml-cpu's binary ops take an F32 second operand only (`binary_op`,
ggml/src/ggml-cpu/binary-ops.cpp:116-137 aborts on F16 or quantized); `accepts` overrides either (e.g.
`ssm_conv1d`: `ggml_ssm_conv` reads F32), and with `refuse_others` a file with another type is refused at load.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

import quant
from quant import QTensor

from .errors import MissingTensorError, NonFiniteError, ShapeError, WeightError


@dataclass(frozen=True)
class W:
    field: str                  # attribute name on the loaded namespace
    name: str                   # GGUF name, "{il}" replaced by the layer index
    shape: Callable | None      # cfg, spec -> expected NumPy shape (reversed ggml ne), or None
    required: bool = True
    dense: bool = False         # decode to a float32 array at load (norms, biases, scales)
    small: bool = False         # a small matrix (router gate, ssm_* projection): llama.cpp multiplies it in any
                                # type, but strict loaders expect it unquantized (lint flags a quantized one)
    accepts: tuple[str, ...] | None = None   # ggml types llama.cpp's op takes here (None: see accepted_types)
    refuse_others: bool = False # another type than `accepts` is refused at load (llama.cpp aborts on it:
                                # `ggml_ssm_conv` reads its kernel as float), not only reported by lint
    reshape: bool = False       # any shape of the same element count is read at `shape` (llama.cpp's
                                # TENSOR_ALLOW_RESHAPE, llama-model-loader.cpp:1348: qwen4exp's per-stream gammas,
                                # [hc * D] as its converter writes them, [hc, D] as llama.cpp declares them)

    def accepted_types(self) -> tuple[str, ...] | None:
        """The ggml type names llama.cpp's CPU graph takes for this tensor; None means every type."""
        if self.accepts is not None:
            return self.accepts
        return F32_ONLY if self.dense else None


F32_ONLY = ("F32",)


def load_tensors(gf, table: list[W], cfg, spec=None, il: int = -1) -> SimpleNamespace:
    out, names, rows = {}, [], {}
    for w in table:
        name = w.name.format(il=il)
        if name not in gf:
            if w.required:
                raise MissingTensorError(f"{gf.path}: required tensor {name!r} is missing")
            out[w.field] = None
            continue
        t = gf.tensor(name)
        if w.refuse_others and t.type.name not in w.accepts:
            raise WeightError(f"{gf.path}: tensor {name!r} is {t.type.name}; llama.cpp's op here takes "
                              f"{' / '.join(w.accepts)} only (its converter writes {w.accepts[0]})")
        if w.shape is not None:
            want = tuple(int(s) for s in w.shape(cfg, spec))
            got = t.shape
            if got != want:
                if not (same_ne(got, want) or w.reshape and same_count(got, want)):
                    raise ShapeError(f"{gf.path}: tensor {name!r} has shape {list(got)} (NumPy order), "
                                     f"expected {list(want)}" + (" or any shape of as many elements "
                                                                 "(TENSOR_ALLOW_RESHAPE)" if w.reshape else ""))
                try:              # [256, 1] in the file, [256] wanted (or [1024] for [4, 256] with reshape)
                    t = QTensor.from_raw(t.name, t.type, want, t.raw)
                except quant.QuantError as e:                          # a block type whose rows do not re-cut
                    raise ShapeError(f"{gf.path}: tensor {name!r} {list(got)} cannot be read as {list(want)}: "
                                     f"{e} (llama.cpp asserts the two byte sizes equal)") from None

        out[w.field] = dense_vector(t) if w.dense else t
        names.append(name)
        rows[name] = w
    ns = SimpleNamespace(**out)
    ns.tensor_names = names          # every GGUF tensor this table consumed
    ns.tensor_rows = rows            # name -> its W row (what refengine lint reports per tensor)
    return ns


def same_ne(got: tuple, want: tuple) -> bool:
    """llama.cpp's `check_tensor_dims`: the ggml ne (reversed shape) equal once both are padded with 1s to 4 dims."""
    pad = lambda s: tuple(reversed(s)) + (1,) * (4 - len(s))                  # noqa: E731
    return len(got) <= 4 and len(want) <= 4 and pad(got) == pad(want)


def same_count(got: tuple, want: tuple) -> bool:
    """TENSOR_ALLOW_RESHAPE's check (`check_tensor_dims` with allow_reshape, llama-model-loader.cpp:896-905): the
    element counts are equal."""
    return int(np.prod(got, dtype=np.int64)) == int(np.prod(want, dtype=np.int64))


def dense_vector(t: QTensor) -> np.ndarray:
    """Decode a small tensor of any type to float32 and refuse NaN/inf, naming the tensor."""
    a = quant.dequantize(t)
    if not np.all(np.isfinite(a)):
        bad = np.flatnonzero(~np.isfinite(a.reshape(-1)))
        raise NonFiniteError(f"tensor {t.name!r} holds {bad.size} non-finite values (first at flat index {bad[0]})")
    a.flags.writeable = False            # weights are constants (a device keeps one copy of a read-only array)
    return a


def norm_table(il: int, *names: str) -> list[W]:
    """The block's own [D] norm vectors (`blk.{il}.attn_norm.weight`, ...), owned by the arch's block wiring."""
    return [W(n, f"blk.{il}.{n}.weight", lambda c, s: (c.n_embd,), dense=True) for n in names]
