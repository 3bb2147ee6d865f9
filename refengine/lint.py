"""`refengine lint`: what a loader must accept for one GGUF, and whether llama.cpp itself would refuse it.

For every tensor: name, ggml type, shape (NumPy order), shard, the place it takes in the arch's tables
(`refengine.weights.W` rows: a matrix, a dense vector, a small matrix) and the types llama.cpp's CPU graph
takes there: a matrix goes through `ggml_mul_mat` / `ggml_get_rows` and takes every type; a dense vector
(norm, bias, `.scale`, `exp_probs_b`, rope factors) goes through an elementwise op that takes F32 only (an
F16 or quantized norm loads, then `binary_op` aborts at the first decode); a row may state its own list
(`W.accepts`, e.g. `ssm_conv1d`: F32). Flagged, without a refusal: a small matrix (router gate, `ssm_*`)
in a quantized type, which llama.cpp multiplies like any weight but strict loaders refuse.

llama.cpp refuses (exit 1): a missing required key or tensor, a tensor of the wrong shape
(`create_tensor`), a type its op aborts on, and tensors no table consumes ("wrong number of tensors",
`done_getting_tensors`, src/llama-model-loader.cpp:1392-1398). Also reported: the keys the config reads
(required ones marked, found by hiding each in turn), keys llama.cpp ignores for this arch, keys under
`{arch}.` that nothing reads, the shard layout, and with `scan` the NaN / inf count of every tensor.

Every check goes through the arch's own `config_from_gguf`, `load_globals` and `load_layer` (the
registry), over a view of the file that records what they read; there is no per-arch code here.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm import tqdm

import quant
from quant import QTensor

from .archs import get_arch
from .errors import ConfigError, UnsupportedArchError, WeightError

SMALL_BYTES = 1 << 20          # tensors up to this size are handed to the tables as zeros (no NaN check, no read)


@dataclass
class TensorLint:
    name: str
    type: str
    shape: list
    shard: str
    role: str                      # matrix | small matrix | vector | unconsumed | not checked
    accepts: str                   # "any" or a comma-separated type list
    ok: bool                       # llama.cpp takes this tensor as it is
    flags: list = field(default_factory=list)
    nonfinite: int | None = None   # NaN/inf values (scan only)


@dataclass
class LintReport:
    file: str
    arch: str
    refused: bool
    refusals: list = field(default_factory=list)      # why llama.cpp would refuse the file
    flags: list = field(default_factory=list)         # what strict loaders may trip on
    shards: list = field(default_factory=list)
    keys_read: list = field(default_factory=list)     # [{key, present, required}]
    keys_ignored: list = field(default_factory=list)  # math keys llama.cpp ignores for this arch
    keys_unread: list = field(default_factory=list)   # {arch}.* keys no reader reads
    tensors: list = field(default_factory=list)
    scanned: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class _Kv(dict):
    """The file's metadata, remembering which keys were looked up (`in` or `get`)."""

    def __init__(self, kv, seen, hidden=()):
        super().__init__({k: v for k, v in kv.items() if k not in hidden})
        self.seen = seen

    def __contains__(self, k):
        self.seen.add(k)
        return super().__contains__(k)


class _View:
    """What an arch's loader sees of the file: metadata (minus `hidden` keys) and tensors, recording reads.
    Small tensors come back as zeros of their type and shape, so tables resolve without decoding real data."""

    def __init__(self, gf, hidden=()):
        self._gf, self.seen, self.taken = gf, set(), []
        self.kv = _Kv(gf.kv, self.seen, hidden)

    def __getattr__(self, a):
        return getattr(self._gf, a)

    def get(self, key, default=None):
        self.seen.add(key)
        return self._gf.get(key, default) if key in self.kv else default

    def require(self, key):
        from .errors import MissingKeyError
        if key not in self.kv:
            raise MissingKeyError(f"{self._gf.path}: required metadata key {key!r} is missing")
        return self.get(key)

    def __contains__(self, name):
        return name in self._gf

    def tensor(self, name):
        ti = self._gf.tensors.get(name)
        self.taken.append(name)
        if ti is None or ti.nbytes > SMALL_BYTES:
            return self._gf.tensor(name)
        return QTensor.from_raw(name, ti.type, ti.shape, np.zeros(ti.nbytes, np.uint8))


def _config(arch, gf, hidden=()):
    return arch.config_from_gguf(_View(gf, hidden))


def _nonfinite(gf, name: str, rows_per_chunk: int = 4096) -> int:
    t = gf.tensor(name)
    flat = QTensor.from_raw(name, t.type, (int(np.prod(t.shape[:-1], dtype=np.int64)), t.shape[-1]), t.raw)
    bad = 0
    for r in range(0, flat.shape[0], rows_per_chunk):
        a = quant.dequantize_rows(flat, np.arange(r, min(r + rows_per_chunk, flat.shape[0])))
        bad += int(a.size - np.count_nonzero(np.isfinite(a)))
    return bad


def lint(path, *, scan: bool = False, progress: bool = False) -> LintReport:
    """Lint one GGUF (any shard of a split set). Raises GGUFError / UnsupportedArchError on unreadable input."""
    import warnings

    from .config import ConfigWarning, LlamaCppWouldRefuse
    from .gguf import open_gguf
    gf = open_gguf(path)
    arch_name = gf.get("general.architecture")
    arch = get_arch(arch_name, gf.path)
    rep = LintReport(file=gf.path, arch=arch_name, refused=False)
    for sh in gf.shards:
        rep.shards.append({"file": os.path.basename(sh.path), "split_no": sh.kv.get("split.no"),
                           "tensors": len(sh.tensors), "bytes": sh.size})

    rep.refusals += [f"file: {note}" for note in gf.llamacpp_refusals()]

    # ---- keys: what the config reads, which of those it cannot do without
    cfg = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", ConfigWarning)
        warnings.simplefilter("always", LlamaCppWouldRefuse)      # a key width llama.cpp refuses
        view = _View(gf)
        try:
            cfg = arch.config_from_gguf(view)
        except UnsupportedArchError:
            raise
        except (ConfigError, WeightError) as e:
            rep.refusals.append(f"metadata: {e}")
        rep.refusals += [f"metadata: {w.message}" for w in caught if issubclass(w.category, LlamaCppWouldRefuse)]
        seen = view.seen                                   # every key it looked up (up to a failure)
        keys = sorted(k for k in seen if not k.startswith("split."))
        for k in keys:
            required = False
            if k in gf.kv and cfg is not None:
                try:
                    _config(arch, gf, hidden={k})
                except (ConfigError, WeightError):          # missing, or the config is impossible without it
                    required = True
            rep.keys_read.append({"key": k, "present": k in gf.kv, "required": required})
    if cfg is not None:
        rep.keys_ignored = list(cfg.ignored_keys)
    rep.keys_unread = sorted(k for k in gf.kv if k.startswith(f"{arch_name}.") and k not in seen)

    # ---- tensors: resolve every table over the view
    rows: dict[str, object] = {}
    failed_layers: set[int] = set()
    if cfg is not None:
        v = _View(gf)
        parts = [("globals", lambda: arch.load_globals(v, cfg))]
        parts += [(il, (lambda il=il: arch.load_layer(v, cfg, il))) for il in range(cfg.n_layer)]
        for where, load in parts:
            try:
                ns = load()
                rows.update(getattr(ns, "tensor_rows", {}))
                for n in getattr(ns, "tensor_names", []):
                    rows.setdefault(n, None)
            except (WeightError, ConfigError) as e:
                rep.refusals.append(f"{'layer ' + str(where) if where != 'globals' else 'globals'}: {e}")
                if where != "globals":
                    failed_layers.add(where)
    bar = tqdm(gf.tensors.items(), desc="lint" + (" --scan" if scan else ""), unit="tensor",
               disable=not progress)
    unconsumed = []
    for name, ti in bar:
        shard = os.path.basename(ti.path)
        tl = TensorLint(name, ti.type.name, list(ti.shape), shard, "matrix", "any", True)
        layer = int(name.split(".")[1]) if name.startswith("blk.") and name.split(".")[1].isdigit() else None
        if cfg is None or layer in failed_layers:
            tl.role, tl.accepts = "not checked", "?"
        elif name not in rows:
            tl.role, tl.ok = "unconsumed", False
            tl.flags.append("no table of this arch consumes it: llama.cpp refuses the file (wrong number of tensors)")
            unconsumed.append(name)
        else:
            w = rows[name]
            acc = w.accepted_types() if w is not None else None
            tl.role = "vector" if (w is not None and w.dense) else "small matrix" if (w is not None and w.small) else "matrix"
            tl.accepts = "any" if acc is None else ",".join(acc)
            if acc is not None and ti.type.name not in acc:
                tl.ok = False
                tl.flags.append(f"{ti.type.name} where llama.cpp's op takes {tl.accepts}: it loads, then ggml aborts "
                                f"at the first decode")
                rep.refusals.append(f"tensor {name!r} is {ti.type.name}; llama.cpp's graph takes {tl.accepts} there")
            if tl.role != "matrix" and ti.type.name not in ("F32", "F16", "BF16") and tl.ok:
                tl.flags.append(f"small tensor in a quantized type ({ti.type.name}): llama.cpp takes it, "
                                f"strict loaders may refuse it")
                rep.flags.append(f"tensor {name!r} ({tl.role}) is {ti.type.name}: llama.cpp accepts it; a loader "
                                 f"that demands F32/F16 there refuses the file")
        if scan:
            bad = _nonfinite(gf, name)
            tl.nonfinite = bad
            if bad:
                tl.flags.append(f"{bad} NaN/inf value(s)")
                rep.flags.append(f"tensor {name!r} holds {bad} NaN/inf value(s)")
        rep.tensors.append(tl)
    if unconsumed:
        rep.refusals.append(f"{len(unconsumed)} tensor(s) no table consumes (llama.cpp: wrong number of tensors): "
                            + ", ".join(unconsumed[:5]) + (" ..." if len(unconsumed) > 5 else ""))
    rep.scanned = scan
    rep.refused = bool(rep.refusals)
    return rep


def format_lint(rep: LintReport, *, all_rows: bool = True) -> str:
    L = [f"file:   {rep.file}", f"arch:   {rep.arch}"]
    L.append("shards: " + "; ".join(f"{s['file']} ({s['tensors']} tensors, {s['bytes'] / 2**20:.1f} MiB)" for s in rep.shards))
    req = [k for k in rep.keys_read if k["required"]]
    L.append(f"keys:   {len(rep.keys_read)} read by the loader, {len(req)} required (all present)" if all(
        k["present"] for k in req) else "keys:   required key(s) missing")
    if rep.keys_ignored:
        L.append("        ignored by llama.cpp for this arch: " + ", ".join(rep.keys_ignored))
    if rep.keys_unread:
        L.append("        not read by the loader: " + ", ".join(rep.keys_unread))
    L.append("")
    L.append(f"{'tensor':<36} {'type':<8} {'shape':<20} {'role':<13} {'accepts':<8}" + (" nonfinite" if rep.scanned else "") + "  notes")
    for t in rep.tensors:
        if not all_rows and t.ok and not t.flags:
            continue
        nf = f" {t.nonfinite:>9}" if rep.scanned else ""
        L.append(f"{t.name:<36} {t.type:<8} {t.shape!s:<20} {t.role:<13} {t.accepts:<8}{nf}  {'; '.join(t.flags)}")
    L.append("")
    for f in rep.flags:
        L.append(f"flag: {f}")
    for r in rep.refusals:
        L.append(f"REFUSED: {r}")
    L.append("verdict: " + ("llama.cpp would refuse this file" if rep.refused else
                            "llama.cpp accepts this file" + (f" ({len(rep.flags)} flag(s) for strict loaders)" if rep.flags else "")))
    return "\n".join(L)
