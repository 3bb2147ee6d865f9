"""The fast GEMV's registry: every type with a unit decoder (`fast_units.BASE`, `fast_more.MORE`) and its `FSpec`.

The kernels (`fast.py`, `fast8.py`), the host dispatch (`ops.py`), the PTX check and the tests read `FSPECS`;
a new type is an entry in one of the two tables, and no module changes another's table.
"""
from __future__ import annotations

from ..formats import GGMLType
from .fast_more import MORE
from .fast_units import BASE, FSpec

FSPECS: dict[GGMLType, FSpec] = {**BASE, **MORE}


def fast_supported(t: GGMLType, rowb: int, estride: int) -> bool:
    """The fast kernels take type t with rows of `rowb` bytes and experts `estride` bytes apart."""
    s = FSPECS.get(t)
    return s is not None and (not s.ALIGN16 or (rowb % 16 == 0 and estride % 16 == 0))


__all__ = ["FSPECS", "FSpec", "fast_supported"]
