"""A sequence's state in one file, so a long prefill is paid once: `save_state` / `load_state`.

    save_state("s.safetensors", model, state, logits=last, tokens=ids)    # after any forward
    state = load_state("s.safetensors", Model("m.gguf"))                 # a fresh Model of the same file
    model.forward(next_tokens, state)                                    # == the uninterrupted run, bit for bit

The file is safetensors: every array of the state is a tensor (dtype and bytes kept; a `Rows` buffer stores its
used rows only), and the manifest is JSON in the header's metadata under the key `refengine.state`:

    format, version      "refengine.state", 1 (a newer version is refused)
    arch, model          general.architecture; the model file's name, size and sha256 (over every shard in order)
    n_past, n_ctx        positions the state holds; the context size it was made with (rope factors depend on it)
    logits, tokens       names of the optional extras: the last position's logits [V] (the next token comes from
                         them, so a run continues with no new input) and every token id fed [n_past]
    sha256               per tensor, the sha256 of its bytes: a corrupt file is refused, naming the tensor
    tree                 the ModelState, walked structurally: one NODE per attribute (below)

    NODE       what the attribute holds
    null       None
    {"bool": true} {"int": 3} {"str": "absorbed"} {"float": "0x1.8p+1"}    (float.hex: every bit)
    {"array": NAME}, {"scalar": NAME}    a numpy array / numpy scalar: tensor NAME (0-d for a scalar)
    {"dtype": "float32"}                 a numpy dtype
    {"rows": NAME | null, "dtype": D}    a `Rows` buffer: its used rows [n, ...] (null: nothing appended yet); a
                                         registered Rows subclass adds "class": its name (no attributes of its own)
    {"list": [NODE]} {"tuple": [NODE]} {"dict": {KEY: NODE}}   (str keys)
    {"container": CLASS, "fields": {ATTRIBUTE: NODE}}          a container registered in `cache.CONTAINERS`

A tensor is named by its attribute path: `state.layers.3.kv.kv`. A container is restored as its class by name
(`cache.CONTAINERS`, filled by `@state_container`) without running `__init__`: `cls.__new__(cls)`, then every
saved instance attribute set (then the class's `_restored(obj)`, where it has one: an older layout of its fields
brought to its own, `cache.LatentKV`). What a container must satisfy to be saved (README, Adding an architecture): it is
registered; its state is in its instance attributes (`vars()`; no `__slots__`; class attributes are constants
and not saved); each attribute is one of the NODE kinds, arrays of a dtype safetensors holds (bool, int8..64,
uint8..64, float16/32/64, complex64); no container, Rows or array is reached twice (the state is a tree: a
shared object would come back as two copies). Anything else is refused at save time with a StateFileError
naming the attribute, so a container that does not fit fails in tests/test_state_file.py.

A resident run (`Runtime(backend="cuda")`, refengine.devarray) keeps the state's arrays on the device, in the
state's own containers: saving reads each one back (`to_host`), the same numbers; the state passed in is not
changed. A loaded state holds host arrays and runs on any backend (resident, a cache moves to the device at its
first append: `cache.Rows`; tests/test_resident.py).

Errors: `StateFileError` (unreadable, truncated, corrupt, another format version, an attribute the format cannot
hold) and its subclass `StateMismatchError` (a state saved for another model: names both files and what differs).
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass

import numpy as np

from .cache import CONTAINERS, ModelState, Rows
from .errors import StateFileError, StateMismatchError
from .devarray import DeviceArray, to_host

FORMAT = "refengine.state"
VERSION = 1
META_KEY = "refengine.state"
ROOT = "state"                                           # tensor names: state.<attribute path>
DTYPES = frozenset(np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                         np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64))
HOLDS = ("None, bool, int, float, str, numpy arrays / scalars / dtypes of a dtype safetensors holds, Rows, "
         "lists, tuples, str-keyed dicts and containers registered with @state_container (refengine/cache.py)")
DISK_CACHE_MIN = 1 << 28                                  # model files from 256 MiB on: sha256 cached on disk


@dataclass
class SavedState:
    """What a state file gives back: the state, the last position's logits [V] and the token ids fed [n_past]
    (each None where the file has none), and the manifest."""
    state: ModelState
    logits: np.ndarray | None
    tokens: np.ndarray | None
    manifest: dict


# ---------------------------------------------------------------- the model file's identity

_SHA256: dict[tuple, str] = {}                            # (path, size, mtime_ns) per shard -> sha256, this process


def _cache_file() -> str:
    root = os.environ.get("REFENGINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "refengine")
    return os.path.join(root, "sha256.json")


def model_sha256(paths: list[str], progress: bool = False) -> str:
    """sha256 over every shard in order (`golden.write.sha256_file`: streamed, a tqdm bar from 256 MiB), cached
    per (path, size, mtime) of each shard: in this process, and on disk for big files (REFENGINE_CACHE_DIR, default
    ~/.cache/refengine/sha256.json), so a state of a 150 GB model is not paid for with a full read each time."""
    from .golden.write import sha256_file
    key = tuple((os.path.realpath(p), st.st_size, st.st_mtime_ns) for p in paths for st in [os.stat(p)])
    if key in _SHA256:
        return _SHA256[key]
    big = sum(k[1] for k in key) >= DISK_CACHE_MIN
    skey, disk = json.dumps(key), {}
    if big:
        try:
            with open(_cache_file(), encoding="utf-8") as f:
                disk = json.load(f)
        except (OSError, ValueError):
            disk = {}
    digest = disk.get(skey) if isinstance(disk, dict) else None
    if not isinstance(digest, str):
        digest = sha256_file(list(paths), progress)
        if big:
            try:
                os.makedirs(os.path.dirname(_cache_file()), exist_ok=True)
                tmp = f"{_cache_file()}.{os.getpid()}"
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({**(disk if isinstance(disk, dict) else {}), skey: digest}, f)
                os.replace(tmp, _cache_file())
            except OSError:
                pass                                      # an unwritable cache only costs the next read
    _SHA256[key] = digest
    return digest


def model_identity(model, progress: bool = False) -> dict:
    """{"file": name, "size": bytes, "sha256": hex} of the model's file (every shard)."""
    paths = [s.path for s in model.gf.shards]
    return {"file": os.path.basename(model.path), "size": sum(os.path.getsize(p) for p in paths),
            "sha256": model_sha256(paths, progress)}


# ---------------------------------------------------------------- save

def _digest(a: np.ndarray) -> str:
    """sha256 of an array's bytes (C order)."""
    return hashlib.sha256(a.copy(order="C").reshape(-1).view(np.uint8) if not a.flags.c_contiguous
                          else a.reshape(-1).view(np.uint8)).hexdigest()


class _Encoder:
    """The tree walk: attribute -> NODE, arrays collected as tensors under their attribute path."""

    def __init__(self):
        self.tensors: dict[str, np.ndarray] = {}
        self.seen: dict[int, str] = {}                    # id of a mutable object -> where it was first met

    def tensor(self, a: np.ndarray, where: str) -> str:
        a = to_host(a)                                    # a resident run's arrays are read back from the device
        if a.dtype not in DTYPES:
            raise StateFileError(f"cannot save {where}: an array of dtype {a.dtype}, which a state file cannot hold "
                                 f"(safetensors: {', '.join(sorted(d.name for d in DTYPES))})")
        if where in self.tensors:
            raise StateFileError(f"cannot save {where}: two attributes give the same tensor name")
        self.tensors[where] = a if a.flags.c_contiguous else a.copy(order="C")     # (0-d arrays stay 0-d)
        return where

    def once(self, v, where: str) -> None:
        first = self.seen.setdefault(id(v), where)
        if first != where:
            raise StateFileError(f"cannot save {where}: it is the same {type(v).__name__} object as {first}; a state "
                                 f"file holds a tree, and a shared object would be restored as two copies")

    def node(self, v, where: str):
        t = type(v)
        if v is None:
            return None
        if t is bool:
            return {"bool": v}
        if t is int:
            return {"int": v}
        if t is float:
            return {"float": v.hex()}
        if t is str:
            return {"str": v}
        if isinstance(v, np.dtype):
            if v not in DTYPES:
                raise StateFileError(f"cannot save {where}: dtype {v}, which a state file cannot hold")
            return {"dtype": v.name}
        if isinstance(v, np.generic):
            return {"scalar": self.tensor(np.asarray(v), where)}
        if t is not tuple:                                # (immutable: a shared tuple is harmless, e.g. `()`)
            self.once(v, where)
        if t is np.ndarray or t is DeviceArray:
            return {"array": self.tensor(v, where)}
        if isinstance(v, Rows):                           # Rows, or a registered subclass adding no attribute
            extra = sorted(set(vars(v)) - set(vars(Rows())))
            if t is not Rows and (CONTAINERS.get(t.__name__) is not t or extra):
                raise StateFileError(f"cannot save {where}: a {t.__qualname__}, a Rows subclass " + (
                    f"with attributes of its own ({', '.join(extra)})" if extra else "not registered with "
                    "@state_container (refengine/cache.py)"))
            rows = v.view()
            node = {"rows": None if rows is None else self.tensor(rows, where), "dtype": v.dtype.name}
            return node if t is Rows else {**node, "class": t.__name__}
        if t in (list, tuple):
            return {t.__name__: [self.node(x, f"{where}.{i}") for i, x in enumerate(v)]}
        if t is dict:
            bad = [k for k in v if type(k) is not str]
            if bad:
                raise StateFileError(f"cannot save {where}: a dict with the key {bad[0]!r}; a state file holds "
                                     f"str keys only")
            return {"dict": {k: self.node(x, f"{where}.{k}") for k, x in v.items()}}
        if t is ModelState or CONTAINERS.get(t.__name__) is t:
            return {"container": t.__name__, "fields": {k: self.node(x, f"{where}.{k}")
                                                        for k, x in self.fields(v, where).items()}}
        raise StateFileError(f"cannot save {where}: a {t.__module__}.{t.__qualname__}, which a state file cannot "
                             f"hold; it holds {HOLDS}")

    @staticmethod
    def fields(v, where: str) -> dict:
        try:
            f = dict(vars(v))
        except TypeError:
            raise StateFileError(f"cannot save {where}: {type(v).__name__} keeps no instance __dict__ (__slots__?); "
                                 f"a state file saves a container's instance attributes") from None
        if isinstance(v, ModelState):
            f.pop("home", None)                           # a run's Device: not data (Model.run_step)
        return f


def save_state(path: str | os.PathLike, model, state: ModelState, *, logits=None, tokens=None,
               progress: bool = False) -> dict:
    """Write `state` (of `model`) to `path` (replaced atomically); returns the manifest.

    logits: the last position's logits ([V] or [T, V], the last row kept), so a loaded run continues with no
    new input; tokens: every token id fed so far ([n_past]). Arrays on a device are read back.
    """
    from . import __version__
    path = os.fspath(path)
    enc = _Encoder()
    tree = enc.node(state, ROOT)
    extras = {}
    if logits is not None:
        lg = np.asarray(logits)
        extras["logits"] = enc.tensor(lg.reshape(-1, lg.shape[-1])[-1], "logits")
    if tokens is not None:
        tk = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tk.size != state.n_past:
            raise StateFileError(f"cannot save {path}: {tk.size} token ids given for a state of "
                                 f"n_past = {state.n_past}")
        extras["tokens"] = enc.tensor(tk, "tokens")
    manifest = {"format": FORMAT, "version": VERSION, "arch": model.cfg.arch, "model": model_identity(model, progress),
                "n_past": int(state.n_past), "n_ctx": int(model.n_ctx), "refengine": __version__,
                "logits": extras.get("logits"), "tokens": extras.get("tokens"),
                "sha256": {k: _digest(a) for k, a in enc.tensors.items()},
                "tree": tree}
    from safetensors.numpy import save_file
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        save_file(enc.tensors, tmp, metadata={META_KEY: json.dumps(manifest)})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return manifest


# ---------------------------------------------------------------- load

class _Decoder:
    """NODE -> attribute, every tensor checked against the manifest's sha256."""

    def __init__(self, path: str, f, hashes: dict):
        from safetensors import SafetensorError
        self.path, self.f, self.hashes, self.names = path, f, hashes, set(f.keys())
        self.error = SafetensorError

    def bad(self, where: str, what: str) -> StateFileError:
        return StateFileError(f"{self.path}: corrupt state file: {where}: {what}")

    def tensor(self, name, where: str) -> np.ndarray:
        if not isinstance(name, str) or name not in self.names:
            raise self.bad(where, f"the tensor {name!r} the manifest names is not in the file")
        try:
            a = np.array(self.f.get_tensor(name))        # a writable copy: the state goes on growing
        except (self.error, OSError, ValueError, TypeError, KeyError) as e:  # bytes out of range, a dtype numpy lacks
            raise self.bad(where, f"tensor {name!r} unreadable: {e}") from None
        if _digest(a) != self.hashes.get(name):
            raise self.bad(where, f"the bytes of tensor {name!r} do not match their sha256 in the manifest")
        return a

    def node(self, n, where: str):
        if n is None:
            return None
        if not isinstance(n, dict) or not n:
            raise self.bad(where, f"a node must be null or an object, not {str(n)[:60]}")
        kind, val = next(iter(n.items()))
        simple = {"bool": bool, "int": int, "str": str}
        if kind in simple:
            if type(val) is not simple[kind]:
                raise self.bad(where, f"{kind} node holding {val!r}")
            return val
        if kind == "float":
            try:
                return float.fromhex(val)
            except (TypeError, ValueError):
                raise self.bad(where, f"float node holding {val!r}") from None
        if kind == "dtype":
            return self.dtype(val, where)
        if kind == "array":
            return self.tensor(val, where)
        if kind == "scalar":
            a = self.tensor(val, where)
            if a.ndim:
                raise self.bad(where, f"a scalar stored as an array of shape {a.shape}")
            return a[()]
        if kind == "rows":
            dtype = self.dtype(n.get("dtype"), where)
            rows = None if val is None else self.tensor(val, where)
            if rows is not None and (rows.dtype != dtype or rows.ndim < 1):
                raise self.bad(where, f"rows of dtype {rows.dtype}, shape {rows.shape} in a {dtype} buffer")
            cls = CONTAINERS.get(n["class"]) if "class" in n else Rows
            if not (isinstance(cls, type) and issubclass(cls, Rows)):
                raise StateFileError(f"{self.path}: {where} is a {n.get('class')!r}, a Rows class this refengine "
                                     f"does not know")
            return cls.holding(rows, dtype)
        if kind in ("list", "tuple"):
            if not isinstance(val, list):
                raise self.bad(where, f"{kind} node holding {str(val)[:60]}")
            xs = [self.node(x, f"{where}.{i}") for i, x in enumerate(val)]
            return xs if kind == "list" else tuple(xs)
        if kind == "dict":
            if not isinstance(val, dict):
                raise self.bad(where, f"dict node holding {str(val)[:60]}")
            return {k: self.node(x, f"{where}.{k}") for k, x in val.items()}
        if kind == "container":
            cls = (ModelState if val == "ModelState" else CONTAINERS.get(val)) if isinstance(val, str) else None
            if cls is None:
                raise StateFileError(f"{self.path}: {where} is a {val!r}, a state container this refengine does not "
                                     f"know (registered: {', '.join(sorted(CONTAINERS))})")
            fields = n.get("fields")
            if not isinstance(fields, dict):
                raise self.bad(where, f"container {val} without its fields")
            obj = cls.__new__(cls)
            for k, x in fields.items():
                object.__setattr__(obj, k, self.node(x, f"{where}.{k}"))
            restored = getattr(cls, "_restored", None)      # a container's older layout brought to its own
            if restored is None:
                return obj
            try:
                return restored(obj)
            except ValueError as e:
                raise self.bad(where, str(e)) from None
        raise self.bad(where, f"unknown node kind {kind!r}")

    def dtype(self, name, where: str) -> np.dtype:
        try:
            d = np.dtype(name)
        except TypeError:
            d = None
        if d not in DTYPES:
            raise self.bad(where, f"dtype {name!r}")
        return d


def _open(path: str):
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as e:                              # a base dependency (pyproject.toml)
        raise StateFileError(f"{path}: reading a state file needs the safetensors package ({e})") from None
    if not os.path.isfile(path):
        raise StateFileError(f"{path}: no such state file")
    try:
        return safe_open(path, framework="np")
    except (SafetensorError, OSError, ValueError) as e:
        raise StateFileError(f"{path}: not a readable safetensors state file (truncated or corrupt?): {e}") from None


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a state file, checked for format and version (no model needed)."""
    path = os.fspath(path)
    with _open(path) as f:
        return _manifest(path, f)


def _manifest(path: str, f) -> dict:
    meta = f.metadata() or {}
    if META_KEY not in meta:
        raise StateFileError(f"{path}: not a refengine state file (no {META_KEY!r} manifest in its metadata)")
    try:
        m = json.loads(meta[META_KEY])
    except ValueError as e:
        raise StateFileError(f"{path}: corrupt state file: its manifest is not JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        fmt = str(m.get("format") if isinstance(m, dict) else m)[:40]
        raise StateFileError(f"{path}: not a refengine state file (manifest format {fmt!r})")
    if not isinstance(m.get("version"), int) or m["version"] > VERSION:
        raise StateFileError(f"{path}: state file format version {m.get('version')!r}; this refengine reads "
                             f"version {VERSION} (written by a newer refengine?)")
    for k, kind in (("arch", str), ("model", dict), ("n_past", int), ("sha256", dict), ("tree", dict)):
        if not isinstance(m.get(k), kind):
            raise StateFileError(f"{path}: corrupt state file: manifest field {k!r} is {str(m.get(k))[:40]!r}")
    return m


def read_state(path: str | os.PathLike, model, *, progress: bool = False) -> SavedState:
    """Load a state file for `model`: refused (StateMismatchError) when it was saved for another architecture or
    another model file (sha256 over the shards), or when the model's context is shorter than the state."""
    path = os.fspath(path)
    with _open(path) as f:
        m = _manifest(path, f)
        mine = m["model"]
        if m["arch"] != model.cfg.arch:
            raise StateMismatchError(f"{path}: a state of a {m['arch']} model ({mine.get('file')}), not of "
                                     f"{model.path} ({model.cfg.arch})")
        have = model_identity(model, progress)
        for k in ("size", "sha256"):                     # the size first: no hash needed when it differs
            if mine.get(k) != have[k]:
                raise StateMismatchError(f"{path}: a state of another model file: saved for {mine.get('file')} "
                                         f"({k} {mine.get(k)}), but {model.path} has {k} {have[k]}")
        if m["n_past"] > model.n_ctx:
            raise StateMismatchError(f"{path}: holds {m['n_past']} positions, more than the context size "
                                     f"n_ctx = {model.n_ctx} of {model.path}")
        if m.get("n_ctx") != model.n_ctx:
            warnings.warn(f"{path}: saved with n_ctx = {m.get('n_ctx')}, continued with n_ctx = {model.n_ctx}: where "
                          f"the rope factors depend on the context size the continuation differs", stacklevel=2)
        dec = _Decoder(path, f, m["sha256"])
        state = dec.node(m["tree"], ROOT)
        if type(state) is not ModelState:
            raise dec.bad(ROOT, f"the root is a {type(state).__name__}, not a ModelState")
        state.home = None
        if state.n_past != m["n_past"] or not isinstance(state.layers, list) or len(state.layers) != model.cfg.n_layer:
            raise dec.bad(ROOT, f"n_past {state.n_past} (manifest {m['n_past']}), "
                          f"{len(state.layers) if isinstance(state.layers, list) else '?'} layers "
                          f"(model {model.cfg.n_layer})")
        logits = None if m.get("logits") is None else dec.tensor(m["logits"], "logits")
        tokens = None if m.get("tokens") is None else dec.tensor(m["tokens"], "tokens")
    if logits is not None and logits.shape != (model.cfg.n_vocab,):
        raise StateFileError(f"{path}: corrupt state file: logits of shape {logits.shape}, n_vocab {model.cfg.n_vocab}")
    if tokens is not None and tokens.shape != (state.n_past,):
        raise StateFileError(f"{path}: corrupt state file: {tokens.size} token ids for n_past = {state.n_past}")
    return SavedState(state=state, logits=logits, tokens=tokens, manifest=m)


def load_state(path: str | os.PathLike, model, *, progress: bool = False) -> ModelState:
    """The ModelState saved in `path`, for `model` (read_state: refused for another model)."""
    return read_state(path, model, progress=progress).state
