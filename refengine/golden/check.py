"""`refengine check`: compare another engine's dump with a golden directory, tensor by tensor.

    res = check_golden("golden/", "their_dump.safetensors")            # same names as the golden
    res = check_golden("golden/", "hf.safetensors", source="transformers")
    res.report.ok, res.report.first_divergence

A dump is a safetensors file (or a directory holding `tensors.safetensors`, or a NumPy `.npz`) whose names
are llama.cpp's graph names, as in the golden; any subset will do, `logits` ([T, V]) included or not.
Shapes may differ as long as the element count and the flat order agree (llama.cpp's `[T, H, K]` equals a
`[T, H*K]`; a leading batch axis of 1 is fine).

`source="transformers"`: `hidden_states.N` (or one `hidden_states` array stacked over N) as saved from
`model(..., output_hidden_states=True).hidden_states`, and `logits`. transformers records the embedding
output first and then every decoder layer's output, except that the last entry is the output of the final
norm: hidden state 0 is `embd`, hidden state N+1 is `l_out-N` for N < n_layer - 1, and hidden state n_layer
is `result_norm`.

Judged with `refengine.compare` (metrics, the manifest's tolerance, expert ids as sets with near-ties, the
logits' top-1 and KL rules); the first diverging tensor is the first over tolerance in the golden's order.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..compare import LogitStat, Report, compare_traces, format_report, logit_metrics
from .formats import GoldenFormatError, read_safetensors
from .write import MANIFEST_FILE, TENSORS_FILE

SOURCES = ("refengine", "transformers")


@dataclass
class CheckResult:
    report: Report
    compared: int                                    # tensors compared (logits not counted)
    missing: list[str] = field(default_factory=list)  # golden names the dump lacks
    extra: list[str] = field(default_factory=list)    # dump names the golden lacks
    logits_compared: bool = True
    source: str = "refengine"

    def to_dict(self) -> dict:
        d = self.report.to_dict()
        d.update(compared=self.compared, missing=self.missing, extra=self.extra,
                 logits_compared=self.logits_compared, source=self.source)
        return d


def load_golden(golden_dir) -> tuple[dict, dict[str, np.ndarray]]:
    golden_dir = os.fspath(golden_dir)
    mpath = os.path.join(golden_dir, MANIFEST_FILE)
    if not os.path.isfile(mpath):
        raise GoldenFormatError(f"{golden_dir}: not a golden directory ({MANIFEST_FILE} is missing)")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except ValueError as e:
        raise GoldenFormatError(f"{mpath}: not valid JSON: {e}") from None
    if not manifest.get("files", {}).get("tensors", TENSORS_FILE):        # a corpus golden (golden/corpus.py)
        raise GoldenFormatError(f"{golden_dir}: a corpus golden holds no tensors, only its KL-divergence base: "
                                f"{manifest.get('kld_base', {}).get('check', 'llama-perplexity --kl-divergence')}")
    tensors, _ = read_safetensors(os.path.join(golden_dir, manifest.get("files", {}).get("tensors", TENSORS_FILE)))
    if "logits" not in tensors:
        raise GoldenFormatError(f"{golden_dir}: {TENSORS_FILE} holds no 'logits'")
    return manifest, tensors


def _read_any(path: str) -> dict[str, np.ndarray]:
    if os.path.isdir(path):
        cands = [os.path.join(path, TENSORS_FILE)] if os.path.isfile(os.path.join(path, TENSORS_FILE)) else \
            sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith((".safetensors", ".npz")))
        if len(cands) != 1:
            raise GoldenFormatError(f"{path}: expected {TENSORS_FILE} or exactly one .safetensors / .npz file, "
                                    f"found {len(cands)}")
        path = cands[0]
    if not os.path.isfile(path):
        raise GoldenFormatError(f"{path}: no such file")
    if path.endswith(".npz"):
        try:
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise GoldenFormatError(f"{path}: cannot read as .npz: {e}") from None
    return read_safetensors(path)[0]


def transformers_names(dump: dict[str, np.ndarray], n_layer: int) -> dict[str, np.ndarray]:
    """Rename transformers' hidden states to llama.cpp's names (see the module docstring)."""
    hs: dict[int, np.ndarray] = {}
    if "hidden_states" in dump:
        stacked = np.asarray(dump["hidden_states"])
        hs = {i: stacked[i] for i in range(stacked.shape[0])}
    for k, v in dump.items():
        m = re.fullmatch(r"hidden_states[._](\d+)", k)
        if m:
            hs[int(m[1])] = v
    if not hs:
        raise GoldenFormatError("--from transformers: the dump has no hidden_states.N (or stacked hidden_states)")
    if max(hs) > n_layer:
        raise GoldenFormatError(f"--from transformers: hidden_states.{max(hs)} but the model has {n_layer} layers "
                                f"(hidden states 0..{n_layer})")
    out = {}
    for i, v in hs.items():
        name = "embd" if i == 0 else "result_norm" if i == n_layer else f"l_out-{i - 1}"
        out[name] = v
    if "logits" in dump:
        out["logits"] = dump["logits"]
    return out


def load_dump(path, source: str = "refengine", n_layer: int | None = None) -> dict[str, np.ndarray]:
    if source not in SOURCES:
        raise GoldenFormatError(f"--from {source!r}: choose one of {', '.join(SOURCES)}")
    dump = _read_any(os.fspath(path))
    if source == "transformers":
        dump = transformers_names(dump, n_layer)
    return dump


def check_golden(golden_dir, theirs, *, source: str = "refengine", tol: float | None = None) -> CheckResult:
    """Compare a dump (path, or a dict of named arrays) with the golden; see the module docstring."""
    manifest, gold = load_golden(golden_dir)
    n_layer = int(manifest["model"]["n_layer"])
    got = theirs if isinstance(theirs, dict) else load_dump(theirs, source, n_layer)
    if source == "transformers" and isinstance(theirs, dict):
        got = transformers_names(theirs, n_layer)
    tol = float(manifest["tolerance"]["nmse"] if tol is None else tol)
    order = [n for n in manifest.get("order", list(gold)) if n != "logits"]
    common = [n for n in order if n in got]
    if not common and "logits" not in got:
        raise GoldenFormatError(f"{theirs if not isinstance(theirs, dict) else 'the dump'}: no tensor name in common "
                                f"with the golden (first golden names: {', '.join(order[:4])})")
    ref = {n: np.asarray(gold[n]) for n in order}
    stats, missing = compare_traces(ref, order, {n: np.asarray(got[n]) for n in common}, tol)
    first = next((s.name for s in stats if not s.ok), None)
    T, V = gold["logits"].shape
    if "logits" in got:
        g = np.asarray(got["logits"], dtype=np.float32)
        if g.size != T * V:
            raise GoldenFormatError(f"dump 'logits' has {g.size} values, the golden's [T, V] = [{T}, {V}]")
        lm = logit_metrics(np.asarray(gold["logits"], dtype=np.float32), g.reshape(T, V))
        logits_ok = bool(np.isfinite(lm.nmse) and lm.nmse <= tol and lm.top1_unexplained == 0)
    else:
        nan = float("nan")
        lm, logits_ok = LogitStat(nan, nan, nan, nan, nan, nan), True
    if first is None and not logits_ok:
        first = "logits"
    rep = Report(manifest["model"]["arch"], first is None and logits_ok, tol, first, lm, stats)
    extra = [n for n in got if n not in gold]
    return CheckResult(rep, len(stats), missing, extra, "logits" in got, source)


def format_check(res: CheckResult, *, all_rows: bool = True) -> str:
    text = format_report(res.report, all_rows=all_rows)
    lines = text.split("\n")
    if not res.logits_compared:
        lines = [ln for ln in lines if not ln.startswith(("logits:", "first top-1"))]
        lines.insert(-2, "logits: not in the dump (not compared)")
    lines.insert(-2, f"compared {res.compared} tensors ({res.source} dump); {len(res.missing)} golden tensors not in "
                     f"the dump" + (f"; {len(res.extra)} dump tensors not in the golden: "
                                    f"{', '.join(res.extra[:5])}{' ...' if len(res.extra) > 5 else ''}" if res.extra else ""))
    return "\n".join(lines)
