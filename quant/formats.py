"""The ggml type table: block size, bytes per block, and the activation type llama.cpp pairs it with.

Ids and sizes follow `ggml/include/ggml.h` and `ggml/src/ggml-common.h` of the llama.cpp vendored in
llama-cpp-python 0.3.36. `vec_dot_type` is the type ggml-cpu converts the activation row to before a
quantized dot product (`type_traits_cpu[...].vec_dot_type` in `ggml/src/ggml-cpu/ggml-cpu.c`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class GGMLType(enum.IntEnum):
    """Every ggml type id a GGUF tensor may carry (ids 4, 5, 31-33, 36-38 were retired by ggml)."""
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


@dataclass(frozen=True)
class TypeInfo:
    type: GGMLType
    block_size: int      # elements per block
    type_size: int       # bytes per block
    vec_dot_type: GGMLType | None  # activation partner on ggml-cpu; None for non-matmul types

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of `n` elements; `n` must be a multiple of the block size."""
        if n % self.block_size:
            raise ValueError(f"{self.type.name}: row of {n} elements is not a multiple of the block size {self.block_size}")
        return n // self.block_size * self.type_size


T = GGMLType
_TABLE = [
    # type       block  bytes  vec_dot_type
    (T.F32,        1,     4,   T.F32),
    (T.F16,        1,     2,   T.F16),
    (T.BF16,       1,     2,   T.BF16),
    (T.F64,        1,     8,   None),
    (T.I8,         1,     1,   None),
    (T.I16,        1,     2,   None),
    (T.I32,        1,     4,   None),
    (T.I64,        1,     8,   None),
    (T.Q4_0,      32,    18,   T.Q8_0),
    (T.Q4_1,      32,    20,   T.Q8_1),
    (T.Q5_0,      32,    22,   T.Q8_0),
    (T.Q5_1,      32,    24,   T.Q8_1),
    (T.Q8_0,      32,    34,   T.Q8_0),
    (T.Q8_1,      32,    36,   T.Q8_1),
    (T.Q1_0,     128,    18,   T.Q8_0),
    (T.Q2_0,      64,    18,   T.Q8_0),
    (T.Q2_K,     256,    84,   T.Q8_K),
    (T.Q3_K,     256,   110,   T.Q8_K),
    (T.Q4_K,     256,   144,   T.Q8_K),
    (T.Q5_K,     256,   176,   T.Q8_K),
    (T.Q6_K,     256,   210,   T.Q8_K),
    (T.Q8_K,     256,   292,   None),
    (T.IQ2_XXS,  256,    66,   T.Q8_K),
    (T.IQ2_XS,   256,    74,   T.Q8_K),
    (T.IQ2_S,    256,    82,   T.Q8_K),
    (T.IQ3_XXS,  256,    98,   T.Q8_K),
    (T.IQ3_S,    256,   110,   T.Q8_K),
    (T.IQ1_S,    256,    50,   T.Q8_K),
    (T.IQ1_M,    256,    56,   T.Q8_K),
    (T.IQ4_NL,    32,    18,   T.Q8_0),
    (T.IQ4_XS,   256,   136,   T.Q8_K),
    (T.TQ1_0,    256,    54,   T.Q8_K),
    (T.TQ2_0,    256,    66,   T.Q8_K),
    (T.MXFP4,     32,    17,   T.Q8_0),
    (T.NVFP4,     64,    36,   T.Q8_0),
]
TYPES: dict[GGMLType, TypeInfo] = {t: TypeInfo(t, b, s, v) for t, b, s, v in _TABLE}


class UnknownTypeError(ValueError):
    """A ggml type id that this table does not know (a newer ggml, or corrupt bytes)."""


def type_info(t: int | str | GGMLType) -> TypeInfo:
    """Look up a type by id, name ("Q4_K", "q4_k") or enum member."""
    try:
        if isinstance(t, str):
            key = GGMLType[t.upper()]
        else:
            key = GGMLType(int(t))
    except (KeyError, ValueError):
        raise UnknownTypeError(f"unknown ggml type {t!r}; known: {', '.join(m.name for m in GGMLType)}") from None
    return TYPES[key]
