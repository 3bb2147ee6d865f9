"""Fast-GEMV decoders for more types (see `fast.py` for the unit / ld / dc protocol). Each type here adds
its `FSpec` to `fast.FSPECS`; the kernels, host dispatch, PTX check and tests pick it up from there."""
from __future__ import annotations

from .fast import FSPECS  # noqa: F401

MORE: dict = {}
FSPECS.update(MORE)
