"""The one check of a `refengine.compare` Report against llama.cpp, for every test that compares a model.

    check_report(rep, tol=None, want=(), untraced=frozenset())

- every tensor llama.cpp names is traced by refengine (`rep.only_in_llamacpp` empty), except those whose base
  name is in `untraced` (a form that has no such product, e.g. the naive MLA form's absorbed tensors);
- every name in `want` was compared (traced_names.expected_names: llama.cpp still names them);
- `rep.ok`: each tensor within the report's tolerance, the logits too, no unexplained top-1 miss;
- with `tol`: every tensor's NMSE and the logits' within `tol`, and top-1 agreement 100%.
Each failure message carries the report's table.
"""
from __future__ import annotations


def check_report(rep, tol: float | None = None, want=(), untraced=frozenset()) -> None:
    from refengine.compare import format_report
    table = format_report(rep)
    left = [n for n in rep.only_in_llamacpp if n.rsplit("-", 1)[0] not in untraced]
    assert not left, f"llama.cpp tensors refengine does not trace: {left}\n{table}"
    missing = set(want) - {s.name for s in rep.tensors}
    assert not missing, f"not compared: {sorted(missing)}\n{table}"
    assert rep.ok, table
    if tol is not None:
        bad = [(s.name, s.nmse) for s in rep.tensors if not s.nmse <= tol]
        assert not bad, f"tensors over {tol:g}: {bad}\n{table}"
        assert rep.logits.nmse <= tol and rep.logits.top1_agreement == 1.0, table
