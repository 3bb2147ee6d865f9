"""llama.cpp mode on quantized weights: logits within 1e-7, or the miss explained by a named rounding flip.

    logits_or_named_flip(model, ref, trace, logits, what)

passes when the logits NMSE is within `TOLERANCE_LLAMACPP["quantized"]`; otherwise it xfails naming the first
rounding flip (refengine.flips: an activation that llama.cpp rounds to another Q8_0 / Q8_K code, or a block
scale) that sits before the first diverging tensor, and fails when there is none. `untraced`: flips found in
matmul inputs llama.cpp does not name, as (input, the named output it feeds, description); such an input counts
as sitting just before its output.
"""
from __future__ import annotations

import pytest


def logits_or_named_flip(model, ref, trace, logits, what: str, untraced=()) -> None:
    from refengine.compare import TOLERANCE_LLAMACPP, build_report, metrics
    from refengine.flips import flip_census
    tol = TOLERANCE_LLAMACPP["quantized"]
    figure = metrics(ref.logits, logits)[0]
    if figure <= tol:
        return
    got = trace.tensors
    rep = build_report(model.cfg.arch, ref.logits, logits, ref.tensors, ref.order, got, tol)
    names = [s.name for s in rep.tensors]
    first_bad = names.index(rep.first_divergence) if rep.first_divergence in names else len(names)
    census = [(names.index(f.name), f"{f.name} ({f.flips} {f.partner} code(s) of {f.values}, {f.scale_flips} "
               f"block scale(s), float noise predicts {f.expected:.2g})")
              for f in flip_census(model, ref.tensors, got, ref.order, ref.earlier, trace.earlier)
              if (f.flips or f.scale_flips) and f.name in names]
    census += [(names.index(y) - 0.5, f"{x} (unnamed in llama.cpp; {how})") for x, y, how in untraced if y in names]
    census.sort()
    if census and census[0][0] < first_bad:
        pytest.xfail(f"{what}: logits NMSE {figure:.2e} > {tol:g}: rounding flip at {census[0][1]} before the "
                     f"first divergence {rep.first_divergence}")
    pytest.fail(f"{what}: logits NMSE {figure:.2e} > {tol:g} with no rounding flip before the first divergence "
                f"{rep.first_divergence}")
