"""The float comparison helpers of the tests, defined once: relative RMS error, NMSE, and an assert that
names the case with max-abs and cosine in its message.

    rel_rms(got, want) = sqrt(mean((got - want)^2) / mean(want^2))
    nmse(ref, got)     = sum((got - ref)^2) / sum(ref^2)  = rel_rms(got, ref)^2      (compare.metrics' order)

One guard policy for all three:
- NaN or inf on either side never passes: an AssertionError names the side (a non-finite value cannot be
  "within" a tolerance, and a test checking that two results differ must not pass on NaN either);
- the shapes must be equal (no broadcasting of a row against a matrix); nmse alone compares the values in order
  (equal sizes), as refengine.compare.metrics does;
- a reference that is all zeros is handled explicitly: 0.0 when `got` is all zeros too, else inf (no floor
  on the denominator that would turn a tiny reference into a loose bound).
"""
from __future__ import annotations

import numpy as np


def _pair(got, want) -> tuple[np.ndarray, np.ndarray]:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), "non-finite values in the result"
    assert np.all(np.isfinite(want)), "non-finite values in the reference"
    return got, want


def rel_rms(got, want) -> float:
    got, want = _pair(got, want)
    den = float(np.mean(want ** 2)) if want.size else 0.0
    err = float(np.mean((got - want) ** 2)) if want.size else 0.0
    if den == 0.0:                                   # an all-zero reference: only an all-zero result matches it
        return 0.0 if err == 0.0 else float("inf")
    return float(np.sqrt(err / den))


def nmse(ref, got) -> float:
    """Normalized mean squared error of `got` against `ref` (reference first, as refengine.compare.metrics), over
    the values in order: the sizes must be equal, the shapes may differ (llama.cpp's [1, T, n] against [T, n])."""
    return rel_rms(np.ravel(got), np.ravel(ref)) ** 2


def assert_close(name: str, got, want, tol: float) -> None:
    """rel_rms(got, want) <= tol, else an AssertionError naming `name`, the figure, max abs and cosine."""
    r = rel_rms(got, want)
    g, w = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    den = np.linalg.norm(g) * np.linalg.norm(w)
    cos = float(g @ w / den) if den > 0 else float(np.array_equal(g, w))
    assert r <= tol, (f"{name}: relative RMS {r:.2e} > {tol:.0e} "
                      f"(max abs {np.max(np.abs(g - w)) if g.size else 0.0:.3e}, cosine {cos:.9f})")
