"""The one float comparison helper for tests: relative RMS error, with max-abs and cosine in the message.

    rel_rms(got, want) = sqrt(mean((got - want)^2) / mean(want^2))     (NaN/inf never passes)
"""
from __future__ import annotations

import numpy as np


def rel_rms(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(want)), "non-finite values"
    return float(np.sqrt(np.mean((got - want) ** 2) / max(np.mean(want ** 2), 1e-300)))


def assert_close(name: str, got, want, tol: float) -> None:
    r = rel_rms(got, want)
    g, w = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    cos = float(g @ w / max(np.linalg.norm(g) * np.linalg.norm(w), 1e-300))
    assert r <= tol, (f"{name}: relative RMS {r:.2e} > {tol:.0e} "
                      f"(max abs {np.max(np.abs(g - w)):.3e}, cosine {cos:.9f})")
