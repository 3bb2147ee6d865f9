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


def packed_geometry(qt) -> tuple[int, int]:
    """(bytes per row, bytes per expert) of a packed tensor as the device holds it (`weights.DeviceWeight`)."""
    rowb = int(qt.row_bytes)
    return rowb, (qt.shape[-2] if qt.ndim >= 2 else 1) * rowb


def fast_supported_tensor(qt) -> bool:
    """fast_supported for a packed tensor on the host (no upload): what `ops.fast_ids_ok` asks of its DeviceWeight,
    the input's alignment aside."""
    return fast_supported(qt.type, *packed_geometry(qt))


__all__ = ["FSPECS", "FSpec", "fast_supported", "fast_supported_tensor", "packed_geometry"]
