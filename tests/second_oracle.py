"""The second oracle: transformers (with CPU torch), the authors' own modelling code, installed by the `hf` extra
(`./dev.sh test` installs it).

    torch, tf = import_transformers()

Without torch or transformers a test skips, as on a machine set up with `.[test]` alone; under `CI=true` it
fails instead, so CI never turns green with the transformers comparisons silently left out.
"""
from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def import_transformers():
    """-> (torch, transformers); skip (fail under CI=true) when either cannot be imported."""
    try:
        import torch
        import transformers
    except ImportError as e:
        why = f"the transformers oracle cannot be imported ({e}): install the hf extra (pip install -e '.[hf]')"
        if in_ci():
            pytest.fail(f"CI=true: {why}", pytrace=False)
        pytest.skip(why)
    return torch, transformers
